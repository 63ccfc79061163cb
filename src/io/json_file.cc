#include "io/json_file.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace woq {

void require_regular_file(const std::string& path, std::uintmax_t max_bytes) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(st)) fail("{}: not found{}", path, ec ? " (" + ec.message() + ")" : "");
  if (!std::filesystem::is_regular_file(st)) fail("{}: not a regular file", path);
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail("{}: cannot read its size: {}", path, ec.message());
  if (size > max_bytes) fail("{}: {} bytes is larger than the {} bytes accepted", path, size, max_bytes);
}

std::string read_text_file(const std::string& path, std::uintmax_t max_bytes) {
  require_regular_file(path, max_bytes);
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::stringstream buf;
  buf << in.rdbuf();
  if (!in.good() && !in.eof()) fail("{}: read failed", path);
  return buf.str();
}

namespace {

// The deepest nesting of [ and { outside strings (a scan that builds nothing).
int json_nesting(const std::string& text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

}  // namespace

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path, kMaxJsonFileBytes);
  if (json_nesting(text) > kMaxJsonFileDepth) fail("{}: nested deeper than {} levels", path, kMaxJsonFileDepth);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

std::string describe_json(const nlohmann::json& value) {
  if (value.is_array()) return value.empty() ? "[]" : fmt::format("an array of {} elements", value.size());
  if (value.is_object()) return value.empty() ? "{}" : fmt::format("an object with {} keys", value.size());
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    if (s.size() > 64) return fmt::format("a string of {} bytes", s.size());
  }
  return value.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);  // ASCII only
}

void require_writable_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty()) fail("an output path is empty");
  if (fs::is_directory(path, ec)) fail("{}: is a directory", path);
  const fs::path dir = fs::path(path).parent_path();
  if (!dir.empty() && !fs::is_directory(dir, ec)) fail("{}: its folder {} does not exist", path, dir.string());
}

void write_text_file(const std::string& path, const std::string& text) {
  std::error_code ec;
  require_writable_path(path);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("{}: cannot create", tmp);
    out << text;
    if (!out.flush()) {
      std::filesystem::remove(tmp, ec);
      fail("{}: cannot write", tmp);
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(tmp, ec);
    fail("{}: cannot rename to {}: {}", tmp, path, why);
  }
}

void write_json_file(const std::string& path, const nlohmann::ordered_json& json) {
  // Strings from users (prompts, file text) may hold invalid UTF-8: write U+FFFD for those bytes.
  write_text_file(path, json.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
}

JsonFields::JsonFields(nlohmann::json json, std::string path)
    : json_(std::move(json)), path_(std::move(path)) {
  if (!json_.is_object()) fail("{}: expected a JSON object at the top level, got {}", path_, json_.type_name());
}

bool JsonFields::has(const std::string& key) const {
  const auto it = json_.find(key);
  return it != json_.end() && !it->is_null();
}

void JsonFields::field_error(const std::string& key, const std::string& what) const {
  fail("{}: field '{}' {}", path_, key, what);
}

std::int64_t JsonFields::integer(const std::string& key) const {
  const auto value = opt_integer(key);
  if (!value) field_error(key, "is missing");
  return *value;
}

std::optional<std::int64_t> JsonFields::opt_integer(const std::string& key) const {
  if (!has(key)) return std::nullopt;
  const auto& v = json_.at(key);
  if (!v.is_number_integer()) field_error(key, fmt::format("must be an integer, got {}", describe_json(v)));
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(INT64_MAX))
    field_error(key, fmt::format("is too large: {}", describe_json(v)));
  return v.get<std::int64_t>();
}

double JsonFields::number(const std::string& key, std::optional<double> fallback) const {
  if (!has(key)) {
    if (!fallback) field_error(key, "is missing");
    return *fallback;
  }
  const auto& v = json_.at(key);
  if (!v.is_number()) field_error(key, fmt::format("must be a number, got {}", describe_json(v)));
  if (!std::isfinite(v.get<double>())) field_error(key, "must be finite");
  return v.get<double>();
}

bool JsonFields::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = json_.at(key);
  if (!v.is_boolean()) field_error(key, fmt::format("must be true or false, got {}", describe_json(v)));
  return v.get<bool>();
}

std::string JsonFields::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = json_.at(key);
  if (!v.is_string()) field_error(key, fmt::format("must be a string, got {}", describe_json(v)));
  return v.get<std::string>();
}

}  // namespace woq
