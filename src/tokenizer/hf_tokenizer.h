// Hugging Face `tokenizers` BPE tokenizers: tokenizer.json (Llama 3, Qwen2/3,
// Mistral, Llama 2 converted), or GPT-2's vocab.json + merges.txt.
//
// encode: added tokens are matched in the raw text (normalized = false) ->
// the normalizer runs on the rest -> added tokens are matched in the
// normalized text (normalized = true) -> the pre-tokenizer splits the rest
// -> BPE per piece. The post-processor's special tokens (TemplateProcessing)
// are the facade's business (SpecialTokens). decode: tokens -> decoder
// chain -> joined text. As tokenizers/src/tokenizer/{mod,added_vocabulary}.rs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/bpe.h"
#include "tokenizer/text_pipeline.h"
#include "tokenizer/tokenizer_backend.h"

namespace woq {

/// One of tokenizer.json's "added_tokens".
struct AddedToken {
  std::string content;
  std::int32_t id = -1;
  bool single_word = false;  ///< only matched between non-word characters
  bool lstrip = false;       ///< swallows the whitespace before it
  bool rstrip = false;       ///< swallows the whitespace after it
  bool normalized = true;    ///< matched in the normalized text (else in the raw text)
  bool special = false;      ///< dropped by decode
};

/// A tokenizer's stages. Null normalizer / pre-tokenizer: none; null
/// decoder: tokens joined with spaces (as tokenizers does).
struct HfTokenizerParts {
  std::unique_ptr<hf::Normalizer> normalizer;
  std::unique_ptr<hf::PreTokenizer> pre_tokenizer;
  std::unique_ptr<BpeModel> model;
  std::unique_ptr<hf::Decoder> decoder;
  std::vector<AddedToken> added;
  SpecialTokens specials;
  std::string description;  ///< e.g. "tokenizer.json BPE"
};

/// Limits far beyond real tokenizers (Llama 3: 256 added tokens of <= 28
/// bytes; vocabularies of <= 256k), so that a hostile file fails clearly
/// instead of costing gigabytes or minutes.
inline constexpr std::int32_t kMaxTokenId = (1 << 24) - 1;
inline constexpr std::size_t kMaxAddedTokenBytes = 512;
inline constexpr std::size_t kMaxAddedBytes = 4u << 20;

class HfTokenizer final : public TokenizerBackend {
 public:
  /// Takes the parts; `source` names the file in errors. Throws woq::Error
  /// for an added token with an empty content, a negative id, an id another
  /// token already has with a different text, or a content given twice.
  HfTokenizer(HfTokenizerParts parts, const std::string& source);
  ~HfTokenizer() override;

  std::vector<std::int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const std::int32_t> ids) const override;
  std::string token_text(std::int32_t id) const override;
  std::int64_t vocab_size() const override { return vocab_size_; }
  std::optional<std::int32_t> token_id(std::string_view token) const override;
  std::int64_t max_token_bytes() const override { return max_token_bytes_; }
  const SpecialTokens& special_tokens() const override { return parts_.specials; }
  std::string describe() const override { return parts_.description; }

 private:
  class Trie;
  void split_added(std::vector<hf::Piece>& pieces, const Trie& trie) const;
  std::vector<std::int32_t> encode_pieces(std::string_view text) const;

  HfTokenizerParts parts_;
  std::string source_;  ///< the file, for errors
  std::vector<std::string> added_patterns_;  ///< per added token: the text matched (normalized when `normalized`)
  std::unordered_map<std::int32_t, std::size_t> added_by_id_;
  TokenIds added_ids_;
  std::unique_ptr<Trie> raw_trie_, normalized_trie_;  ///< added tokens matched in the raw / normalized text
  std::int64_t vocab_size_ = 0;
  std::int64_t max_token_bytes_ = 1;
};

/// Loads a tokenizer.json. `config` is tokenizer_config.json (null when
/// absent): its bos_token / eos_token name BOS and EOS, and for
/// LlamaTokenizer(Fast) its add_bos_token / add_eos_token replace the
/// post-processor's tokens, as transformers does. Throws woq::Error naming
/// the file and field for malformed JSON, a model other than BPE, unknown
/// component types, merges naming tokens outside the vocabulary, regexes
/// PCRE2 cannot compile and duplicate ids.
std::unique_ptr<TokenizerBackend> load_tokenizer_json(const std::string& path, const nlohmann::json& config);

/// Loads GPT-2's vocab.json (token -> id) and merges.txt ("a b" per line,
/// an optional "#version" line) as transformers' GPT2TokenizerFast does:
/// byte-level pre-tokenizer with GPT-2's regex, byte-level decoder, the
/// special tokens of `config` (or <|endoftext|>) as added tokens.
std::unique_ptr<TokenizerBackend> load_gpt2_vocab(const std::string& vocab_path, const std::string& merges_path,
                                                  const nlohmann::json& config);

}  // namespace woq
