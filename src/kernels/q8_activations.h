// Activations quantized to int8 on the fly, so that low-bit weights can be
// multiplied with integer dot products (the scheme of ggml's Q8_0 "vec_dot"
// activations): per row, blocks of 32 values along K with one fp32 scale,
// d = amax / 127, q = round(x / d) (nearest even), |q| <= 127. A block holding
// a NaN or an infinity gets q = 0 and d = NaN, so every output it reaches is
// NaN, on every ISA (not a finite value that hides the bad input).
#pragma once

#include <cstdint>
#include <vector>

#include "core/cpu.h"

namespace woq {

class ThreadPool;

/// Values per activation block.
inline constexpr std::int64_t kQ8Block = 32;

/// m rows of K activations in int8 blocks, value i of block b of row t at
/// q[t * padded * 32 + 32 b + i]. Values past K and blocks past `blocks`, up
/// to `padded`, are zero (scale 0).
struct Q8Activations {
  std::int64_t m = 0;
  std::int64_t k = 0;
  std::int64_t blocks = 0;    ///< ceil(k / 32) per row
  std::int64_t padded = 0;    ///< blocks rounded up to a multiple of 8
  std::vector<std::int8_t> q;  ///< (m, padded * 32)
  std::vector<float> d;        ///< (m, padded) block scales
  std::vector<std::int32_t> qsum;  ///< (m, padded) Σ q per block, for the weights' zero points
  /// int16 activations (quantize_activations_int16): value i of block b of row t is
  /// 255·q[...] + lo[...] (both in [-127, 127]), qsum is Σ of those values and d = amax / 32512
  /// over the block's scale unit (scale_blocks). Kernels then take each block's integer dot
  /// product twice (q, then lo) and add 255·hi + lo in int32. False (lo empty): int8 activations.
  bool wide = false;
  std::vector<std::int8_t> lo;  ///< (m, padded * 32) when wide
  /// Consecutive blocks (from a multiple of it) that share one scale d (stored in each of them):
  /// 1 for int8 activations, kInt16ScaleBlocks for int16 ones. Kernels add the exact integer sums
  /// of the blocks that share both d and the weights' group, then scale them once.
  std::int64_t scale_blocks = 1;

  const std::int8_t* row(std::int64_t t) const { return q.data() + t * padded * kQ8Block; }
  /// Row t's low parts (wide only).
  const std::int8_t* lo_row(std::int64_t t) const { return lo.data() + t * padded * kQ8Block; }
  /// Block b of row t as the integers the kernels multiply: q, or 255·q + lo when wide.
  int value(std::int64_t t, std::int64_t j) const {
    const std::size_t at = static_cast<std::size_t>(t * padded * kQ8Block + j);
    return wide ? 255 * q[at] + lo[at] : q[at];
  }
};

/// The largest |value| of an int16 activation block (255 · 127 + 127).
inline constexpr int kInt16Max = 32512;
/// Blocks of 32 that share one int16 activation scale (128 inputs): four blocks' sums of products
/// with 8-bit weights stay within int32 (4 · 32 · 128 · 32512 < 2^31).
inline constexpr std::int64_t kInt16ScaleBlocks = 4;

/// q_max / amax, the factor quantization multiplies inputs by; 0 when amax is 0 or so small that the
/// factor overflows (then every input rounds to 0: without this, x · inf would be ±inf or NaN).
inline float inv_scale(float q_max, float amax) {
  const float id = amax > 0.0f ? q_max / amax : 0.0f;
  return id <= 3.4028235e38f ? id : 0.0f;
}

/// Quantizes x [m, k] (row-major fp32) into `out` (buffers reused when large
/// enough) with the kernels of `isa`; every ISA gives bit-identical results.
/// A block whose largest magnitude is so small that 127 / amax overflows
/// (below ~3.7e-37) quantizes to zeros: inv_scale's rule.
/// With a pool, large batches are split by rows over its threads (the same bits: rows are independent).
void quantize_activations(const float* x, std::int64_t m, std::int64_t k, Q8Activations& out,
                          Isa isa = active_isa(), ThreadPool* pool = nullptr);

/// Quantizes x [m, k] (row-major fp32) to int16 blocks of 32 (Activations::kInt16) into
/// `out` (wide; buffers reused when large enough): per 128 inputs (kInt16ScaleBlocks blocks)
/// d = amax / 32512,
/// v = nearbyint(x / d), stored as v = 255·hi + lo with hi = floor((v + 127) / 255),
/// so |hi|, |lo| <= 127 (what every ISA's int8 dot products take, AVX2's
/// sign trick included). 128 inputs holding a NaN or an infinity get zeros and
/// d = NaN, as a block does in quantize_activations; 128 inputs whose largest
/// magnitude is below ~9.6e-35 (32512 / amax overflows) quantize to zeros. Every ISA gives the scalar
/// path's bits (AVX2 kernels for avx2 and up); with a pool, large batches are split by rows.
void quantize_activations_int16(const float* x, std::int64_t m, std::int64_t k, Q8Activations& out,
                                Isa isa = active_isa(), ThreadPool* pool = nullptr);

namespace detail {
/// AVX2 versions of quantize_activations and quantize_activations_int16 for rows [r0, r1) (also used by
/// the avx512 kernels); `out` is already sized and zeroed.
void quantize_activations_avx2(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1);
void quantize_activations_int16_avx2(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1);
/// Scalar quantization of block b of row r (also the AVX2 path's ragged tail).
void quantize_block(const float* x, std::int64_t r, std::int64_t b, Q8Activations& out);
/// Scalar int16 quantization of row r's scale unit from input j0 (kInt16ScaleBlocks blocks, or the
/// row's ragged end); also the AVX2 path's non-finite units and tail.
void quantize_int16_unit(const float* x, std::int64_t r, std::int64_t j0, Q8Activations& out);
}  // namespace detail

}  // namespace woq
