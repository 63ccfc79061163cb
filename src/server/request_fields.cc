#include "server/request_fields.h"

#include <fmt/format.h>

namespace woq::server {

using fields::Json;

ApiError::ApiError(int s, std::string message, std::string t, std::string p, std::string c)
    : std::runtime_error(std::move(message)), status(s), type(std::move(t)), param(std::move(p)), code(std::move(c)) {}

nlohmann::ordered_json ApiError::body() const {
  return {{"error",
           {{"message", what()},
            {"type", type},
            {"param", param.empty() ? Json(nullptr) : Json(param)},
            {"code", code.empty() ? Json(nullptr) : Json(code)}}}};
}

namespace fields {

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

// The text of message `index`'s content: a string, null, or text parts joined.
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

}  // namespace

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

Json parse_object(const std::string& body) {
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
  return j;
}

std::string check_model(const Json& j, const std::string& served_model) {
  const Json* m = field(j, "model");
  if (m == nullptr) return {};
  if (!m->is_string()) bad("model", "'model' must be a string");
  std::string model = m->get<std::string>();
  if (model != served_model)
    throw ApiError(404, fmt::format("The model '{}' does not exist; this server serves '{}'", model, served_model),
                   "invalid_request_error", "model", "model_not_found");
  return model;
}

Json parse_messages(const Json& j) {
  const Json* messages = field(j, "messages");
  if (messages == nullptr) bad("messages", "'messages' is required");
  if (!messages->is_array() || messages->empty()) bad("messages", "'messages' must be a non-empty list");
  if (messages->size() > kMaxMessages) bad("messages", fmt::format("'messages' has {} entries; at most {} are accepted", messages->size(), kMaxMessages));
  Json out = Json::array();
  for (std::size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string param = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad(param, fmt::format("'{}' must be an object", param));
    if (!m.contains("role") || !m["role"].is_string()) bad(param + ".role", fmt::format("'{}.role' must be a string", param));
    Json copy = m;
    copy["content"] = text_of_content(m.contains("content") ? m["content"] : Json(nullptr), i);
    out.push_back(std::move(copy));
  }
  return out;
}

Json parse_template_kwargs(const Json& j) {
  const Json* kw = field(j, "chat_template_kwargs");
  if (kw == nullptr) return Json::object();
  if (!kw->is_object()) bad("chat_template_kwargs", "'chat_template_kwargs' must be an object");
  for (const auto& [key, value] : kw->items()) {
    if (key == "messages" || key == "add_generation_prompt" || key == "bos_token" || key == "eos_token")
      bad("chat_template_kwargs", fmt::format("'chat_template_kwargs' cannot set '{}'", key));
    // Flat values only: templates switch on flags and strings, and nesting is not walked recursively.
    if (value.is_structured()) bad("chat_template_kwargs", fmt::format("'chat_template_kwargs.{}' must be a string, number, boolean or null", key));
  }
  return *kw;
}

}  // namespace fields
}  // namespace woq::server
