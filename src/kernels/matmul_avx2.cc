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

void axpy(float a, const float* x, float* y, std::int64_t k) {
  const __m256 va = _mm256_set1_ps(a);
  std::int64_t j = 0;
  for (; j + 8 <= k; j += 8)
    _mm256_storeu_ps(y + j, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + j), _mm256_loadu_ps(y + j)));
  for (; j < k; ++j) y[j] += a * x[j];
}

void widen_row(const QuantMatrix& w, std::int64_t row, float* out);

// fp16 / bf16 rows: two accumulators so the FMA latency does not bound the loop.
template <bool kBf16>
float dot_half(const std::uint8_t* p, const float* x, std::int64_t k) {
  auto widen = [](const std::uint8_t* q) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    if constexpr (kBf16) {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    } else {
      return _mm256_cvtph_ps(h);
    }
  };
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  std::int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    acc0 = _mm256_fmadd_ps(widen(p + 2 * j), _mm256_loadu_ps(x + j), acc0);
    acc1 = _mm256_fmadd_ps(widen(p + 2 * j + 16), _mm256_loadu_ps(x + j + 8), acc1);
  }
  for (; j + 8 <= k; j += 8) acc0 = _mm256_fmadd_ps(widen(p + 2 * j), _mm256_loadu_ps(x + j), acc0);
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; j < k; ++j) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * j, 2);
    sum += (kBf16 ? bf16_to_fp32(h) : fp16_to_fp32(h)) * x[j];
  }
  return sum;
}

// Σ_k w_k x_k of a quantized row with w_k = (q_k - z) · s dequantized in
// registers, in exactly dot_f32's order of operations over the widened row
// (two accumulators over steps of 16, one step of 8, the scalar tail), so
// the result equals dot_f32(widen_row(row), x) bit for bit: the row path
// (decode) and the widened tiles (prefill) agree. Walks group by group, which
// keeps dot_f32's steps when every group but the last is a multiple of 16 long.
template <LowBit T>
float dot_dequantized(const QuantMatrix& w, std::int64_t row, const float* x) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes;
  const std::int64_t k = w.cols;
  const std::int64_t g = w.group_size;
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  const __m128i mask = _mm_set1_epi8(0x0f);
  // Sixteen widened values from column j (even), as two vectors.
  auto sixteen = [&](std::int64_t j, __m256 z, __m256 s, __m256& lo, __m256& hi) {
    if constexpr (T == LowBit::kSymInt8) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j));
      lo = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
      hi = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))), s);
    } else {
      const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j / 2));
      const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask));
      lo = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), z), s);
      hi = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), z), s);
    }
  };
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  std::int64_t j = 0;
  float s_last = 0;
  int z_last = 0;
  for (std::int64_t i = 0; i < w.groups_per_row; ++i) {
    const std::int64_t end = std::min(k, (i + 1) * g);
    s_last = fp16_to_fp32(scales[i]);
    z_last = T == LowBit::kAsymInt4 ? w.zeros[static_cast<std::size_t>(row * w.groups_per_row + i)] : 8;
    const __m256 vs = _mm256_set1_ps(s_last), vz = _mm256_set1_ps(static_cast<float>(z_last));
    for (; j + 16 <= end; j += 16) {
      __m256 lo, hi;
      sixteen(j, vz, vs, lo, hi);
      acc0 = _mm256_fmadd_ps(lo, _mm256_loadu_ps(x + j), acc0);
      acc1 = _mm256_fmadd_ps(hi, _mm256_loadu_ps(x + j + 8), acc1);
    }
  }
  // The last group's remainder: dot_f32's one step of 8 and its scalar tail.
  auto value = [&](std::int64_t c) {
    const int q = T == LowBit::kSymInt8 ? reinterpret_cast<const std::int8_t*>(p)[c] : codec::get_nibble(p, c) - z_last;
    return static_cast<float>(q) * s_last;
  };
  if (j + 8 <= k) {
    alignas(32) float v[8];
    for (int c = 0; c < 8; ++c) v[c] = value(j + c);
    acc0 = _mm256_fmadd_ps(_mm256_load_ps(v), _mm256_loadu_ps(x + j), acc0);
    j += 8;
  }
  float sum = hsum(_mm256_add_ps(acc0, acc1));
  for (; j < k; ++j) sum += value(j) * x[j];
  return sum;
}

