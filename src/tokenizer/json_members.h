// Typed access to tokenizer.json members with errors that name the file and
// the field ("tokenizer.json: pre_tokenizer.pretokenizers[0]: 'behavior' is
// missing"). Internal to src/tokenizer.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"

namespace woq::hf {

using Json = nlohmann::json;

[[noreturn]] inline void bad(const std::string& where, const std::string& what) { fail("{}: {}", where, what); }

inline const Json& member(const Json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) bad(where, fmt::format("'{}' is missing", key));
  return j[key];
}

inline std::string string_member(const Json& j, const char* key, const std::string& where) {
  const Json& v = member(j, key, where);
  if (!v.is_string()) bad(where, fmt::format("'{}' must be a string, got {}", key, describe_json(v)));
  return v.get<std::string>();
}

inline bool bool_member(const Json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.is_object() || !j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) bad(where, fmt::format("'{}' must be true or false, got {}", key, describe_json(j[key])));
  return j[key].get<bool>();
}

inline std::size_t count_member(const Json& j, const char* key, const std::string& where) {
  const Json& v = member(j, key, where);
  if (!v.is_number_integer() || v.get<std::int64_t>() < 0 || v.get<std::int64_t>() > (1 << 20))
    bad(where, fmt::format("'{}' must be a small non-negative integer, got {}", key, describe_json(v)));
  return v.get<std::size_t>();
}

inline const Json& array_member(const Json& j, const char* key, const std::string& where) {
  const Json& v = member(j, key, where);
  if (!v.is_array()) bad(where, fmt::format("'{}' must be a list, got {}", key, describe_json(v)));
  return v;
}

inline std::string type_of(const Json& j, const std::string& where) {
  if (!j.is_object()) bad(where, fmt::format("must be an object with a \"type\", got {}", describe_json(j)));
  return string_member(j, "type", where);
}

}  // namespace woq::hf
