// Per-sequence key/value cache of a decoder, allocated in pages as the sequence grows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace woq {

/// Keys and values of every layer for positions [0, size()), fp32, in pages of
/// kPageTokens positions allocated by grow() as the sequence gets longer (a
/// request for a 128 K context that stops after 20 tokens holds one page).
/// A page: k and v, each [layers, kPageTokens, kv_dim] row-major,
/// kv_dim = num_key_value_heads · head_dim.
struct KVCache {
  static constexpr std::int64_t kPageTokens = 256;

  KVCache(std::int64_t num_layers, std::int64_t max_tokens, std::int64_t dim)
      : layers(num_layers), capacity(max_tokens), kv_dim(dim) {}

  /// Key row of `layer` at position `pos` (< allocated()): kv_dim floats.
  float* key(std::int64_t layer, std::int64_t pos) { return row(pages_k, layer, pos); }
  float* value(std::int64_t layer, std::int64_t pos) { return row(pages_v, layer, pos); }

  std::int64_t size() const { return length; }
  /// Positions with memory behind them (whole pages).
  std::int64_t allocated() const { return static_cast<std::int64_t>(pages_k.size()) * kPageTokens; }
  /// Makes positions [0, tokens) addressable; tokens must not exceed capacity. Throws std::bad_alloc.
  void grow(std::int64_t tokens) {
    const std::size_t page = static_cast<std::size_t>(layers * kPageTokens * kv_dim);
    while (allocated() < tokens) {
      pages_k.push_back(std::make_unique_for_overwrite<float[]>(page));
      pages_v.push_back(std::make_unique_for_overwrite<float[]>(page));
    }
  }
  /// Bytes a cache of `tokens` positions takes, rounded up to whole pages.
  static std::int64_t bytes_for(std::int64_t num_layers, std::int64_t tokens, std::int64_t dim) {
    return 2 * num_layers * ((tokens + kPageTokens - 1) / kPageTokens) * kPageTokens * dim * static_cast<std::int64_t>(sizeof(float));
  }

  std::int64_t layers;
  std::int64_t capacity;  ///< tokens at most
  std::int64_t kv_dim;
  std::int64_t length = 0;  ///< positions filled

 private:
  using Pages = std::vector<std::unique_ptr<float[]>>;
  float* row(Pages& pages, std::int64_t layer, std::int64_t pos) {
    return pages[static_cast<std::size_t>(pos / kPageTokens)].get() + (layer * kPageTokens + pos % kPageTokens) * kv_dim;
  }
  Pages pages_k, pages_v;
};

}  // namespace woq
