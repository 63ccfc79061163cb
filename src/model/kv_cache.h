// Per-sequence key/value cache of a decoder.
#pragma once

#include <cstdint>
#include <vector>

namespace woq {

/// Keys and values of every layer for positions [0, size()), fp32.
/// k and v: [layers, capacity, kv_dim] row-major, kv_dim = num_key_value_heads · head_dim.
struct KVCache {
  KVCache(std::int64_t num_layers, std::int64_t max_tokens, std::int64_t dim)
      : layers(num_layers), capacity(max_tokens), kv_dim(dim),
        k(static_cast<std::size_t>(num_layers * max_tokens * dim)),
        v(static_cast<std::size_t>(num_layers * max_tokens * dim)) {}

  /// Key row of `layer` at position `pos`: kv_dim floats.
  float* key(std::int64_t layer, std::int64_t pos) { return k.data() + (layer * capacity + pos) * kv_dim; }
  float* value(std::int64_t layer, std::int64_t pos) { return v.data() + (layer * capacity + pos) * kv_dim; }

  std::int64_t size() const { return length; }

  std::int64_t layers;
  std::int64_t capacity;  ///< tokens
  std::int64_t kv_dim;
  std::int64_t length = 0;  ///< positions filled
  std::vector<float> k;     ///< (layer, capacity, kv_dim)
  std::vector<float> v;     ///< (layer, capacity, kv_dim)
};

}  // namespace woq
