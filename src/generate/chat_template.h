// A model's chat template (tokenizer_config.json "chat_template"), rendered
// as transformers' apply_chat_template does (see jinja/jinja.h).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "jinja/jinja.h"

namespace woq {

class ChatTemplate {
 public:
  /// Reads the template of DIR (a Hugging Face directory or a .gguf file;
  /// see read_chat_template_file in io/chat_template_file.h). Without a
  /// template, the ChatML default (as llama.cpp's server falls back to) is
  /// used and is_default() is true. Throws woq::Error naming the file for
  /// malformed JSON or a template that does not parse.
  static ChatTemplate load(const std::string& dir);

  /// Parses `source` with the given special-token strings.
  ChatTemplate(const std::string& source, std::string bos_token, std::string eos_token, bool is_default);

  /// Renders `messages` (a JSON array of {"role", "content", ...}) with
  /// add_generation_prompt, bos_token and eos_token set, and the variables of
  /// `kwargs` (an object, e.g. {"enable_thinking": false}: what
  /// apply_chat_template passes on as **kwargs). Throws
  /// jinja::RaisedException when the template calls raise_exception and
  /// jinja::TemplateError for other template errors.
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& kwargs = nlohmann::ordered_json::object()) const;

  bool is_default() const { return is_default_; }
  /// The template's Jinja text (default_source() when is_default()).
  const std::string& source() const { return source_; }
  /// The ChatML template used when a model has none.
  static const char* default_source();

 private:
  std::shared_ptr<const jinja::Template> template_;
  std::string source_, bos_, eos_;
  bool is_default_ = false;
};

}  // namespace woq
