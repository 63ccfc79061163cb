// Text <-> token ids for a model directory, through SentencePiece
// (tokenizer.model, as shipped with Llama 2 / Mistral checkpoints).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace woq {

class Tokenizer {
 public:
  /// Loads DIR/tokenizer.model and reads add_bos_token (default true) from
  /// DIR/tokenizer_config.json if present. Throws woq::Error naming the file
  /// when tokenizer.model is missing or not a SentencePiece model.
  static Tokenizer load(const std::string& dir);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  /// Token ids of `text`, preceded by BOS when add_bos_token is set.
  std::vector<std::int32_t> encode(std::string_view text) const;
  /// Token ids of a rendered chat prompt: the text of control tokens ("<s>",
  /// "</s>", ...) becomes their ids, as llama.cpp's parse_special does, and
  /// BOS is added first (when add_bos_token) unless the text begins with it.
  std::vector<std::int32_t> encode_with_special(std::string_view text) const;
  /// The text one token stands for, as OpenAI's logprobs show it: "▁" is a
  /// space, a byte token <0xNN> is that byte, a control token its piece.
  std::string token_text(std::int32_t id) const;
  /// The text of `ids`. Ids outside the vocabulary (e.g. from a model whose
  /// vocab_size exceeds the tokenizer's) decode as the placeholder "<ID?>".
  std::string decode(const std::vector<std::int32_t>& ids) const;

  std::int32_t bos_id() const;
  /// Bytes of the longest piece: a text of B bytes has at least B / this many tokens.
  std::int64_t max_piece_bytes() const { return max_piece_bytes_; }
  bool add_bos() const { return add_bos_; }
  std::int64_t vocab_size() const;

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  bool add_bos_ = true;
  std::int64_t max_piece_bytes_ = 1;
  std::vector<std::pair<std::string, std::int32_t>> control_pieces_;  ///< ("<s>", 1), ("</s>", 2), ...
};

/// Turns a growing list of generated ids into text deltas for streaming.
/// SentencePiece drops the leading "▁" of the first piece it decodes and
/// byte-fallback tokens form a character only together, so each new id is
/// decoded together with the ids since the last emitted text (the approach
/// of transformers' TextStreamer): the cost per token stays constant.
class TextStream {
 public:
  explicit TextStream(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  /// Starts after `ids` (a prompt) without returning their text: the next
  /// pushed id decodes in their context, so SentencePiece keeps its leading
  /// space ("there" + "▁was" gives " was", not "was").
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
