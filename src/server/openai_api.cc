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

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, message, "invalid_request_error", param);
}

// A field that may be absent or null.
const Json* field(const Json& j, const char* key) {
  const auto it = j.find(key);
  return it == j.end() || it->is_null() ? nullptr : &*it;
}

std::optional<double> number(const Json& j, const char* key, double lo, double hi) {
  const Json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) bad(key, fmt::format("'{}' must be a number, not {}", key, v->type_name()));
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, v->dump(), lo, hi));
  return x;
}

std::optional<std::int64_t> integer(const Json& j, const char* key, std::int64_t lo, std::int64_t hi) {
  const Json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_number_integer()) bad(key, fmt::format("'{}' must be an integer, not {}", key, v->type_name()));
  if (v->is_number_unsigned() ? v->get<std::uint64_t>() > static_cast<std::uint64_t>(hi) : (v->get<std::int64_t>() < lo || v->get<std::int64_t>() > hi))
    bad(key, fmt::format("'{}' is {}; it must be in [{}, {}]", key, v->dump(), lo, hi));
  return v->get<std::int64_t>();
}

std::optional<bool> boolean(const Json& j, const char* key) {
  const Json* v = field(j, key);
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) bad(key, fmt::format("'{}' must be a boolean, not {}", key, v->type_name()));
  return v->get<bool>();
}

std::string text_of_content(const Json& content, std::size_t index) {
  const std::string param = fmt::format("messages[{}].content", index);
  if (content.is_null()) return {};
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad(param, fmt::format("'{}' must be a string or a list of text parts", param));
  std::string text;
  for (const auto& part : content) {
    if (!part.is_object() || !part.contains("type") || part["type"] != "text" || !part.contains("text") || !part["text"].is_string())
      bad(param, fmt::format("'{}' parts must be {{\"type\": \"text\", \"text\": ...}} (no images or audio)", param));
    text += part["text"].get<std::string>();
  }
  return text;
}

