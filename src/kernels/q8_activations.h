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

  const std::int8_t* row(std::int64_t t) const { return q.data() + t * padded * kQ8Block; }
};

/// Quantizes x [m, k] (row-major fp32) into `out` (buffers reused when large
/// enough) with the kernels of `isa`; every ISA gives bit-identical results.
void quantize_activations(const float* x, std::int64_t m, std::int64_t k, Q8Activations& out,
                          Isa isa = active_isa());

namespace detail {
/// AVX2 version of quantize_activations (also used by the avx512 kernels);
/// `out` is already sized and zeroed.
void quantize_activations_avx2(const float* x, Q8Activations& out);
/// Scalar quantization of block b of row r (also the AVX2 path's ragged tail).
void quantize_block(const float* x, std::int64_t r, std::int64_t b, Q8Activations& out);
}  // namespace detail

}  // namespace woq
