// Prefix caching: the KV caches of earlier and running sequences, kept by
// their tokens so that a new sequence sharing a prefix prefills only the rest
// (vLLM's automatic prefix caching, llama-server's cache_prompt).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "model/kv_cache.h"

namespace woq {

/// Token prefixes with their KV cache pages, least recently used evicted
/// beyond a memory bound. Lookup hashes blocks of kBlockTokens tokens (each
/// hash chains the block's tokens onto the previous block's hash, as vLLM keys
/// KV blocks) to find the entry sharing the most whole blocks with a prompt in
/// time linear in the prompt, then compares tokens to find the exact shared
/// length (a hash collision costs a comparison, never a wrong reuse).
///
/// Reused positions are the same bits a cold prefill computes: a position's
/// keys and values depend only on the tokens up to it, and LlamaModel's
/// prefill, chunked prefill and decode_batch give the same bits for them.
/// Not thread-safe (woq serve's engine thread owns it).
class PrefixCache {
 public:
  static constexpr std::int64_t kBlockTokens = 32;

  /// max_bytes: KV page bytes the kept entries may hold together (pages shared by several entries count
  /// once); 0 keeps nothing. page_bytes: what a page counts for (> 0: the whole model's page, so that every
  /// stage of a pipeline, whose pages hold its blocks only, keeps and evicts alike); 0: the caches' own pages.
  explicit PrefixCache(std::int64_t max_bytes, std::int64_t page_bytes = 0) : max_bytes_(max_bytes), page_bytes_(page_bytes) {}

  /// Shares into the empty `cache` the longest kept prefix of `tokens` of at least one block, at most
  /// `limit` tokens long (so that a prompt keeps tokens to prefill) and longer than `longer_than`, and
  /// returns its length (0: nothing reused, `cache` untouched). The entry becomes the most recently used.
  /// Throws std::bad_alloc.
  std::int64_t reuse(std::span<const std::int32_t> tokens, std::int64_t limit, KVCache& cache,
                     std::int64_t longer_than = 0);

  /// Keeps positions [0, tokens.size()) of `cache` (which hold `tokens`; tokens.size() <= cache.size()),
  /// sharing its pages, then evicts the least recently used entries while the bytes exceed the bound. An
  /// entry whose tokens are a prefix of these is dropped; these are not kept when an entry already starts
  /// with them, nor when shorter than one block.
  void keep(std::span<const std::int32_t> tokens, const KVCache& cache);

  std::int64_t bytes() const { return bytes_; }
  std::int64_t max_bytes() const { return max_bytes_; }
  std::size_t entries() const { return lru_.size(); }

 private:
  struct Entry {
    std::vector<std::int32_t> tokens;
    KVCache cache;                     ///< shares the pages of positions [0, tokens.size())
    std::vector<std::uint64_t> hashes;  ///< of blocks 0..k-1 (chained)
  };
  using Entries = std::list<Entry>;

  /// Chained hashes of the whole blocks of `tokens`.
  static std::vector<std::uint64_t> block_hashes(std::span<const std::int32_t> tokens);
  /// Entries that share the most whole blocks with a prompt of these block hashes (at most a few), and
  /// how many blocks they share.
  std::vector<Entries::iterator> deepest(const std::vector<std::uint64_t>& hashes, std::size_t& blocks) const;
  void erase(Entries::iterator e);
  void count_pages(const KVCache& cache, int delta);

  std::int64_t max_bytes_;
  std::int64_t page_bytes_;
  std::int64_t bytes_ = 0;
  Entries lru_;  ///< most recently used first
  std::unordered_multimap<std::uint64_t, Entries::iterator> index_;
  std::unordered_map<const void*, int> page_uses_;  ///< pages of kept entries: how many entries hold each
};

}  // namespace woq
