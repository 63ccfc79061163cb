// The key-tile transpose of the attention kernel with 8x8 AVX blocks, shared
// by attention_avx2.cc and attention_avx512.cc (internal linkage: each file
// keeps its own copy, compiled with its own flags).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/attention_tile.h"

namespace woq::detail {
namespace {

/// kt[i][j] = k[j][i] for 8 keys j and 8 dims i (rows `stride` apart; kt rows
/// kT apart), 0 for the keys j >= n.
inline void transpose8x8(const float* k, std::int64_t stride, std::int64_t n, float* kt) {
  __m256 r[8], t[8];
  for (int j = 0; j < 8; ++j) r[j] = j < n ? _mm256_loadu_ps(k + j * stride) : _mm256_setzero_ps();
  for (int j = 0; j < 8; j += 2) {
    t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
    t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
  }
  for (int j = 0; j < 8; j += 4) {
    r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
    r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
    r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
    r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(kt + i * kT, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
    _mm256_storeu_ps(kt + (i + 4) * kT, _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
  }
}

/// transpose_keys (attention_tile.h) by 8x8 blocks where 8 dims are whole.
inline void transpose_keys8(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt) {
  for (std::int64_t j = 0; j < kT; j += 8) {
    const std::int64_t rows = std::max<std::int64_t>(0, std::min<std::int64_t>(8, n - j));
    std::int64_t i = 0;
    for (; i + 8 <= d; i += 8) transpose8x8(k + j * stride + i, stride, rows, kt + i * kT + j);
    for (; i < d; ++i)
      for (std::int64_t jj = j; jj < j + 8; ++jj) kt[i * kT + jj] = jj < n ? k[jj * stride + i] : 0.0f;
  }
}

}  // namespace
}  // namespace woq::detail
