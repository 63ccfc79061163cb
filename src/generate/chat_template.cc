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
  namespace fs = std::filesystem;
  const std::string path = (fs::path(dir) / "tokenizer_config.json").string();
  const std::string jinja_path = (fs::path(dir) / "chat_template.jinja").string();
  std::error_code ec;
  nlohmann::json cfg = nlohmann::json::object();
  std::string bos = "<s>", eos = "</s>";
  if (fs::exists(path, ec)) {
    cfg = read_json_file(path);
    if (!cfg.is_object()) fail("{}: expected a JSON object", path);
    bos = token_string(cfg, "bos_token");
    eos = token_string(cfg, "eos_token");
  }
  std::string source, from = path;
  if (fs::exists(jinja_path, ec)) {
    source = read_text_file(jinja_path, 16ull << 20);
    from = jinja_path;
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_string()) {
    source = cfg["chat_template"].get<std::string>();
  } else if (cfg.contains("chat_template") && cfg["chat_template"].is_array()) {
    for (const auto& t : cfg["chat_template"])
      if (t.is_object() && t.contains("name") && t["name"] == "default" && t.contains("template") && t["template"].is_string())
        source = t["template"].get<std::string>();
    if (source.empty()) fail("{}: chat_template is a list without a \"default\" template", path);
  } else if (cfg.contains("chat_template") && !cfg["chat_template"].is_null()) {
    fail("{}: chat_template must be a string or a list of {{\"name\", \"template\"}}", path);
  }
  if (source.empty()) return ChatTemplate(default_source(), bos, eos, true);
  try {
    return ChatTemplate(source, bos, eos, false);
  } catch (const jinja::TemplateError& e) {
    fail("{}: chat_template: {}", from, e.what());
  }
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& kwargs) const {
  nlohmann::ordered_json context = kwargs.is_object() ? kwargs : nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["add_generation_prompt"] = add_generation_prompt;
  context["bos_token"] = bos_;
  context["eos_token"] = eos_;
  return template_->render(context);
}

}  // namespace woq
