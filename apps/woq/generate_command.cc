// woq generate: load, quantize in memory, generate.
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "commands.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/thread_pool.h"
#include "formats/low_bit.h"
#include "generate/generate.h"
#include "io/json_file.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq::cli {

namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::int64_t n = 128;
  SamplingFlags sampling;
  std::string low_bit;  ///< empty: the default (add_low_bit_flag)
  std::string prompt_file;
  std::vector<std::string> stop;
  ModelFlags model;
};

std::string stop_reason(const GenerateResult& r, const Tokenizer& tok, std::int64_t context) {
  if (!r.stop_string.empty()) return fmt::format("stopped at stop string '{}'", r.stop_string);
  if (r.stopped) {
    const std::string kind = r.stop_token == tok.eos_id() ? "EOS" : r.stop_token == tok.bos_id() ? "BOS" : "end-of-generation";
    return fmt::format("stopped at the {} token {} '{}'", kind, r.stop_token, tok.token_text(r.stop_token));
  }
  if (r.context_full) return fmt::format("stopped at the model's context of {} tokens, before -n", context);
  return "reached -n";
}

// Rank 0's sampling seed on every rank: each rank samples the next token from the same logits, so they must
// draw alike (a seed of -1 is random per process).
std::uint64_t agreed_seed(Ranks& ranks, std::uint64_t seed) {
  ranks.broadcast(0, std::as_writable_bytes(std::span(&seed, 1)));
  return seed;
}

int run_generate(const GenerateArgs& a) {
  // Everything that can be checked before the slow load is checked first.
  GenerateOptions gen;
  gen.max_new_tokens = a.n;
  gen.stop_strings = a.stop;
  gen.penalties = a.sampling.penalties;
  gen.sampling = a.sampling.params();
  LoadOptions options = load_options(a.model, a.low_bit);
  Ranks& ranks = job();
  if (ranks.size() > 1) gen.sampling.seed = agreed_seed(ranks, gen.sampling.seed);
  ModelSession session;
  session.open(a.model_dir, a.model.threads);
  const ModelConfig& config = session.config;
  const Tokenizer& tokenizer = *session.tokenizer;
  // A prompt longer than the context's tokens times the longest piece cannot fit: refused before it is
  // read whole or tokenized (tokenizing takes far more memory than the text).
  const auto most_bytes =
      static_cast<std::uintmax_t>(config.context_limit()) * static_cast<std::uintmax_t>(tokenizer.max_piece_bytes());
  const std::string prompt = a.prompt_file.empty() ? a.prompt : read_text_file(a.prompt_file, most_bytes);
  if (prompt.size() > most_bytes)
    fail("the prompt ({} bytes) cannot fit in the model's context of {} tokens", prompt.size(), config.context_limit());
  if (ranks.size() > 1) require_same_inputs(ranks, "prompt", Fnv1a64{}.add(prompt).hex());
  pipeline_share(ranks, config, a.model_dir, a.model, options);  // rank r runs the r-th share of the blocks
  load_session(session, options);
  if (ranks.size() > 1) session.model->set_pipeline(ranks);
  const bool out = ranks.leader();
  const GenerateResult r = generate(*session.model, tokenizer, prompt, gen, [out](std::string_view text) {
    if (!out) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  const std::string pipeline = pipeline_memory(ranks, config);  // each rank's blocks' weights and KV cache
  if (!out) return 0;
  std::fputc('\n', stdout);
  std::fflush(stdout);

  const auto prompt_n = static_cast<double>(r.prompt_ids.size());
  const auto gen_n = static_cast<double>(r.generated_ids.size());
  // The first generated token comes from the prefill pass; the decode passes produce the rest.
  const double decode_steps = r.stop_token >= 0 ? gen_n : gen_n - 1;
  std::string speed;
  if (r.prefill_seconds > 0)
    speed = fmt::format("; prefill {:.1f} tok/s ({:.1f} ms)", prompt_n / r.prefill_seconds, r.prefill_seconds * 1e3);
  if (r.decode_seconds > 0 && decode_steps > 0) speed += fmt::format(", decode {:.1f} tok/s", decode_steps / r.decode_seconds);
  fmt::print(stderr, "woq: prompt {} tokens, generated {} tokens ({}){}; {} thread{}, {} kernels, {}\n",
             r.prompt_ids.size(), r.generated_ids.size(), stop_reason(r, tokenizer, session.model->context_limit()), speed,
             session.pool->size(), session.pool->size() > 1 ? "s" : "", isa_name(active_isa()),
             a.sampling.temperature > 0 ? fmt::format("seed {}", gen.sampling.seed) : std::string("greedy"));
  fmt::print(stderr, "{}", pipeline);
  return 0;
}

}  // namespace

Run add_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  add_model_and_low_bit(cmd, args->model_dir, args->low_bit);
  CLI::Option* prompt = cmd->add_option("-p,--prompt", args->prompt, "Prompt text");
  CLI::Option* file = cmd->add_option("-f,--file", args->prompt_file, "Read the prompt from this file (instead of -p)");
  prompt->excludes(file);
  file->excludes(prompt);
  cmd->callback([prompt, file] {
    if (prompt->count() == 0 && file->count() == 0) throw CLI::RequiredError("-p,--prompt or -f,--file");
  });
  cmd->add_option("-n,--n-predict", args->n, "Number of tokens to generate (not counting the prompt)")
      ->capture_default_str()
      ->check(kNonNegative);
  add_sampling_flags(cmd, args->sampling);
  cmd->add_option("--stop", args->stop, "Stop when the generated text contains this string (repeatable; not printed)")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must not be empty") : std::string(); },
                             "STRING"));
  add_model_flags(cmd, args->model);
  return [args] { return run_generate(*args); };
}

}  // namespace woq::cli
