#include "io/json_file.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace woq {

nlohmann::json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::stringstream buf;
  buf << in.rdbuf();
  try {
    return nlohmann::json::parse(buf.str());
  } catch (const nlohmann::json::parse_error& e) {
    fail("{}: malformed JSON: {}", path, e.what());
  }
}

void write_json_file(const std::string& path, const nlohmann::ordered_json& json) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << json.dump(2) << "\n";
    if (!out.flush()) fail("{}: cannot write", tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename to {}: {}", tmp, path, ec.message());
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
  if (!v.is_number_integer()) field_error(key, fmt::format("must be an integer, got {}", v.dump()));
  return v.get<std::int64_t>();
}

double JsonFields::number(const std::string& key, std::optional<double> fallback) const {
  if (!has(key)) {
    if (!fallback) field_error(key, "is missing");
    return *fallback;
  }
  const auto& v = json_.at(key);
  if (!v.is_number()) field_error(key, fmt::format("must be a number, got {}", v.dump()));
  return v.get<double>();
}

bool JsonFields::boolean(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  const auto& v = json_.at(key);
  if (!v.is_boolean()) field_error(key, fmt::format("must be true or false, got {}", v.dump()));
  return v.get<bool>();
}

std::string JsonFields::string(const std::string& key, const std::string& fallback) const {
  if (!has(key)) return fallback;
  const auto& v = json_.at(key);
  if (!v.is_string()) field_error(key, fmt::format("must be a string, got {}", v.dump()));
  return v.get<std::string>();
}

}  // namespace woq
