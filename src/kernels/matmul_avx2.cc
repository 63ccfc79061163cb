// AVX2 + FMA + F16C row kernels. This file alone is compiled with
// -mavx2 -mfma -mf16c; it is only called after active_isa() found them.
#include <immintrin.h>

#include <cstring>

#include "core/half.h"
#include "formats/scale.h"
#include "kernels/matmul.h"
#include "kernels/q8_activations.h"

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


// ---- Integer path: int8 activation blocks against packed weight blocks ----

// Bytes one block of 32 weights occupies in a packed row.
template <LowBit T>
constexpr std::int64_t kBlockBytes = T == LowBit::kSymInt8 ? 32 : 16;

// Block b of a packed row as 32 bytes in the activation block's order:
// int4 -> [16 low nibbles | 16 high nibbles] (unsigned), int8 -> as stored.
// The ragged last block of a row is copied into a zero-padded buffer so no
// byte past the row is read.
template <LowBit T>
__m256i load_weights(const std::uint8_t* row, std::int64_t b, std::int64_t full, std::int64_t cols) {
  const std::uint8_t* p = row + b * kBlockBytes<T>;
  alignas(32) std::uint8_t pad[32] = {};
  if (b >= full) {
    const std::int64_t n = cols - b * kQ8Block;
    std::memcpy(pad, p, static_cast<std::size_t>(T == LowBit::kSymInt8 ? n : (n + 1) / 2));
    p = pad;
  }
  if constexpr (T == LowBit::kSymInt8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
  }
}

// Eight int32 partial sums of Σ w_i a_i over one block. maddubs adds pairs
// of u8 x s8 products into int16: at most 2 * 15 * 127 (int4) or
// 2 * 127 * 127 = 32258 (int8, via |w| and sign(a, w)), so it never saturates.
template <LowBit T>
__m256i block_dot(__m256i w, __m256i a) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (T == LowBit::kSymInt8) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)), ones);
  } else {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), ones);
  }
}

// Zero point of group g of `row`, as a float (0 for sym_int8).
template <LowBit T>
float zero_point(const QuantMatrix& w, std::int64_t row, std::int64_t g) {
  if constexpr (T == LowBit::kSymInt4) return 8.0f;
  if constexpr (T == LowBit::kAsymInt4) return w.zeros[static_cast<std::size_t>(row * w.groups_per_row + g)];
  return 0.0f;
}

float scale_of(const QuantMatrix& w, std::int64_t row, std::int64_t g) {
  return _cvtsh_ss(w.scales[static_cast<std::size_t>(row * w.groups_per_row + g)]);
}

std::int64_t blocks_per_group(const QuantMatrix& w, std::int64_t blocks) {
  return w.groups_per_row == 1 ? blocks : w.group_size / kQ8Block;
}

// One output: row `row` against token t.
template <LowBit T>
float dot_q8(const QuantMatrix& w, std::int64_t row, const Q8Activations& a, std::int64_t t) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes;
  const std::int64_t full = w.cols / kQ8Block;
  const std::int64_t bpg = blocks_per_group(w, a.blocks);
  const std::int8_t* qa = a.q.data() + t * a.blocks * kQ8Block;
  const float* da = a.d.data() + t * a.blocks;
  __m256 acc = _mm256_setzero_ps();
  float corr = 0.0f;
  for (std::int64_t g = 0, b = 0; b < a.blocks; ++g) {
    const float dw = scale_of(w, row, g);
    const float cz = zero_point<T>(w, row, g) * dw;
    for (const std::int64_t end = std::min(a.blocks, b + bpg); b < end; ++b) {
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + b * kQ8Block));
      const __m256i prod = block_dot<T>(load_weights<T>(p, b, full, w.cols), av);
      acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_set1_ps(dw * da[b]), acc);
      if constexpr (T != LowBit::kSymInt8) corr += cz * a.sum[static_cast<std::size_t>(b * a.m + t)];
    }
  }
  return hsum(acc) - corr;
}

