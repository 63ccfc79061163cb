// The interface every tokenizer kind implements behind woq::Tokenizer
// (SentencePiece tokenizer.model, tokenizer.json BPE, ...). Callers use the
// Tokenizer facade, never a backend.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace woq {

/// Special tokens the tokenizer's post-processor puts around one sequence
/// (Hugging Face TemplateProcessing's "single", or SentencePiece's
/// add_bos_token / add_eos_token), and the BOS/EOS ids it names.
struct SpecialTokens {
  std::vector<std::int32_t> prefix;  ///< before the text, e.g. {BOS}
  std::vector<std::int32_t> suffix;  ///< after the text
  std::int32_t bos = -1;             ///< -1: none
  std::int32_t eos = -1;             ///< -1: none
};

class TokenizerBackend {
 public:
  virtual ~TokenizerBackend() = default;

  /// Ids of `text` without the post-processor's special tokens; the text of
  /// special tokens becomes their ids (Hugging Face's default, and what
  /// transformers' slow SentencePiece tokenizers do too).
  virtual std::vector<std::int32_t> encode(std::string_view text) const = 0;
  /// The text of `ids` (all below vocab_size()); special tokens decode to
  /// nothing. Ill-formed UTF-8 (an incomplete byte sequence) becomes U+FFFD.
  virtual std::string decode(std::span<const std::int32_t> ids) const = 0;
  /// The raw bytes one token stands for when it continues a text (a leading
  /// "▁" or "Ġ" is a space); a special token gives its content.
  virtual std::string token_text(std::int32_t id) const = 0;
  /// One more than the largest id; ids below it without a token decode as "".
  virtual std::int64_t vocab_size() const = 0;
  /// The id of a token given by its text (special tokens included), if any.
  virtual std::optional<std::int32_t> token_id(std::string_view token) const = 0;
  /// Upper bound on the input bytes one token can cover.
  virtual std::int64_t max_token_bytes() const = 0;
  virtual const SpecialTokens& special_tokens() const = 0;
  /// What the tokenizer is, e.g. "SentencePiece (tokenizer.model)".
  virtual std::string describe() const = 0;
};

}  // namespace woq
