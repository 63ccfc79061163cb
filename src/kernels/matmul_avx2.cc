// AVX2 + FMA + F16C row kernels. This file alone is compiled with
// -mavx2 -mfma -mf16c; it is only called after active_isa() found them.
#include <immintrin.h>

#include <bit>
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
//
// Every output y[t, r] is computed by the same sequence of operations,
// whichever micro-kernel produces it: for each block b in order,
//   acc = fma(float(Σ_i (q_i - zero) · a_i), s_w[g] · d_a[b], acc),
// then one horizontal sum. So results do not depend on how many tokens are
// processed together (prefill equals step-by-step decode, bit for bit), nor
// on the thread count.

// Bytes one block of 32 weights occupies in a packed row.
template <LowBit T>
constexpr std::int64_t kBlockBytes = T == LowBit::kSymInt8 ? 32 : 16;

// 32 weights from p as bytes in the activation block's order:
// int4 -> [16 low nibbles | 16 high nibbles] (0..15), int8 -> as stored.
template <LowBit T>
__m256i unpack_block(const std::uint8_t* p) {
  if constexpr (T == LowBit::kSymInt8) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  } else {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), _mm256_set1_epi8(0x0f));
  }
}

// Group of block b. blocks_per_group is a power of two for group sizes
// 32/64/128 and for per channel (one group holding every block); else divide.
class GroupOf {
 public:
  GroupOf(const QuantMatrix& w, std::int64_t blocks)
      : bpg_(w.groups_per_row == 1 ? blocks : w.group_size / kQ8Block),
        shift_(std::has_single_bit(static_cast<std::uint64_t>(bpg_)) ? std::countr_zero(static_cast<std::uint64_t>(bpg_))
                                                                      : -1) {}
  std::int64_t operator()(std::int64_t b) const { return shift_ >= 0 ? b >> shift_ : b / bpg_; }

 private:
  std::int64_t bpg_;
  int shift_;
};

// Block b of row `row` as signed int8 weights (q - zero, in [-15, 15] for
// int4). The ragged last block (b >= full) is copied into a zero-padded
// buffer so that no byte past the row is read; its padding meets zero
// activations.
template <LowBit T>
__m256i signed_weights(const QuantMatrix& w, std::int64_t row, std::int64_t b, std::int64_t g,
                       std::int64_t full) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes + b * kBlockBytes<T>;
  __m256i v;
  if (b < full) [[likely]] {
    v = unpack_block<T>(p);
  } else {
    alignas(32) std::uint8_t pad[32] = {};
    const std::int64_t n = w.cols - b * kQ8Block;
    std::memcpy(pad, p, static_cast<std::size_t>(T == LowBit::kSymInt8 ? n : (n + 1) / 2));
    v = unpack_block<T>(pad);
  }
  if constexpr (T == LowBit::kSymInt4) return _mm256_sub_epi8(v, _mm256_set1_epi8(8));
  if constexpr (T == LowBit::kAsymInt4)
    return _mm256_sub_epi8(v, _mm256_set1_epi8(static_cast<char>(w.zeros[static_cast<std::size_t>(row * w.groups_per_row + g)])));
  return v;
}

// Eight int32 partial sums of Σ w_i a_i via maddubs(|w|, sign(a, w)): pairs
// of u8 x s8 products are added into int16, at most 2 * 127 * 127 = 32258,
// so they never saturate (weights and activations stay within ±127).
__m256i block_dot(__m256i abs_w, __m256i w, __m256i a) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
}

// Outputs of R consecutive rows (from r) for TOK consecutive tokens (from t):
// each weight block is unpacked once for TOK tokens, each activation block
// loaded once for R rows, and R * TOK independent accumulators hide latency.
template <LowBit T, int R, int TOK>
void micro_tile(const QuantMatrix& w, std::int64_t r, const Q8Activations& a, std::int64_t t, float* y) {
  const std::int64_t full = w.cols / kQ8Block;
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  __m256 acc[R][TOK];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < TOK; ++j) acc[i][j] = _mm256_setzero_ps();
  for (std::int64_t b = 0; b < kb; ++b) {
    const std::int64_t g = group_of(b);
    __m256i wv[R], wabs[R];
    float dw[R];
    for (int i = 0; i < R; ++i) {
      wv[i] = signed_weights<T>(w, r + i, b, g, full);
      wabs[i] = _mm256_sign_epi8(wv[i], wv[i]);
      dw[i] = _cvtsh_ss(w.scales[static_cast<std::size_t>((r + i) * w.groups_per_row + g)]);
    }
    for (int j = 0; j < TOK; ++j) {
      const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q.data() + ((t + j) * kb + b) * kQ8Block));
      const float da = a.d[static_cast<std::size_t>((t + j) * kb + b)];
      for (int i = 0; i < R; ++i)
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot(wabs[i], wv[i], av)), _mm256_set1_ps(dw[i] * da), acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < TOK; ++j) y[(t + j) * w.rows + r + i] = hsum(acc[i][j]);
}

template <LowBit T>
void tile_q8_typed(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const Q8Activations& a,
                   std::int64_t t0, std::int64_t tokens, float* y) {
  const std::int64_t r_end = r0 + rows;
  const std::int64_t t_end = t0 + tokens;
  std::int64_t t = t0;
  for (; t + 4 <= t_end; t += 4) {
    std::int64_t r = r0;
    for (; r + 2 <= r_end; r += 2) micro_tile<T, 2, 4>(w, r, a, t, y);
    if (r < r_end) micro_tile<T, 1, 4>(w, r, a, t, y);
  }
  for (; t < t_end; ++t) {
    std::int64_t r = r0;
    for (; r + 4 <= r_end; r += 4) micro_tile<T, 4, 1>(w, r, a, t, y);
    for (; r < r_end; ++r) micro_tile<T, 1, 1>(w, r, a, t, y);
  }
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
