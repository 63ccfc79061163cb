// woq chat: an interactive conversation with the model's chat template.
#include <algorithm>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "generate/chat_template.h"
#include "generate/generate.h"
#include "tokenizer/tokenizer.h"

namespace woq::cli {

namespace {

struct ChatArgs {
  std::string model_dir;
  std::string low_bit;  ///< empty: the default (add_low_bit_flag)
  std::string system;
  std::int64_t n = -1;
  SamplingFlags sampling{0.6f, 40, 0.9f, -1, {}};  // the chat defaults of Llama model cards
  ModelFlags model;
};

int run_chat(const ChatArgs& a) {
  GenerateOptions gen;
  gen.sampling = a.sampling.params();
  gen.penalties = a.sampling.penalties;
  gen.echo_prompt = false;
  const ModelSession session = open_session(a.model_dir, a.model, a.low_bit);
  const Tokenizer& tokenizer = *session.tokenizer;
  const ChatTemplate& chat = *session.chat_template;
  LlamaModel* const model = session.model.get();
  const bool tty = isatty(STDIN_FILENO) != 0;
  fmt::print(stderr, "woq: chat with {} ({}); type a message and Enter, /clear to forget the conversation, /exit or "
             "Ctrl-D to quit\n", a.model_dir, chat.is_default() ? "no chat template in the model: ChatML" : "the model's chat template");
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  if (!a.system.empty()) messages.push_back({{"role", "system"}, {"content", a.system}});
  const std::size_t kept = messages.size();
  int turn = 0;  // replies so far (/clear, empty lines and refused messages are not turns)
  ConversationCache conversation;  // the history's KV cache: a turn prefills only what the last one did not hold
  gen.conversation = &conversation;
  for (;;) {
    if (tty) fmt::print("> ");
    std::fflush(stdout);
    std::string line;
    if (!std::getline(std::cin, line)) {
      if (tty) fmt::print("\n");  // Ctrl-D: leave the prompt's line
      break;
    }
    if (line == "/exit") break;
    if (line == "/clear") {
      messages.erase(messages.begin() + static_cast<std::ptrdiff_t>(kept), messages.end());
      fmt::print(stderr, "woq: conversation cleared\n");
      continue;
    }
    if (line.empty()) continue;
    messages.push_back({{"role", "user"}, {"content", line}});
    // Each turn renders the whole history with the template; the KV cache already holds its start.
    std::vector<std::int32_t> ids;
    try {
      ids = tokenizer.encode_with_special(chat.render(messages, true));
    } catch (const std::exception& e) {  // e.g. the template's raise_exception: this message is dropped, the chat goes on
      messages.erase(messages.end() - 1);
      fmt::print(stderr, "woq: error: the chat template: {}\n", e.what());
      continue;
    }
    const auto room = model->context_limit() - static_cast<std::int64_t>(ids.size());
    if (room <= 0) {
      messages.erase(messages.end() - 1);
      fmt::print(stderr, "woq: the conversation ({} tokens) fills the model's context of {} tokens: /clear to start "
                 "again\n", ids.size(), model->context_limit());
      continue;
    }
    gen.max_new_tokens = a.n > 0 ? std::min<std::int64_t>(a.n, room) : room;
    const GenerateResult r = generate(*model, tokenizer, ids, gen, [](std::string_view text) {
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    });
    fmt::print("\n");
    messages.push_back({{"role", "assistant"}, {"content", r.text}});
    const std::size_t prompt_messages = messages.size() - 1;
    // The reply ran into the end of the context (not ended by -n below it or by the end-of-turn token).
    const bool full = r.context_full || (!r.stopped && static_cast<std::int64_t>(r.generated_ids.size()) >= room);
    fmt::print(stderr, "woq: turn {}: prompt {} tokens ({} message{}; {} tokens cached), reply {} tokens{}\n", ++turn,
               ids.size(), prompt_messages, prompt_messages == 1 ? "" : "s", r.cached_tokens, r.generated_ids.size(),
               full ? " (the context is full: the reply was cut; /clear to start again)" : "");
  }
  return 0;
}

}  // namespace

Run add_chat(CLI::App& app) {
  auto a = std::make_shared<ChatArgs>();
  CLI::App* cmd = app.add_subcommand("chat", "Chat with the model interactively, with its chat template");
  add_model_and_low_bit(cmd, a->model_dir, a->low_bit);
  cmd->add_option("--system", a->system, "System message at the start of the conversation");
  cmd->add_option("-n,--n-predict", a->n, "Most tokens per reply; default: until the end-of-turn token or the context")
      ->check(kPositive);
  add_sampling_flags(cmd, a->sampling);
  add_model_flags(cmd, a->model);
  return [a] { return run_chat(*a); };
}

}  // namespace woq::cli
