// Byte-pair encoding of one pre-tokenized word, with Hugging Face tokenizers'
// semantics (models/bpe: ranked merges, ignore_merges, byte_fallback, unk
// fusing, continuing-subword prefix and end-of-word suffix). The vocabulary
// and merges come from tokenizer.json, GPT-2's vocab.json + merges.txt, or a
// GGUF's tokenizer.ggml.tokens/merges: the model does not know which.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace woq {

/// tokenizer.json "model" options of type BPE.
struct BpeOptions {
  std::optional<std::string> unk_token;  ///< emitted for characters not in the vocabulary
  bool fuse_unk = false;                 ///< consecutive unknown characters give one unk
  bool byte_fallback = false;            ///< unknown characters become <0xNN> byte tokens
  bool ignore_merges = false;            ///< a word found whole in the vocabulary is one token (Llama 3)
  std::string continuing_subword_prefix;  ///< prepended to every symbol but a word's first
  std::string end_of_word_suffix;         ///< appended to a word's last symbol
};

/// String-keyed map that looks up string_views without copying them.
struct StringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenIds = std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>>;

class BpeModel {
 public:
  /// `vocab`: (token, id) pairs; `merges`: pairs of tokens in rank order
  /// (rank = index). `source` names the file in errors. Throws woq::Error for
  /// a duplicate token or id, a negative id, a merge whose parts or result
  /// are not in the vocabulary, or an unk_token that is not in it.
  BpeModel(const std::vector<std::pair<std::string, std::int32_t>>& vocab,
           const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
           const std::string& source);

  /// Appends the ids of `word` (one pre-token, in the vocabulary's alphabet)
  /// to `ids`. Merges run lowest rank first through a priority queue over a
  /// linked list of symbols: O(n log n) in the word's length.
  void encode(std::string_view word, std::vector<std::int32_t>& ids) const;

  /// The token of `id`, or nullptr when no token has that id.
  const std::string* token(std::int32_t id) const;
  std::optional<std::int32_t> id(std::string_view token) const;
  /// One more than the largest id.
  std::int32_t id_limit() const { return static_cast<std::int32_t>(tokens_.size()); }

 private:
  std::vector<std::int32_t> merge_word(std::string_view word) const;

  TokenIds ids_;
  std::vector<std::string> tokens_;  ///< (id_limit) token text; empty for unused ids
  std::vector<bool> used_;           ///< (id_limit)
  /// (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<std::int32_t, std::int32_t>> merges_;
  BpeOptions options_;
  std::optional<std::int32_t> unk_id_;
  std::int32_t byte_ids_[256];  ///< <0xNN> tokens for byte_fallback, -1 if absent

  // Words seen before (as Hugging Face caches them): most words repeat.
  mutable std::mutex cache_mu_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace woq
