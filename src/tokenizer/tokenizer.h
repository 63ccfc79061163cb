// Text <-> token ids for a model directory. One facade over the tokenizer
// kinds checkpoints ship: Hugging Face tokenizer.json (byte-level or
// SentencePiece-style BPE: Llama 3, Qwen2/3, Mistral), SentencePiece
// tokenizer.model (Llama 2, Mistral v0.1), GPT-2's vocab.json +
// merges.txt, and the vocabulary a GGUF file embeds. Callers never know which
// backend runs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer_backend.h"

namespace woq {

class Tokenizer {
 public:
  /// Loads the tokenizer of DIR: tokenizer.json if present (what transformers'
  /// fast tokenizers run), else tokenizer.model, else vocab.json +
  /// merges.txt; DIR/tokenizer_config.json, when present, supplies BOS/EOS
  /// and add_bos_token / add_eos_token. A path ending in .gguf loads the
  /// tokenizer that GGUF file embeds (of a split set, the first part's;
  /// tokenizer/gguf_vocab.h). Throws woq::Error naming the file when none is
  /// found or a file is malformed.
  static Tokenizer load(const std::string& dir);
  explicit Tokenizer(std::unique_ptr<TokenizerBackend> backend);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of `text`, with the post-processor's special tokens (BOS for
  /// Llama 2/3, nothing for Qwen) when `add_special`. Special tokens written
  /// in the text become their ids, as Hugging Face does by default.
  /// Ill-formed UTF-8 is read as U+FFFD.
  std::vector<std::int32_t> encode(std::string_view text, bool add_special = true) const;
  /// Token ids of a rendered chat prompt (as apply_chat_template tokenizes
  /// it): the special tokens' text becomes their ids, preceded by the
  /// post-processor's leading tokens unless the text already begins with
  /// them; nothing is appended.
  std::vector<std::int32_t> encode_with_special(std::string_view text) const;
  /// The text one token stands for, as OpenAI's logprobs show it: "▁" or "Ġ"
  /// is a space, a byte token that byte, a special token its text; "<ID?>"
  /// for an id outside the vocabulary.
  std::string token_text(std::int32_t id) const;
  /// The text of `ids` (special tokens give nothing). Ids outside the
  /// vocabulary (e.g. from a model whose vocab_size exceeds the tokenizer's)
  /// decode as the placeholder "<ID?>".
  std::string decode(const std::vector<std::int32_t>& ids) const;

  /// BOS id (-1: none).
  std::int32_t bos_id() const;
  /// EOS id the tokenizer names (tokenizer_config.json eos_token; -1: none).
  std::int32_t eos_id() const { return backend_->special_tokens().eos; }
  /// Whether encode() puts BOS first (llama-perplexity's add_bos).
  bool add_bos() const;
  /// The id of a token given by its text (e.g. "<|eot_id|>").
  std::optional<std::int32_t> token_id(std::string_view token) const { return backend_->token_id(token); }
  /// The most bytes one token's text has (its piece, or an added token's text). Not a
  /// bound on the input bytes a token covers: normalizers may shrink the input.
  std::int64_t max_piece_bytes() const { return backend_->max_token_bytes(); }
  std::int64_t vocab_size() const { return backend_->vocab_size(); }
  /// What was loaded, e.g. "tokenizer.json BPE (128000 tokens, 256 added)".
  std::string describe() const { return backend_->describe(); }

 private:
  std::unique_ptr<TokenizerBackend> backend_;
};

/// Turns a growing list of generated ids into text deltas for streaming.
/// Decoders drop the leading space of the first token they see and byte
/// tokens form a character only together, so each new id is decoded together
/// with the ids since the last emitted text (the approach of transformers'
/// TextStreamer): the cost per token stays constant, and no text ends inside
/// a UTF-8 character.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  /// Starts after `ids` (a prompt) without returning their text: the next
  /// pushed id decodes in their context, so it keeps its leading space
  /// ("there" + "▁was" gives " was", not "was").
  void set_context(const std::vector<std::int32_t>& ids);
  /// Appends `id`; returns the text it completes (possibly empty).
  std::string push(std::int32_t id);
  /// Text held back so far (an incomplete UTF-8 sequence), decoded as is.
  std::string flush();

 private:
  std::string decode_range(std::size_t begin, std::size_t end) const;

  const Tokenizer& tokenizer_;
  std::vector<std::int32_t> ids_;
  std::size_t prefix_ = 0;  ///< ids before this are only context
  std::size_t read_ = 0;    ///< ids before this have been emitted
};

}  // namespace woq