float dot_row(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes;
  const bool fused = w.group_size % 16 == 0 || w.groups_per_row == 1;
  switch (w.type) {
    case LowBit::kFp32: return dot_f32(reinterpret_cast<const float*>(p), x, w.cols);
    case LowBit::kFp16: return dot_half<false>(p, x, w.cols);
    case LowBit::kBf16: return dot_half<true>(p, x, w.cols);
    case LowBit::kSymInt4:
      if (fused) return dot_dequantized<LowBit::kSymInt4>(w, row, x);
      break;
    case LowBit::kAsymInt4:
      if (fused) return dot_dequantized<LowBit::kAsymInt4>(w, row, x);
      break;
    case LowBit::kSymInt8:
      if (fused) return dot_dequantized<LowBit::kSymInt8>(w, row, x);
      break;
  }
  widen_row(w, row, scratch);
  return dot_f32(scratch, x, w.cols);
}

// ---- Integer path: int8 activation blocks against packed weight blocks ----
//
// Every output y[t, r] is computed by the same sequence of operations,
// whichever micro-tile produces it (a fixed walk over the blocks into one
// accumulator, then one horizontal sum), so results do not depend on how
// many tokens are processed together (prefill equals step-by-step decode,
// bit for bit) nor on the thread count.

// Group of block b. blocks_per_group is a power of two for group sizes
// 32/64/128 and for per channel (one group holding every block); else divide.
class GroupOf {
 public:
  GroupOf(const QuantMatrix& w, std::int64_t blocks)
      : bpg_(w.groups_per_row == 1 ? blocks : w.group_size / kQ8Block),
        shift_(std::has_single_bit(static_cast<std::uint64_t>(bpg_))
                   ? std::countr_zero(static_cast<std::uint64_t>(bpg_))
                   : -1) {}
  std::int64_t operator()(std::int64_t b) const { return shift_ >= 0 ? b >> shift_ : b / bpg_; }
  /// True when every block has its own scale (group_size 32).
  bool one_block_groups() const { return bpg_ == 1; }

 private:
  std::int64_t bpg_;
  int shift_;
};

// Loads the bytes of a packed row from p, `avail` of which lie inside the
// row; the ragged end of a row is copied into a zero-padded buffer so that
// nothing past the row is read.
__m256i load_row_bytes(const std::uint8_t* p, std::int64_t avail) {
  if (avail >= 32) [[likely]]
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  alignas(32) std::uint8_t pad[32] = {};
  if (avail > 0) std::memcpy(pad, p, static_cast<std::size_t>(avail));
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(pad));
}

// Software prefetch of the 128 bytes kPrefetchBytes ahead of p (1024 chosen
// by measurement on lm_head-sized matrices, out of cache): the row
// streams of a tile are few and interleaved, and the hardware prefetcher
// alone left decode at about half the memory bandwidth. Prefetching past
// the end of the weights is harmless (prefetches do not fault).
constexpr std::int64_t kPrefetchBytes = 1024;
inline void prefetch_ahead(const std::uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes), _MM_HINT_T0);
  _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchBytes + 64), _MM_HINT_T0);
}

// Accumulators of an R x TOK tile.
template <int R, int TOK>
struct TileAcc {
  __m256 v[R][TOK];
  TileAcc() {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < TOK; ++j) v[i][j] = _mm256_setzero_ps();
  }
  // y[t + j, r + i] = the lane sum of v[i][j]; y is [tokens, w.rows].
  void store(std::int64_t rows, std::int64_t r, std::int64_t t, float* y) const {
    for (int i = 0; i < R; ++i)
      for (int j = 0; j < TOK; ++j) y[(t + j) * rows + r + i] = hsum(v[i][j]);
  }
};

