// The tokenizer endpoints vLLM serves at the server root, which lm-eval's
// remote tokenizer (local-completions with tokenized_requests) and other
// clients call to use the served model's own tokenizer and chat template:
//   GET  /tokenizer_info  -> {"tokenizer_class", "description", "bos_token", "eos_token", "pad_token",
//                             "add_bos_token", "chat_template", "model_max_length", "vocab_size"}
//   POST /tokenize        {"prompt", "add_special_tokens" = true} or
//                         {"messages", "add_generation_prompt" = true, "chat_template_kwargs"}
//                         -> {"count", "max_model_len", "tokens", "token_strs": null}
//   POST /detokenize      {"tokens"} -> {"prompt"}
// (vLLM's vllm/entrypoints/openai/protocol.py TokenizeRequest/DetokenizeRequest).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "generate/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace woq::server {

/// What the served tokenizer is, for GET /tokenizer_info. Special tokens are
/// their text (null when the tokenizer has none); model_max_length is the
/// server's context size.
nlohmann::ordered_json tokenizer_info(const Tokenizer& tokenizer, const ChatTemplate& chat, std::int64_t max_model_len);

/// POST /tokenize. A "prompt" is encoded with the post-processor's special
/// tokens when add_special_tokens (default true); "messages" become the ids a
/// chat completion prefills (the chat template rendered with
/// add_generation_prompt, default true, and encode_with_special), where
/// add_special_tokens may only be false. `max_prompt_bytes` bounds the text
/// tokenized. Throws ApiError: 400 naming the field for malformed bodies,
/// both or neither of prompt/messages, fields woq cannot honour
/// (return_token_strs, continue_final_message, tools, chat_template), a
/// template that raises; 404 for another model; 500 when the template fails.
nlohmann::ordered_json tokenize(const std::string& body, const Tokenizer& tokenizer, const ChatTemplate& chat,
                                std::int64_t max_model_len, std::size_t max_prompt_bytes,
                                const std::string& served_model);

/// POST /detokenize: {"tokens": [ids]} -> {"prompt": text} (special tokens
/// give no text, as decode does). Throws ApiError 400 naming "tokens[i]" for
/// an id that is not an integer in [0, vocab_size), 404 for another model.
nlohmann::ordered_json detokenize(const std::string& body, const Tokenizer& tokenizer, const std::string& served_model);

}  // namespace woq::server
