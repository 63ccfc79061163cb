// Reading an API request body: JSON parsed within budgets, and typed,
// range-checked fields whose errors are 400s naming the field. Shared by the
// OpenAI endpoints (openai_api.h) and the tokenizer endpoints
// (tokenize_api.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace woq::server {

/// An error in OpenAI's shape: {"error": {"message", "type", "param", "code"}}.
struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string type, std::string param = {}, std::string code = {});
  int status;          ///< HTTP status
  std::string type;    ///< invalid_request_error, not_found_error, server_error
  std::string param;   ///< the request field at fault, or empty
  std::string code;    ///< e.g. model_not_found, context_length_exceeded, invalid_api_key
  nlohmann::ordered_json body() const;
};

/// Budgets of a request body: nesting depth of its JSON, JSON values in it (its parsed
/// size is then at most ~100 bytes per value plus the body's strings), keys of one object (an
/// ordered object inserts by a linear search: 200 000 keys took 39 s) and chat messages.
inline constexpr int kMaxJsonDepth = 64;
inline constexpr std::size_t kMaxJsonValues = std::size_t{1} << 18;
inline constexpr std::size_t kMaxJsonKeys = 4096;
inline constexpr std::size_t kMaxMessages = 4096;

namespace fields {

using Json = nlohmann::ordered_json;

/// Throws ApiError 400 (invalid_request_error) for `param`.
[[noreturn]] void bad(const std::string& param, const std::string& message);

/// The body as a JSON object, checked against the budgets above before it is
/// built. Throws ApiError 400 for malformed JSON, a body over a budget, or
/// one that is not an object.
Json parse_object(const std::string& body);

/// A field that may be absent or null: nullptr then.
const Json* field(const Json& j, const char* key);
/// Typed fields, nullopt when absent or null; 400 for another type or a value outside [lo, hi].
std::optional<double> number(const Json& j, const char* key, double lo, double hi);
std::optional<std::int64_t> integer(const Json& j, const char* key, std::int64_t lo, std::int64_t hi);
std::optional<bool> boolean(const Json& j, const char* key);

/// Checks "model" (optional) against the served model's name: 400 for a
/// non-string, 404 model_not_found for another name. Returns it as sent.
std::string check_model(const Json& j, const std::string& served_model);

/// Chat "messages": a non-empty list (at most kMaxMessages) of objects with
/// a string "role"; "content" a string, null or a list of text parts (joined).
Json parse_messages(const Json& j);

/// "chat_template_kwargs" (vLLM's): an object of flat values that may not set
/// messages, add_generation_prompt, bos_token or eos_token; {} when absent.
Json parse_template_kwargs(const Json& j);

}  // namespace fields
}  // namespace woq::server