// Weight scales (and, for asym_int4, zero · scale) of blocks [b8, b8 + 8) of
// a row, one lane per block; lanes past the row's last block are 0.
template <LowBit T>
void block_scales(const QuantMatrix& w, std::int64_t row, std::int64_t b8, std::int64_t kb,
                  const GroupOf& group_of, __m256& dw, __m256& zdw) {
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  if (group_of.one_block_groups() && b8 + 8 <= kb) {  // group_size 32: eight consecutive scales
    dw = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + b8)));
    if constexpr (T == LowBit::kAsymInt4) {
      const __m128i z = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w.zeros.data() + row * w.groups_per_row + b8));
      zdw = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(z)), dw);
    }
  } else {
    alignas(32) float s[8] = {}, z[8] = {};
    for (std::int64_t i = 0; i < 8 && b8 + i < kb; ++i) {
      const std::int64_t g = group_of(b8 + i);
      s[i] = _cvtsh_ss(scales[g]);
      if constexpr (T == LowBit::kAsymInt4) z[i] = w.zeros[static_cast<std::size_t>(row * w.groups_per_row + g)] * s[i];
    }
    dw = _mm256_load_ps(s);
    if constexpr (T == LowBit::kAsymInt4) zdw = _mm256_load_ps(z);
  }
  if constexpr (T == LowBit::kSymInt4) zdw = _mm256_mul_ps(dw, _mm256_set1_ps(8.0f));
}

// -- sym_int4 / asym_int4: two blocks per step (Q8Layout::kPairedNibbles) --
//
// 32 bytes of a row hold blocks b and b+1; their low nibbles meet the pair's
// first 32 activation bytes and their high nibbles the second 32, through
// maddubs on the stored values q in [0, 15] (pair sums <= 2 * 15 * 127, two
// of them added <= 7620: no int16 saturation). Lanes 0-3 of the int32 result
// belong to block b, lanes 4-7 to b+1, scaled by [s_b·d_b x4 | s_b+1·d_b+1 x4]
// taken from the eight-block scale vector. The zero point comes off once per
// eight blocks, into the same accumulator (only its lane sum matters):
// Σ (q - z) a = Σ q a - z Σ a, with d·Σa precomputed per block.
template <LowBit T, int R, int TOK>
void int4_tile(const QuantMatrix& w, std::int64_t r, const Q8Activations& a, std::int64_t t, float* y) {
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  TileAcc<R, TOK> acc;
  for (std::int64_t b8 = 0; b8 < kb; b8 += 8) {
    for (int i = 0; i < R; ++i) prefetch_ahead(w.data.data() + (r + i) * w.row_bytes + b8 * 16);
    __m256 dw[R], zdw[R];
    for (int i = 0; i < R; ++i) block_scales<T>(w, r + i, b8, kb, group_of, dw[i], zdw[i]);
    __m256 dwda[R][TOK];
    for (int j = 0; j < TOK; ++j) {
      const std::size_t at = static_cast<std::size_t>((t + j) * a.padded + b8);
      const __m256 da = _mm256_loadu_ps(a.d.data() + at);
      const __m256 sa = _mm256_loadu_ps(a.sum.data() + at);
      for (int i = 0; i < R; ++i) {
        dwda[i][j] = _mm256_mul_ps(dw[i], da);
        acc.v[i][j] = _mm256_fnmadd_ps(zdw[i], sa, acc.v[i][j]);
      }
    }
    for (std::int64_t pair = 0; pair < 4 && b8 + 2 * pair < kb; ++pair) {
      const std::int64_t b = b8 + 2 * pair;
      const __m256i lanes = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
      const __m256i pick = _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int>(2 * pair)));
      __m256i lo[R], hi[R];
      for (int i = 0; i < R; ++i) {
        const __m256i v = load_row_bytes(w.data.data() + (r + i) * w.row_bytes + b * 16, w.row_bytes - b * 16);
        lo[i] = _mm256_and_si256(v, mask);
        hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
      }
      for (int j = 0; j < TOK; ++j) {
        const std::int8_t* q = a.row(t + j) + b * kQ8Block;
        const __m256i alo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
        const __m256i ahi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32));
        for (int i = 0; i < R; ++i) {
          const __m256i p16 = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], alo), _mm256_maddubs_epi16(hi[i], ahi));
          acc.v[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones)),
                                        _mm256_permutevar8x32_ps(dwda[i][j], pick), acc.v[i][j]);
        }
      }
    }
  }
  acc.store(w.rows, r, t, y);
}

