// The stages of a Hugging Face tokenizer around its model, as tokenizer.json
// declares them (https://huggingface.co/docs/tokenizers/components):
// normalizers (NFC, NFKC, NFD, NFKD, Lowercase, Prepend, Replace, Strip,
// Sequence), pre-tokenizers (ByteLevel, Split, Digits, Metaspace, Sequence)
// and decoders (ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
// Sequence), with the semantics of the Rust `tokenizers` crate.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace woq::hf {

/// A span of the input on its way through the pipeline.
struct Piece {
  std::string text;
  /// Starts at offset 0 of the original input (Metaspace's prepend_scheme "first").
  bool first = false;
  /// An added token already matched (>= 0): its text is final.
  std::int32_t id = -1;
};

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  /// The normalized form of valid UTF-8 `text`. Throws woq::Error when it
  /// would exceed `max_bytes` (chained Replace steps can grow it without bound).
  virtual std::string normalize(std::string text, std::size_t max_bytes) const = 0;
};

/// The most a normalizer may make of `input_bytes` (NFKC expands up to 18x).
inline std::size_t normalized_limit(std::size_t input_bytes) { return 32 * input_bytes + (64u << 10); }

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  /// Splits (and may rewrite) every piece without an id; drops empty pieces.
  virtual void apply(std::vector<Piece>& pieces) const = 0;
};

class Decoder {
 public:
  virtual ~Decoder() = default;
  /// Rewrites the token strings in place (Hugging Face's decode_chain). With
  /// `continuation` the tokens continue an earlier text: nothing is
  /// stripped from its start (Metaspace, Strip), and bytes stay raw.
  virtual void decode(std::vector<std::string>& tokens, bool continuation) const = 0;
};

/// Builds the component described by `j` (a tokenizer.json object with a
/// "type"). `where` names the file and field for errors ("PATH:
/// pre_tokenizer.pretokenizers[0]"). Throws woq::Error for an unknown type,
/// a missing or mistyped field, a regex PCRE2 cannot compile, or Sequences
/// nested deeper than kMaxSequenceDepth or holding more than kMaxSteps
/// components in all.
std::unique_ptr<Normalizer> make_normalizer(const nlohmann::json& j, const std::string& where, int depth = 0);
std::unique_ptr<PreTokenizer> make_pre_tokenizer(const nlohmann::json& j, const std::string& where, int depth = 0);
std::unique_ptr<Decoder> make_decoder(const nlohmann::json& j, const std::string& where, int depth = 0);

/// Real tokenizers nest one Sequence, rarely two.
inline constexpr int kMaxSequenceDepth = 16;
/// Real tokenizers chain under ten normalizers, pre-tokenizers or decoders.
inline constexpr std::size_t kMaxSteps = 64;

/// GPT-2's byte-level pre-tokenizer (ByteLevel with its regex, no prefix
/// space) and decoder, as transformers builds them for vocab.json + merges.txt.
std::unique_ptr<PreTokenizer> gpt2_pre_tokenizer();
std::unique_ptr<Decoder> gpt2_decoder();

/// GPT-2's byte-to-character table (bytes_to_unicode in openai/gpt-2
/// encoder.py): the UTF-8 text of the character standing for byte `b`.
const std::string& byte_level_char(unsigned char b);
/// The inverse: the byte a byte-level character stands for, or -1.
int byte_level_byte(char32_t c);

}  // namespace woq::hf
