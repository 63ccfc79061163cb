// AVX2 + FMA + F16C row kernels. This file alone is compiled with
// -mavx2 -mfma -mf16c; it is only called after active_isa() found them.
#include <immintrin.h>

#include <cstring>

#include "core/half.h"
#include "formats/scale.h"
#include "kernels/matmul.h"

namespace woq::detail {
namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float dot_f32(const float* a, const float* b, std::int64_t k) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8), acc1);
  }
  for (; j + 8 <= k; j += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; j < k; ++j) sum += a[j] * b[j];
  return sum;
}

// Σ_j (q_j - zero) · x_j over one group of n nibbles starting at an even index.
float int4_group_dot(const std::uint8_t* q, const float* x, std::int64_t n, int zero) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m256 z = _mm256_set1_ps(static_cast<float>(zero));
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j / 2));
    const __m128i lo = _mm_and_si128(b, mask);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), mask);
    const __m128i v = _mm_unpacklo_epi8(lo, hi);  // the 16 values in order
    const __m256 f0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), z);
    const __m256 f1 =
        _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), z);
    acc = _mm256_fmadd_ps(f0, _mm256_loadu_ps(x + j), acc);
    acc = _mm256_fmadd_ps(f1, _mm256_loadu_ps(x + j + 8), acc);
  }
  float sum = hsum(acc);
  for (; j < n; ++j) sum += static_cast<float>(codec::get_nibble(q, j) - zero) * x[j];
  return sum;
}

float int8_group_dot(const std::int8_t* q, const float* x, std::int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), _mm256_loadu_ps(x + j), acc);
  }
  float sum = hsum(acc);
  for (; j < n; ++j) sum += static_cast<float>(q[j]) * x[j];
  return sum;
}

float dot_fp16(const std::uint8_t* p, const float* x, std::int64_t k) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j));
    acc = _mm256_fmadd_ps(_mm256_cvtph_ps(h), _mm256_loadu_ps(x + j), acc);
  }
  float sum = hsum(acc);
  for (; j < k; ++j) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * j, 2);
    sum += fp16_to_fp32(h) * x[j];
  }
  return sum;
}

float dot_bf16(const std::uint8_t* p, const float* x, std::int64_t k) {
  __m256 acc = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j));
    const __m256 f = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    acc = _mm256_fmadd_ps(f, _mm256_loadu_ps(x + j), acc);
  }
  float sum = hsum(acc);
  for (; j < k; ++j) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * j, 2);
    sum += bf16_to_fp32(h) * x[j];
  }
  return sum;
}

float dot_row(const QuantMatrix& w, std::int64_t row, const float* x, float* /*scratch*/) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes;
  const std::int64_t k = w.cols;
  const std::int64_t g = w.group_size;
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  float sum = 0.0f;
  switch (w.type) {
    case LowBit::kFp32: return dot_f32(reinterpret_cast<const float*>(p), x, k);
    case LowBit::kFp16: return dot_fp16(p, x, k);
    case LowBit::kBf16: return dot_bf16(p, x, k);
    case LowBit::kSymInt4:
      for (std::int64_t i = 0; i < w.groups_per_row; ++i)
        sum += fp16_to_fp32(scales[i]) *
               int4_group_dot(p + i * g / 2, x + i * g, codec::group_len(i, k, g), 8);
      return sum;
    case LowBit::kAsymInt4: {
      const std::uint8_t* zeros = w.zeros.data() + row * w.groups_per_row;
      for (std::int64_t i = 0; i < w.groups_per_row; ++i)
        sum += fp16_to_fp32(scales[i]) *
               int4_group_dot(p + i * g / 2, x + i * g, codec::group_len(i, k, g), zeros[i]);
      return sum;
    }
    case LowBit::kSymInt8:
      for (std::int64_t i = 0; i < w.groups_per_row; ++i)
        sum += fp16_to_fp32(scales[i]) *
               int8_group_dot(reinterpret_cast<const std::int8_t*>(p) + i * g, x + i * g,
                              codec::group_len(i, k, g));
      return sum;
  }
  return sum;
}

}  // namespace

const RowKernels& avx2_kernels() {
  static const RowKernels k{dot_row, dot_f32};
  return k;
}

}  // namespace woq::detail