// -- sym_int8: one block per step (Q8Layout::kNatural) --
//
// maddubs needs one unsigned operand: maddubs(|w|, sign(a, w)) gives pair
// sums of at most 2 * 127 * 127 = 32258, within int16.
template <int R, int TOK>
void int8_tile(const QuantMatrix& w, std::int64_t r, const Q8Activations& a, std::int64_t t, float* y) {
  const __m256i ones = _mm256_set1_epi16(1);
  const std::int64_t kb = a.blocks;
  const GroupOf group_of(w, kb);
  TileAcc<R, TOK> acc;
  for (std::int64_t b8 = 0; b8 < kb; b8 += 8) {
    for (int i = 0; i < R; ++i) {
      const std::uint8_t* row = w.data.data() + (r + i) * w.row_bytes + b8 * kQ8Block;
      prefetch_ahead(row);
      prefetch_ahead(row + 128);
    }
    __m256 dwda[R][TOK];
    for (int i = 0; i < R; ++i) {
      __m256 dw, unused;
      block_scales<LowBit::kSymInt8>(w, r + i, b8, kb, group_of, dw, unused);
      for (int j = 0; j < TOK; ++j)
        dwda[i][j] = _mm256_mul_ps(dw, _mm256_loadu_ps(a.d.data() + (t + j) * a.padded + b8));
    }
    for (std::int64_t k = 0; k < 8 && b8 + k < kb; ++k) {
      const std::int64_t b = b8 + k;
      const __m256i pick = _mm256_set1_epi32(static_cast<int>(k));
      __m256i wv[R], wabs[R];
      for (int i = 0; i < R; ++i) {
        wv[i] = load_row_bytes(w.data.data() + (r + i) * w.row_bytes + b * kQ8Block, w.row_bytes - b * kQ8Block);
        wabs[i] = _mm256_sign_epi8(wv[i], wv[i]);
      }
      for (int j = 0; j < TOK; ++j) {
        const __m256i av = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.row(t + j) + b * kQ8Block));
        for (int i = 0; i < R; ++i) {
          const __m256i prod = _mm256_madd_epi16(_mm256_maddubs_epi16(wabs[i], _mm256_sign_epi8(av, wv[i])), ones);
          acc.v[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(prod), _mm256_permutevar8x32_ps(dwda[i][j], pick), acc.v[i][j]);
        }
      }
    }
  }
  acc.store(w.rows, r, t, y);
}

template <LowBit T, int R, int TOK>
void micro_tile(const QuantMatrix& w, std::int64_t r, const Q8Activations& a, std::int64_t t, float* y) {
  if constexpr (T == LowBit::kSymInt8) {
    int8_tile<R, TOK>(w, r, a, t, y);
  } else {
    int4_tile<T, R, TOK>(w, r, a, t, y);
  }
}

// Tile shapes, chosen so that accumulators and unpacked weights stay in
// the 16 ymm registers, and picked by measurement (bench/matmul_bench at
// 11008 x 4096 on Zen 3): prefill tiles of kPrefillRows x kPrefillTokens,
// decode tiles of kDecodeRows<T> x 1.
constexpr int kPrefillRows = 1;
constexpr int kPrefillTokens = 4;
template <LowBit T>
constexpr int kDecodeRows = T == LowBit::kSymInt8 ? 3 : 2;