Json usage_of(const Generated& g) {
  return {{"prompt_tokens", g.prompt_tokens},
          {"completion_tokens", g.completion_tokens},
          {"total_tokens", g.prompt_tokens + g.completion_tokens}};
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

// Completions' (legacy) logprobs: parallel lists.
Json completion_logprobs(const std::vector<TokenEvent>& tokens, const Tokenizer& tok, bool with_top, std::int64_t offset) {
  Json out = {{"tokens", Json::array()}, {"token_logprobs", Json::array()}, {"top_logprobs", Json::array()}, {"text_offset", Json::array()}};
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

}  // namespace

ApiError::ApiError(int s, std::string message, std::string t, std::string p, std::string c)
    : std::runtime_error(std::move(message)), status(s), type(std::move(t)), param(std::move(p)), code(std::move(c)) {}

nlohmann::ordered_json ApiError::body() const {
  return {{"error",
           {{"message", what()},
            {"type", type},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", code.empty() ? Json(nullptr) : Json(code)}}}};
}

namespace {

// Checks a JSON text against kMaxJsonDepth, kMaxJsonValues and kMaxJsonKeys (nlohmann's SAX interface).
struct JsonBudget : nlohmann::json_sax<Json> {
  const char* exceeded = nullptr;
  int depth = 0;
  std::size_t values = 0;
  std::vector<std::size_t> keys;  // per open object or array (arrays never count)

  bool value() {
    if (++values <= kMaxJsonValues) return true;
    exceeded = "the request body has too many JSON values (at most 262144)";
    return false;
  }
  bool open() {
    if (++depth <= kMaxJsonDepth) return value();
    exceeded = "the request body is nested deeper than 64 levels";
    return false;
  }
  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return keys.push_back(0), open(); }
  // ordered_json inserts a key by a linear search of the object's keys: 200 000 keys cost 39 s.
  bool key(string_t&) override {
    if (++keys.back() <= kMaxJsonKeys) return true;
    exceeded = "a JSON object in the request body has too many keys (at most 4096)";
    return false;
  }
  bool end_object() override { return keys.pop_back(), --depth, true; }
  bool start_array(std::size_t) override { return keys.push_back(0), open(); }
  bool end_array() override { return keys.pop_back(), --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};
static_assert(kMaxJsonValues == 262144 && kMaxJsonDepth == 64 && kMaxJsonKeys == 4096, "the messages of JsonBudget");

}  // namespace

ApiRequest parse_request(const std::string& body, bool chat, const std::string& served_model) {
  Json j;
  try {
    // Budgets first, in a SAX pass that builds nothing: nesting depth, and values counted so
    // that a body of many tiny values ("[{},{},...]") cannot cost ~40x its size.
    JsonBudget budget;
    if (!Json::sax_parse(body, &budget) && budget.exceeded) bad("", budget.exceeded);
    j = Json::parse(body);
  } catch (const nlohmann::json::exception& e) {
    const std::string what = e.what();  // without nlohmann's "[json.exception.parse_error.101] " prefix
    bad("", fmt::format("the request body is not valid JSON: {}", what.substr(what.find("] ") == std::string::npos ? 0 : what.find("] ") + 2)));
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object");
  ApiRequest r;
  r.chat = chat;
  if (const Json* m = field(j, "model")) {
    if (!m->is_string()) bad("model", "'model' must be a string");
    r.model = m->get<std::string>();
    if (r.model != served_model)
      throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", r.model, served_model),
                     "invalid_request_error", "model", "model_not_found");
  }
  if (chat) {
    const Json* messages = field(j, "messages");
    if (messages == nullptr) bad("messages", "'messages' is required");
    if (!messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty list");
    if (messages->size() > kMaxMessages) bad("messages", fmt::format("'messages' has {} entries; at most {} are accepted", messages->size(), kMaxMessages));
    r.messages = Json::array();
    for (std::size_t i = 0; i < messages->size(); ++i) {
      const Json& m = (*messages)[i];
      const std::string param = fmt::format("messages[{}]", i);
      if (!m.is_object()) bad(param, fmt::format("'{}' must be an object", param));
      if (!m.contains("role") || !m["role"].is_string()) bad(param + ".role", fmt::format("'{}.role' must be a string", param));
      Json copy = m;
      copy["content"] = text_of_content(m.contains("content") ? m["content"] : Json(nullptr), i);
      r.messages.push_back(std::move(copy));
    }
    if (const Json* kw = field(j, "chat_template_kwargs")) {
      if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
      for (const auto& [key, value] : kw->items()) {
        if (key == "messages" || key == "add_generation_prompt" || key == "bos_token" || key == "eos_token")
          bad("chat_template_kwargs", fmt::format("'chat_template_kwargs' cannot set '{}'", key));
        // Flat values only: templates switch on flags and strings, and nesting is not walked recursively.
        if (value.is_structured()) bad("chat_template_kwargs", fmt::format("'chat_template_kwargs.{}' must be a string, number, boolean or null", key));
      }
      r.template_kwargs = *kw;
    }
  } else {
    const Json* prompt = field(j, "prompt");
    if (prompt == nullptr) bad("prompt", "'prompt' is required");
    if (prompt->is_string()) {
      r.prompt = prompt->get<std::string>();
    } else if (prompt->is_array() && prompt->size() == 1 && (*prompt)[0].is_string()) {
      r.prompt = (*prompt)[0].get<std::string>();
    } else {
      bad("prompt", "'prompt' must be a string (or a list of one string; token ids and batches are not supported)");
    }
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
  unsupported("echo", !is("echo", false));
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
                                     const std::string& model, const Generated& g, const Tokenizer& tokenizer) {
  Json choice;
  if (r.chat) {
    choice = {{"index", 0},
              {"message", {{"role", "assistant"}, {"content", g.text}}},
              {"logprobs", r.logprobs ? chat_logprobs(g.tokens, tokenizer) : Json(nullptr)},
              {"finish_reason", g.finish_reason}};
  } else {
    choice = {{"index", 0},
              {"text", g.text},
              {"logprobs", r.logprobs ? completion_logprobs(g.tokens, tokenizer, r.top_logprobs > 0, 0) : Json(nullptr)},
              {"finish_reason", g.finish_reason}};
  }
  return {{"id", id},
          {"object", r.chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", Json::array({choice})},
          {"usage", usage_of(g)}};
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
