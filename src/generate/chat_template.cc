#include "generate/chat_template.h"

#include <filesystem>

#include "core/error.h"
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

}  // namespace

const char* ChatTemplate::default_source() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token, bool is_default)
    : template_(std::make_shared<jinja::Template>(source)),
      bos_(std::move(bos_token)),
      eos_(std::move(eos_token)),
      is_default_(is_default) {}

ChatTemplate ChatTemplate::load(const std::string& dir) {
  const std::string path = (std::filesystem::path(dir) / "tokenizer_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return ChatTemplate(default_source(), "<s>", "</s>", true);
  const nlohmann::json cfg = read_json_file(path);
  if (!cfg.is_object()) fail("{}: expected a JSON object", path);
  const std::string bos = token_string(cfg, "bos_token"), eos = token_string(cfg, "eos_token");
  std::string source;
  if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    source = cfg["chat_template"].get<std::string>();
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
    for (const auto& t : cfg["chat_template"])
      if (t.is_object() && t.value("name", "") == "default" && t.contains("template") && t["template"].is_string())
        source = t["template"].get<std::string>();
    if (source.empty()) fail("{}: chat_template is a list without a \"default\" template", path);
  } else if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    fail("{}: chat_template must be a string or a list of {{\"name\", \"template\"}}", path);
  }
  if (source.empty()) return ChatTemplate(default_source(), bos, eos, true);
  try {
    return ChatTemplate(source, bos, eos, false);
  } catch (const jinja::TemplateError& e) {
    fail("{}: chat_template: {}", path, e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt) const {
  return template_->render({{"messages", messages},
                            {"add_generation_prompt", add_generation_prompt},
                            {"bos_token", bos_},
                            {"eos_token", eos_}});
}

}  // namespace woq