// Two rows against four tokens at once: each weight block is unpacked once
// for four tokens, each activation block loaded once for two rows.
template <LowBit T>
void tile_2x4(const QuantMatrix& w, std::int64_t r, const Q8Activations& a, std::int64_t t, float* y) {
  const std::uint8_t* p0 = w.data.data() + r * w.row_bytes;
  const std::uint8_t* p1 = p0 + w.row_bytes;
  const std::int64_t full = w.cols / kQ8Block;
  const std::int64_t bpg = blocks_per_group(w, a.blocks);
  const std::int64_t kb = a.blocks;
  __m256 acc0[4], acc1[4];
  for (int i = 0; i < 4; ++i) acc0[i] = acc1[i] = _mm256_setzero_ps();
  __m128 corr0 = _mm_setzero_ps(), corr1 = _mm_setzero_ps();
  for (std::int64_t g = 0, b = 0; b < kb; ++g) {
    const __m256 dw0 = _mm256_set1_ps(scale_of(w, r, g));
    const __m256 dw1 = _mm256_set1_ps(scale_of(w, r + 1, g));
    const __m128 cz0 = _mm_set1_ps(zero_point<T>(w, r, g) * _mm256_cvtss_f32(dw0));
    const __m128 cz1 = _mm_set1_ps(zero_point<T>(w, r + 1, g) * _mm256_cvtss_f32(dw1));
    for (const std::int64_t end = std::min(kb, b + bpg); b < end; ++b) {
      const __m256i w0 = load_weights<T>(p0, b, full, w.cols);
      const __m256i w1 = load_weights<T>(p1, b, full, w.cols);
      for (int i = 0; i < 4; ++i) {
        const __m256i av = _mm256_loadu_si256(
            reinterpret_cast<const __m256i*>(a.q.data() + ((t + i) * kb + b) * kQ8Block));
        const __m256 da = _mm256_broadcast_ss(a.d.data() + (t + i) * kb + b);
        acc0[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(block_dot<T>(w0, av)), da), dw0, acc0[i]);
        acc1[i] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(block_dot<T>(w1, av)), da), dw1, acc1[i]);
      }
      if constexpr (T != LowBit::kSymInt8) {
        const __m128 s = _mm_loadu_ps(a.sum.data() + b * a.m + t);  // tokens t..t+3
        corr0 = _mm_fmadd_ps(cz0, s, corr0);
        corr1 = _mm_fmadd_ps(cz1, s, corr1);
      }
    }
  }
  alignas(16) float c0[4], c1[4];
  _mm_store_ps(c0, corr0);
  _mm_store_ps(c1, corr1);
  for (int i = 0; i < 4; ++i) {
    y[(t + i) * w.rows + r] = hsum(acc0[i]) - c0[i];
    y[(t + i) * w.rows + r + 1] = hsum(acc1[i]) - c1[i];
  }
}

template <LowBit T>
void tile_q8_typed(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const Q8Activations& a,
                   std::int64_t t0, std::int64_t tokens, float* y) {
  const std::int64_t r_end = r0 + rows;
  const std::int64_t t_end = t0 + tokens;
  std::int64_t t = t0;
  for (; t + 4 <= t_end; t += 4) {
    std::int64_t r = r0;
    for (; r + 2 <= r_end; r += 2) tile_2x4<T>(w, r, a, t, y);
    for (; r < r_end; ++r)
      for (std::int64_t i = t; i < t + 4; ++i) y[i * w.rows + r] = dot_q8<T>(w, r, a, i);
  }
  for (; t < t_end; ++t)
    for (std::int64_t r = r0; r < r_end; ++r) y[t * w.rows + r] = dot_q8<T>(w, r, a, t);
}

void tile_q8(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const Q8Activations& a,
             std::int64_t t0, std::int64_t tokens, float* y) {
  switch (w.type) {
    case LowBit::kSymInt4: return tile_q8_typed<LowBit::kSymInt4>(w, r0, rows, a, t0, tokens, y);
    case LowBit::kAsymInt4: return tile_q8_typed<LowBit::kAsymInt4>(w, r0, rows, a, t0, tokens, y);
    case LowBit::kSymInt8: return tile_q8_typed<LowBit::kSymInt8>(w, r0, rows, a, t0, tokens, y);
    default: break;  // float formats never take the integer path
  }
}

}  // namespace

const RowKernels& avx2_kernels() {
  static const RowKernels k{dot_row, dot_f32, tile_q8};
  return k;
}

}  // namespace woq::detail
