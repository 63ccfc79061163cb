// Per-sequence key/value cache of a decoder, allocated in pages as the sequence grows.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "core/error.h"

namespace woq {

/// Keys and values of layers [first_layer, first_layer + layers) (every layer
/// of a model, or a pipeline stage's blocks) for positions [0, size()), fp32,
/// in pages of kPageTokens positions allocated by grow() as the sequence gets
/// longer (a request for a 128 K context that stops after 20 tokens holds one
/// page). A page: k and v, each [layers, kPageTokens, kv_dim] row-major,
/// kv_dim = num_key_value_heads · head_dim.
///
/// Pages may be shared between caches (prefix caching, as vLLM's automatic
/// prefix caching shares KV blocks): a sequence only ever writes positions
/// from size() on, so a page wholly below size() is never written again and
/// can be read by another sequence with the same tokens there; share_prefix()
/// shares such pages and copies the one page a prefix ends inside of.
struct KVCache {
  static constexpr std::int64_t kPageTokens = 256;

  KVCache(std::int64_t num_layers, std::int64_t max_tokens, std::int64_t dim, std::int64_t first = 0)
      : layers(num_layers), capacity(max_tokens), kv_dim(dim), first_layer(first) {}

  /// Key row of `layer` (the model's numbering, within the cache's layers) at position `pos` (< allocated()):
  /// kv_dim floats.
  float* key(std::int64_t layer, std::int64_t pos) { return row(pages_k, layer, pos); }
  float* value(std::int64_t layer, std::int64_t pos) { return row(pages_v, layer, pos); }

  std::int64_t size() const { return length; }
  /// Positions with memory behind them (whole pages).
  std::int64_t allocated() const { return static_cast<std::int64_t>(pages_k.size()) * kPageTokens; }
  /// Makes positions [0, tokens) addressable; tokens must not exceed capacity. Throws std::bad_alloc.
  void grow(std::int64_t tokens) {
    while (allocated() < tokens) {
      pages_k.push_back(new_page());
      pages_v.push_back(new_page());
    }
  }
  /// Bytes a cache of `tokens` positions takes, rounded up to whole pages.
  static std::int64_t bytes_for(std::int64_t num_layers, std::int64_t tokens, std::int64_t dim) {
    return 2 * num_layers * ((tokens + kPageTokens - 1) / kPageTokens) * kPageTokens * dim * static_cast<std::int64_t>(sizeof(float));
  }
  /// Bytes of one page (keys and values).
  std::int64_t page_bytes() const { return bytes_for(layers, kPageTokens, kv_dim); }

  /// Makes this empty cache hold `from`'s positions [0, tokens) (tokens <= from.size(), <= capacity): the
  /// pages wholly inside are shared, the page the prefix ends inside of is copied (its rows below `tokens`),
  /// so writing positions >= tokens here never changes `from`. Throws woq::Error for a non-empty cache, a
  /// different shape or too many tokens; std::bad_alloc.
  void share_prefix(const KVCache& from, std::int64_t tokens) {
    if (length != 0 || !pages_k.empty()) fail("share_prefix: the cache is not empty");
    if (from.layers != layers || from.kv_dim != kv_dim || from.first_layer != first_layer)
      fail("share_prefix: caches of different shapes");
    if (tokens < 0 || tokens > from.size() || tokens > capacity)
      fail("share_prefix: {} tokens from a cache of {} into one of capacity {}", tokens, from.size(), capacity);
    const std::int64_t whole = tokens / kPageTokens, rows = tokens % kPageTokens;
    pages_k.assign(from.pages_k.begin(), from.pages_k.begin() + whole);
    pages_v.assign(from.pages_v.begin(), from.pages_v.begin() + whole);
    if (rows > 0) {
      for (auto [to, src] : {std::pair{&pages_k, &from.pages_k}, std::pair{&pages_v, &from.pages_v}}) {
        to->push_back(new_page());
        copy_rows((*src)[static_cast<std::size_t>(whole)].get(), to->back().get(), rows);
      }
    }
    length = tokens;
  }
  /// A cache sharing every page of positions [0, tokens) (tokens <= size()), including the one they end
  /// inside of: a read-only record for a prefix cache (writing it would change this cache).
  KVCache prefix(std::int64_t tokens) const {
    if (tokens < 0 || tokens > length) fail("prefix: {} tokens of a cache of {}", tokens, length);
    KVCache view(layers, tokens, kv_dim, first_layer);
    const auto pages = static_cast<std::ptrdiff_t>((tokens + kPageTokens - 1) / kPageTokens);
    view.pages_k.assign(pages_k.begin(), pages_k.begin() + pages);
    view.pages_v.assign(pages_v.begin(), pages_v.begin() + pages);
    view.length = tokens;
    return view;
  }
  /// Forgets positions from `tokens` on (tokens <= size()), e.g. a chat turn that rewrote the end of the
  /// history: pages wholly beyond are released, and the page `tokens` ends inside of is copied first when
  /// another cache shares it (so the positions written next change no other cache).
  void truncate(std::int64_t tokens) {
    if (tokens < 0 || tokens > length) fail("truncate: {} tokens of a cache of {}", tokens, length);
    const auto keep = static_cast<std::size_t>((tokens + kPageTokens - 1) / kPageTokens);
    pages_k.resize(std::min(keep, pages_k.size()));
    pages_v.resize(pages_k.size());
    if (tokens % kPageTokens != 0)
      for (Pages* pages : {&pages_k, &pages_v}) {
        auto& last = pages->back();
        if (last.use_count() == 1) continue;
        std::shared_ptr<float[]> own = new_page();
        copy_rows(last.get(), own.get(), tokens % kPageTokens);
        last = std::move(own);
      }
    length = tokens;
  }
  /// Page p's identity (for counting pages shared between caches); p < allocated() / kPageTokens.
  const void* page_id(std::size_t p) const { return pages_k[p].get(); }
  std::size_t page_count() const { return pages_k.size(); }

  std::int64_t layers;
  std::int64_t capacity;  ///< tokens at most
  std::int64_t kv_dim;
  std::int64_t first_layer;  ///< the model's layer number of the cache's first
  std::int64_t length = 0;   ///< positions filled

 private:
  using Pages = std::vector<std::shared_ptr<float[]>>;
  std::shared_ptr<float[]> new_page() const {
    return std::make_shared_for_overwrite<float[]>(static_cast<std::size_t>(layers * kPageTokens * kv_dim));
  }
  // Positions [0, rows) of every layer of page `from` into page `to`.
  void copy_rows(const float* from, float* to, std::int64_t rows) const {
    for (std::int64_t l = 0; l < layers; ++l)
      std::copy(from + l * kPageTokens * kv_dim, from + (l * kPageTokens + rows) * kv_dim, to + l * kPageTokens * kv_dim);
  }
  float* row(Pages& pages, std::int64_t layer, std::int64_t pos) {
    return pages[static_cast<std::size_t>(pos / kPageTokens)].get() +
           ((layer - first_layer) * kPageTokens + pos % kPageTokens) * kv_dim;
  }
  Pages pages_k, pages_v;
};

}  // namespace woq
