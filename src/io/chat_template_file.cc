#include "io/chat_template_file.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/gguf.h"
#include "io/json_file.h"

namespace woq {

namespace {

// A special token in tokenizer_config.json: a string or {"content": "..."}.
std::string token_string(const nlohmann::json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return {};
  const auto& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return {};
}

ChatTemplateFile from_gguf(const std::string& model) {
  const std::shared_ptr<const std::vector<GgufFile>> files = shared_gguf(model);
  const GgufFile& g = files->front();
  ChatTemplateFile t;
  t.from = g.path() + " tokenizer.chat_template";
  t.source = std::string(g.get_string("tokenizer.chat_template").value_or(""));
  const std::vector<std::string_view>* tokens = g.get_strings("tokenizer.ggml.tokens");
  auto text = [&](std::string_view key) {
    if (tokens == nullptr) return std::string();
    const std::optional<std::int64_t> id = gguf_token_id(g, key, static_cast<std::int64_t>(tokens->size()));
    return id ? std::string((*tokens)[static_cast<std::size_t>(*id)]) : std::string();
  };
  t.bos_token = text("bos_token_id");
  t.eos_token = text("eos_token_id");
  return t;
}

}  // namespace

ChatTemplateFile read_chat_template_file(const std::string& model) {
  namespace fs = std::filesystem;
  if (is_gguf_path(model)) return from_gguf(model);
  const std::string path = (fs::path(model) / "tokenizer_config.json").string();
  const std::string jinja_path = (fs::path(model) / "chat_template.jinja").string();
  std::error_code ec;
  nlohmann::json cfg = nlohmann::json::object();
  ChatTemplateFile t{"", "<s>", "</s>", path};
  if (fs::exists(path, ec)) {
    cfg = read_json_file(path);
    if (!cfg.is_object()) fail("{}: expected a JSON object", path);
    t.bos_token = token_string(cfg, "bos_token");
    t.eos_token = token_string(cfg, "eos_token");
  }
  if (fs::exists(jinja_path, ec)) {
    t.source = read_text_file(jinja_path, 16ull << 20);
    t.from = jinja_path;
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    t.source = cfg["chat_template"].get<std::string>();
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
    for (const auto& e : cfg["chat_template"])
      if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") && e["template"].is_string())
        t.source = e["template"].get<std::string>();
    if (t.source.empty()) fail("{}: chat_template is a list without a \"default\" template", path);
  } else if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    fail("{}: chat_template must be a string or a list of {{\"name\", \"template\"}}", path);
  }
  return t;
}

}  // namespace woq
