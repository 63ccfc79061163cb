// Where a model keeps its chat template: chat_template.jinja or
// tokenizer_config.json "chat_template" in a Hugging Face directory,
// tokenizer.chat_template in a GGUF file.
#pragma once

#include <string>

namespace woq {

/// A model's chat template text and the BOS/EOS strings it is rendered with.
struct ChatTemplateFile {
  std::string source;  ///< empty: the model has none
  std::string bos_token, eos_token;
  std::string from;    ///< the file it came from, for messages
};

/// Reads the chat template of `model`: for a directory DIR/chat_template.jinja
/// (transformers >= 4.43) or DIR/tokenizer_config.json "chat_template" (a
/// string, or a list of {"name", "template"} from which "default" is taken)
/// with its bos_token / eos_token (strings or {"content": ...}; "<s>" and
/// "</s>" without a tokenizer_config.json); for a .gguf file
/// tokenizer.chat_template and the text of tokens tokenizer.ggml.bos_token_id
/// / eos_token_id. Throws woq::Error naming the file for malformed JSON or
/// fields of the wrong type.
ChatTemplateFile read_chat_template_file(const std::string& model);

}  // namespace woq
