#include "server/openai_api.h"

#include <cmath>
#include <optional>
#include <random>

#include <fmt/format.h>

namespace woq::server {

// Text may hold invalid UTF-8 (a token can be half a character): the HTTP layer
// dumps every body with error_handler_t::replace, which writes U+FFFD for it.

namespace {

using Json = nlohmann::ordered_json;
using namespace fields;



Json usage_of(const Generated& g) {
  return {{"prompt_tokens", g.prompt_tokens},
          {"completion_tokens", g.completion_tokens},
          {"total_tokens", g.prompt_tokens + g.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", g.cached_tokens}}}};
}

Json token_bytes(const std::string& s) {
  Json bytes = Json::array();
  for (const char c : s) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

// Chat's logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}.
Json chat_logprobs(const std::vector<TokenEvent>& tokens, const Tokenizer& tok) {
  Json content = Json::array();
  for (const TokenEvent& ev : tokens) {
    const std::string t = tok.token_text(ev.token.id);
    Json top = Json::array();
    for (const auto& alt : ev.top) {
      const std::string a = tok.token_text(alt.id);
      top.push_back({{"token", a}, {"logprob", alt.logprob}, {"bytes", token_bytes(a)}});
    }
    content.push_back({{"token", t}, {"logprob", ev.token.logprob}, {"bytes", token_bytes(t)}, {"top_logprobs", top}});
  }
  return {{"content", content}};
}

// Completions' (legacy) logprobs: parallel lists; `out` holds the echoed prompt's entries, if any.
Json completion_logprobs(const std::vector<TokenEvent>& tokens, const Tokenizer& tok, bool with_top, std::int64_t offset,
                         Json out = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}, {"text_offset", Json::array()}}) {
  for (const TokenEvent& ev : tokens) {
    const std::string t = tok.token_text(ev.token.id);
    out["tokens"].push_back(t);
    out["token_logprobs"].push_back(ev.token.logprob);
    Json top = Json::object();
    for (const auto& alt : ev.top) top[tok.token_text(alt.id)] = alt.logprob;
    out["top_logprobs"].push_back(with_top ? top : Json(nullptr));
    out["text_offset"].push_back(offset);
    offset += static_cast<std::int64_t>(ev.text.size());
  }
  return out;
}

// echo's prompt entries of completions' logprobs: the first token has no log-probability (null), as OpenAI's.
Json echoed_prompt_logprobs(const Generated& g, const Tokenizer& tok, bool with_top) {
  Json out = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
  // text_offset: where each token's text starts in the echoed prompt, i.e. the length of the text the tokens
  // before it decode to (BOS decodes to nothing; the first word's leading space is the decoder's to drop).
  TextStream text(tok);
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < g.prompt_ids.size(); ++i) {
    const std::string t = tok.token_text(g.prompt_ids[i]);
    out["tokens"].push_back(t);
    const TokenEvent* ev = i > 0 && i - 1 < g.prompt_logprobs.size() ? &g.prompt_logprobs[i - 1] : nullptr;
    out["token_logprobs"].push_back(ev != nullptr ? Json(ev->token.logprob) : Json(nullptr));
    Json top = Json::object();
    if (ev != nullptr)
      for (const auto& alt : ev->top) top[tok.token_text(alt.id)] = alt.logprob;
    out["top_logprobs"].push_back(ev != nullptr && with_top ? top : Json(nullptr));
    out["text_offset"].push_back(std::min<std::int64_t>(offset, static_cast<std::int64_t>(g.prompt_text.size())));
    offset += static_cast<std::int64_t>(text.push(g.prompt_ids[i]).size());
  }
  return out;
}

// Token ids of `list` (a JSON array), named `param`[i] in errors.
std::vector<std::int32_t> token_ids(const Json& list, const std::string& param) {
  if (list.empty()) bad(param, fmt::format("'{}' is an empty list of token ids", param));
  std::vector<std::int32_t> ids;
  ids.reserve(list.size());
  for (std::size_t i = 0; i < list.size(); ++i) {
    const Json& t = list[i];
    const std::string at = fmt::format("{}[{}]", param, i);
    if (!t.is_number_integer()) bad(at, fmt::format("'{}' must be an integer token id, not {}", at, t.type_name()));
    if (t.is_number_unsigned() ? t.get<std::uint64_t>() > INT32_MAX : (t.get<std::int64_t>() < 0 || t.get<std::int64_t>() > INT32_MAX))
      bad(at, fmt::format("'{}' is {}, not a token id", at, t.dump()));
    ids.push_back(static_cast<std::int32_t>(t.get<std::int64_t>()));
  }
  return ids;
}

// completions' "prompt": a string, a list of token ids, or a batch of either (["a", "b"], [[ids], [ids]]).
void parse_prompt(const Json& j, ApiRequest& r) {
  const Json* prompt = field(j, "prompt");
  if (prompt == nullptr) bad("prompt", "'prompt' is required");
  if (prompt->is_string()) {
    r.prompts.push_back({prompt->get<std::string>(), std::nullopt, "prompt"});
    return;
  }
  const char* shapes = "'prompt' must be a string, a list of token ids, or a list of strings or of token-id lists";
  if (!prompt->is_array() || prompt->empty()) bad("prompt", shapes);
  if ((*prompt)[0].is_number()) {
    r.prompts.push_back({{}, token_ids(*prompt, "prompt"), "prompt"});
    return;
  }
  if (prompt->size() > kMaxBatchPrompts)
    bad("prompt", fmt::format("'prompt' holds a batch of {} prompts; woq serve takes at most {} per request",
                              prompt->size(), kMaxBatchPrompts));
  for (std::size_t i = 0; i < prompt->size(); ++i) {
    const Json& p = (*prompt)[i];
    const std::string at = fmt::format("prompt[{}]", i);
    if (p.is_string()) {
      r.prompts.push_back({p.get<std::string>(), std::nullopt, at});
    } else if (p.is_array()) {
      r.prompts.push_back({{}, token_ids(p, at), at});
    } else {
      bad(at, fmt::format("'{}' must be a string or a list of token ids, not {}", at, p.type_name()));
    }
  }
}

}  // namespace

ApiRequest parse_request(const std::string& body, bool chat, const std::string& served_model) {
  const Json j = parse_object(body);
  ApiRequest r;
  r.chat = chat;
  r.model = check_model(j, served_model);
  if (chat) {
    r.messages = parse_messages(j);
    r.template_kwargs = parse_template_kwargs(j);
  } else {
    parse_prompt(j, r);
    r.echo = boolean(j, "echo").value_or(false);
  }
  const auto max_tokens = integer(j, "max_tokens", 0, 1 << 30);
  const auto max_completion = integer(j, "max_completion_tokens", 0, 1 << 30);
  r.max_tokens = max_completion ? *max_completion : max_tokens ? *max_tokens : chat ? -1 : 16;
  r.sampling.temperature = static_cast<float>(number(j, "temperature", 0, 2).value_or(1.0));
  r.sampling.top_p = static_cast<float>(number(j, "top_p", 0, 1).value_or(1.0));
  if (r.sampling.top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  r.sampling.top_k = static_cast<std::int32_t>(integer(j, "top_k", 0, 1 << 30).value_or(0));
  if (const auto seed = integer(j, "seed", INT64_MIN, INT64_MAX)) r.sampling.seed = static_cast<std::uint64_t>(*seed);
  else r.sampling.seed = std::random_device{}();
  r.presence_penalty = static_cast<float>(number(j, "presence_penalty", -2, 2).value_or(0));
  r.frequency_penalty = static_cast<float>(number(j, "frequency_penalty", -2, 2).value_or(0));
  // The CLI's --repeat-penalty / --repeat-last-n, by llama-server's names, or vLLM's repetition_penalty (every
  // token of the prompt and the completion): a logit > 0 is divided by it, else multiplied.
  const auto repeat = number(j, "repeat_penalty", 0.001, 1000);
  const auto repetition = number(j, "repetition_penalty", 0.001, 1000);
  const bool both = repeat && repetition && *repeat != 1.0 && *repetition != 1.0;
  if (both) bad("repetition_penalty", "give 'repeat_penalty' (with 'repeat_last_n') or 'repetition_penalty', not both");
  const bool vllm = repetition && *repetition != 1.0;  // a neutral 1.0 beside repeat_penalty changes nothing
  const auto last_n = integer(j, "repeat_last_n", -1, 1 << 30);
  if (last_n && vllm) bad("repeat_last_n", "'repeat_last_n' goes with 'repeat_penalty'; 'repetition_penalty' covers every token");
  r.penalties.repeat = static_cast<float>(vllm ? *repetition : repeat.value_or(1.0));
  r.penalties.last_n = vllm ? -1 : last_n.value_or(64);
  if (const auto n = integer(j, "n", INT64_MIN, INT64_MAX); n && *n != 1) bad("n", "only n = 1 is supported");
  if (const Json* stop = field(j, "stop")) {
    if (stop->is_string()) {
      r.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array() && stop->size() <= 16) {
      for (const auto& s : *stop) {
        if (!s.is_string()) bad("stop", "'stop' must be a string or a list of strings");
        r.stop.push_back(s.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of at most 16 strings");
    }
  }
  r.stream = boolean(j, "stream").value_or(false);
  if (const Json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    try {
      r.include_usage = boolean(*so, "include_usage").value_or(false);
    } catch (const ApiError& e) {
      bad("stream_options.include_usage", e.what());
    }
  }
  if (chat) {
    r.logprobs = boolean(j, "logprobs").value_or(false);
    r.top_logprobs = static_cast<int>(integer(j, "top_logprobs", 0, 20).value_or(0));
    if (r.top_logprobs > 0 && !r.logprobs) bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  } else if (const auto lp = integer(j, "logprobs", 0, 5)) {
    r.logprobs = true;
    r.top_logprobs = static_cast<int>(*lp);
  }
  if (const Json* user = field(j, "user"); user != nullptr && !user->is_string()) bad("user", "'user' must be a string");
  // Known fields woq does not implement: refused when they would change the answer, never ignored.
  const auto unsupported = [&](const char* key, bool differs) {
    if (field(j, key) != nullptr && differs) bad(key, fmt::format("'{}' is not supported by woq serve", key));
  };
  const auto is = [&](const char* key, const Json& v) { return field(j, key) != nullptr && *field(j, key) == v; };
  if (r.echo && r.stream) bad("echo", "'echo' with 'stream' is not supported by woq serve");
  if (r.prompts.size() > 1 && r.stream)
    bad("stream", "'stream' with a batch of prompts is not supported by woq serve (send one request per prompt)");
  if (chat) unsupported("echo", !is("echo", false));
  unsupported("suffix", !is("suffix", ""));
  unsupported("best_of", !is("best_of", 1));
  unsupported("logit_bias", !is("logit_bias", Json::object()));
  unsupported("tools", !is("tools", Json::array()));
  unsupported("functions", !is("functions", Json::array()));
  unsupported("response_format", !(field(j, "response_format") != nullptr && field(j, "response_format")->is_object() &&
                                   field(j, "response_format")->contains("type") && (*field(j, "response_format"))["type"] == "text"));
  return r;
}

nlohmann::ordered_json response_body(const ApiRequest& r, const std::string& id, std::int64_t created,
                                     const std::string& model, const std::vector<Generated>& gs,
                                     const Tokenizer& tokenizer) {
  Json choices = Json::array();
  Generated total;
  for (std::size_t i = 0; i < gs.size(); ++i) {
    const Generated& g = gs[i];
    total.prompt_tokens += g.prompt_tokens;
    total.completion_tokens += g.completion_tokens;
    total.cached_tokens += g.cached_tokens;
    if (r.chat) {
      choices.push_back({{"index", i},
                         {"message", {{"role", "assistant"}, {"content", g.text}}},
                         {"logprobs", r.logprobs ? chat_logprobs(g.tokens, tokenizer) : Json(nullptr)},
                         {"finish_reason", g.finish_reason}});
      continue;
    }
    Json logprobs = nullptr;
    if (r.logprobs && r.echo) {
      logprobs = completion_logprobs(g.tokens, tokenizer, r.top_logprobs > 0, static_cast<std::int64_t>(g.prompt_text.size()),
                                     echoed_prompt_logprobs(g, tokenizer, r.top_logprobs > 0));
    } else if (r.logprobs) {
      logprobs = completion_logprobs(g.tokens, tokenizer, r.top_logprobs > 0, 0);
    }
    choices.push_back({{"index", i},
                       {"text", r.echo ? g.prompt_text + g.text : g.text},
                       {"logprobs", logprobs},
                       {"finish_reason", g.finish_reason}});
  }
  return {{"id", id},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", choices},
          {"usage", usage_of(total)}};
}

nlohmann::ordered_json chunk_body(const ApiRequest& r, const std::string& id, std::int64_t created,
                                  const std::string& model, const std::string& text, const std::vector<TokenEvent>& tokens,
                                  const std::string& finish_reason, bool first, const Tokenizer& tokenizer) {
  const Json finish = finish_reason.empty() ? Json(nullptr) : Json(finish_reason);
  Json choice;
  if (r.chat) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || first) delta["content"] = text;
    choice = {{"index", 0},
              {"delta", delta},
              {"logprobs", r.logprobs && !tokens.empty() ? chat_logprobs(tokens, tokenizer) : Json(nullptr)},
              {"finish_reason", finish}};
  } else {
    choice = {{"index", 0},
              {"text", text},
              {"logprobs", r.logprobs && !tokens.empty() ? completion_logprobs(tokens, tokenizer, r.top_logprobs > 0, 0) : Json(nullptr)},
              {"finish_reason", finish}};
  }
  Json out = {{"id", id},
              {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", Json::array({choice})}};
  if (r.include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::ordered_json usage_chunk(const ApiRequest& r, const std::string& id, std::int64_t created,
                                   const std::string& model, const Generated& g) {
  return {{"id", id},
          {"object", r.chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", Json::array()},
          {"usage", usage_of(g)}};
}

}  // namespace woq::server
