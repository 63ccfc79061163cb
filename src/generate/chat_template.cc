#include "generate/chat_template.h"

#include "core/error.h"
#include "io/chat_template_file.h"

namespace woq {

const char* ChatTemplate::default_source() {
  return "{%- for message in messages %}"
         "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
         "{%- endfor %}"
         "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}";
}

ChatTemplate::ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token, bool is_default)
    : template_(std::make_shared<jinja::Template>(source)),
      source_(source),
      bos_(std::move(bos_token)),
      eos_(std::move(eos_token)),
      is_default_(is_default) {}

ChatTemplate ChatTemplate::load(const std::string& dir) {
  const ChatTemplateFile t = read_chat_template_file(dir);
  if (t.source.empty()) return ChatTemplate(default_source(), t.bos_token, t.eos_token, true);
  try {
    return ChatTemplate(t.source, t.bos_token, t.eos_token, false);
  } catch (const jinja::TemplateError& e) {
    fail("{}: chat_template: {}", t.from, e.what());
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
