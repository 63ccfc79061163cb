// Reading JSON files (config.json and friends) with errors that name the
// file and the field.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

namespace woq {

/// Largest JSON file read_json_file accepts (bytes).
inline constexpr std::uintmax_t kMaxJsonFileBytes = 64ull << 20;

/// Deepest nesting of arrays and objects read_json_file accepts: deeper
/// values would be copied and freed by recursion (a stack overflow).
inline constexpr int kMaxJsonFileDepth = 256;

/// Parses the JSON file at `path`. Throws woq::Error "PATH: not a regular
/// file", "PATH: too large", "PATH: cannot open", "PATH: nested deeper than
/// kMaxJsonFileDepth levels" or "PATH: malformed JSON: ...".
nlohmann::json read_json_file(const std::string& path);

/// A short, printable description of a JSON value for error messages: the
/// value itself when it is short and flat ("[]" for an empty list), else its
/// type and size (never recursing, so arbitrarily deep input cannot overflow
/// the stack).
std::string describe_json(const nlohmann::json& value);

/// Throws woq::Error "PATH: not found" / "not a regular file" / "larger than
/// MAX bytes" unless `path` is a regular file of at most `max_bytes`.
void require_regular_file(const std::string& path, std::uintmax_t max_bytes);

/// The contents of the regular file `path` (at most `max_bytes`). Throws
/// woq::Error as require_regular_file does, or "PATH: cannot open".
std::string read_text_file(const std::string& path, std::uintmax_t max_bytes = 1ull << 30);

/// Throws woq::Error "PATH: is a directory" / "PATH: its folder DIR does not
/// exist" unless write_text_file(path) could create the file; lets a command
/// refuse a bad output path before hours of work rather than after.
void require_writable_path(const std::string& path);

/// Writes `text` to `path` through PATH.tmp renamed into place (removed on
/// failure). Throws woq::Error naming the path when it is a directory or on
/// I/O failure.
void write_text_file(const std::string& path, const std::string& text);

/// Writes `json` (indented by 2; invalid UTF-8 replaced by U+FFFD) to `path`
/// like write_text_file.
void write_json_file(const std::string& path, const nlohmann::ordered_json& json);

/// A JSON object read from a file, with typed field accessors whose errors
/// read "config.json: field 'hidden_size' must be an integer, got string".
class JsonFields {
 public:
  /// Throws woq::Error if `json` is not an object.
  JsonFields(nlohmann::json json, std::string path);

  const nlohmann::json& json() const { return json_; }
  const std::string& path() const { return path_; }
  /// True when the field exists and is not null.
  bool has(const std::string& key) const;

  /// Required integer field; throws if missing or not an integer.
  std::int64_t integer(const std::string& key) const;
  /// Optional integer field (absent or null -> nullopt).
  std::optional<std::int64_t> opt_integer(const std::string& key) const;
  /// Required or defaulted number (integer or float).
  double number(const std::string& key, std::optional<double> fallback = std::nullopt) const;
  /// Defaulted boolean.
  bool boolean(const std::string& key, bool fallback) const;
  /// Defaulted string.
  std::string string(const std::string& key, const std::string& fallback) const;

  /// Throws woq::Error "PATH: field 'KEY' WHAT".
  [[noreturn]] void field_error(const std::string& key, const std::string& what) const;

 private:
  nlohmann::json json_;
  std::string path_;
};

}  // namespace woq
