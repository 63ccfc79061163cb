// The tokenizer a GGUF file carries (tokenizer.ggml.* metadata, as llama.cpp's
// convert_hf_to_gguf.py writes it; keys in gguf-py/gguf/constants.py), as a
// TokenizerBackend. No new tokenizer algorithm: the GGUF vocabulary is turned
// into the inputs of woq's existing backends.
//
// - tokenizer.ggml.model "llama" (SentencePiece): tokens + scores + token_type
//   become a SentencePiece ModelProto (BPE, byte fallback when the vocabulary
//   has byte tokens, add_dummy_prefix = tokenizer.ggml.add_space_prefix),
//   serialized in memory and run by libsentencepiece, as the model's
//   tokenizer.model would be.
// - tokenizer.ggml.model "gpt2" (byte-level BPE): tokens + merges become a
//   BpeModel; tokenizer.ggml.pre names the pre-tokenizer, built as the
//   tokenizer.json Split/ByteLevel sequence the model's Hugging Face tokenizer
//   has (llama.cpp's llm_tokenizer_bpe lists the same regexes); control and
//   user-defined tokens are added tokens matched in the raw text.
//
// Special tokens: tokenizer.ggml.{bos,eos,unknown,padding}_token_id, and
// add_bos_token / add_eos_token with llama.cpp's defaults (llama: BOS added;
// gpt2: BOS added only for the llama3 / tekken pre-tokenizers).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"
#include "tokenizer/tokenizer_backend.h"

namespace woq {

/// The tokenizer of the GGUF file `path` (of a split set, the first part, which holds the
/// metadata). Throws woq::Error naming the file and the key for: a missing or mistyped
/// tokenizer.ggml key, tokens / scores / token_type / merges arrays of different lengths or
/// with bad entries (a token given twice, a token type outside 1..6, a merge that is not two
/// tokens), BOS or EOS to be added but missing or outside the vocabulary, an unknown tokenizer.ggml.model or
/// tokenizer.ggml.pre (the message lists the supported ones).
std::unique_ptr<TokenizerBackend> load_gguf_vocab(const std::string& path);
/// The same for a GGUF file already open.
std::unique_ptr<TokenizerBackend> load_gguf_vocab(const GgufFile& file);

/// Writes the tokenizer of GGUF file `file` into directory `dir` as the Hugging
/// Face files transformers and woq load: model "llama" as tokenizer.model (the
/// SentencePiece ModelProto load_gguf_vocab runs, BOS/EOS pieces set) and
/// tokenizer_config.json (LlamaTokenizer, add_bos_token / add_eos_token, the
/// BOS/EOS/UNK texts); model "gpt2" as tokenizer.json (BPE vocab and merges,
/// the pre-tokenizer tokenizer.ggml.pre names, control / user-defined tokens
/// as added tokens, BOS/EOS in a TemplateProcessing post-processor) and
/// tokenizer_config.json. tokenizer.chat_template goes into
/// tokenizer_config.json. Returns the names of the files written. Throws
/// woq::Error as load_gguf_vocab does, and when a file cannot be written.
std::vector<std::string> write_hf_tokenizer(const GgufFile& file, const std::string& dir);

/// The tokenizer.ggml.pre values woq reads for tokenizer.ggml.model "gpt2".
std::vector<std::string_view> gguf_pre_tokenizers();

}  // namespace woq