// Covers rows [r0, r0+rows) x tokens [t0, t0+tokens).
template <LowBit T>
void tile_q8_typed(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const Q8Activations& a,
                   std::int64_t t0, std::int64_t tokens, float* y) {
  const std::int64_t r_end = r0 + rows;
  const std::int64_t t_end = t0 + tokens;
  std::int64_t t = t0;
  for (; t + kPrefillTokens <= t_end; t += kPrefillTokens) {
    std::int64_t r = r0;
    for (; r + kPrefillRows <= r_end; r += kPrefillRows) micro_tile<T, kPrefillRows, kPrefillTokens>(w, r, a, t, y);
    for (; r < r_end; ++r) micro_tile<T, 1, kPrefillTokens>(w, r, a, t, y);
  }
  for (; t < t_end; ++t) {
    std::int64_t r = r0;
    for (; r + kDecodeRows<T> <= r_end; r += kDecodeRows<T>) micro_tile<T, kDecodeRows<T>, 1>(w, r, a, t, y);
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

// (q - zero) · s of n nibbles starting at an even column, 16 at a time: the
// same float operations as the codecs' scalar dequantization, so the same bits.
void widen_int4_group(const std::uint8_t* q, float s, int zero, std::int64_t n, float* out) {
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m256 z = _mm256_set1_ps(static_cast<float>(zero));
  const __m256 vs = _mm256_set1_ps(s);
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j / 2));
    const __m128i v = _mm_unpacklo_epi8(_mm_and_si128(b, mask), _mm_and_si128(_mm_srli_epi16(b, 4), mask));
    const __m256 f0 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), z);
    const __m256 f1 = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(v, 8))), z);
    _mm256_storeu_ps(out + j, _mm256_mul_ps(f0, vs));
    _mm256_storeu_ps(out + j + 8, _mm256_mul_ps(f1, vs));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(codec::get_nibble(q, j) - zero) * s;
}

void widen_int8_group(const std::int8_t* q, float s, std::int64_t n, float* out) {
  const __m256 vs = _mm256_set1_ps(s);
  std::int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(q + j));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vs));
  }
  for (; j < n; ++j) out[j] = static_cast<float>(q[j]) * s;
}

// A row widened to fp32 exactly (dequantize_stored_row's values, 8 or 16 at a time).
void widen_row(const QuantMatrix& w, std::int64_t row, float* out) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes;
  const std::int64_t k = w.cols;
  const std::int64_t g = w.group_size;
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  switch (w.type) {
    case LowBit::kFp32: std::memcpy(out, p, static_cast<std::size_t>(4 * k)); return;
    case LowBit::kSymInt4:
    case LowBit::kAsymInt4:
      for (std::int64_t i = 0; i < w.groups_per_row; ++i) {
        const int zero = w.type == LowBit::kSymInt4 ? 8 : w.zeros[static_cast<std::size_t>(row * w.groups_per_row + i)];
        widen_int4_group(p + i * g / 2, fp16_to_fp32(scales[i]), zero, codec::group_len(i, k, g), out + i * g);
      }
      return;
    case LowBit::kSymInt8:
      for (std::int64_t i = 0; i < w.groups_per_row; ++i)
        widen_int8_group(reinterpret_cast<const std::int8_t*>(p) + i * g, fp16_to_fp32(scales[i]),
                         codec::group_len(i, k, g), out + i * g);
      return;
    case LowBit::kFp16:
    case LowBit::kBf16: break;
  }
  std::int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2 * j));
    _mm256_storeu_ps(out + j, w.type == LowBit::kFp16 ? _mm256_cvtph_ps(h)
                                                      : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
  }
  for (; j < k; ++j) {
    std::uint16_t h;
    std::memcpy(&h, p + 2 * j, 2);
    out[j] = w.type == LowBit::kFp16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
  }
}

}  // namespace

const RowKernels& avx2_kernels() {
  static const RowKernels k{dot_row, dot_f32, axpy, tile_q8, widen_row, quantize_activations_avx2};
  return k;
}

}  // namespace woq::detail
