// Activations quantized to int8 on the fly, so that low-bit weights can be
// multiplied with integer dot products (the scheme of ggml's Q8_0 "vec_dot"
// activations): per row, blocks of 32 values along K with one fp32 scale,
// d = amax / 127, q = round(x / d) (nearest even), |q| <= 127.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cpu.h"

namespace woq {

/// Values per activation block.
inline constexpr std::int64_t kQ8Block = 32;

/// m rows of K activations in int8 blocks. Blocks past K are zero-padded.
struct Q8Activations {
  std::int64_t m = 0;
  std::int64_t k = 0;
  std::int64_t blocks = 0;        ///< ceil(k / 32) per row
  /// Within each block, values in nibble order (the 16 even-indexed values,
  /// then the 16 odd-indexed ones) so that a block meets the low and high
  /// nibbles of packed int4 weights without shuffles; natural order otherwise.
  bool nibble_order = false;
  std::vector<std::int8_t> q;     ///< (m, blocks * 32)
  std::vector<float> d;           ///< (m, blocks) block scales
};

/// Quantizes x [m, k] (row-major fp32) into `out` (buffers reused when large
/// enough). Scalar and AVX2 give bit-identical results.
void quantize_activations(const float* x, std::int64_t m, std::int64_t k, bool nibble_order,
                          Q8Activations& out, Isa isa = active_isa());

namespace detail {
/// AVX2 version of quantize_activations; `out` is already sized.
void quantize_activations_avx2(const float* x, Q8Activations& out);
/// Scalar quantization of block b of row r (also the AVX2 path's ragged tail).
void quantize_block(const float* x, std::int64_t r, std::int64_t b, Q8Activations& out);
}  // namespace detail

}  // namespace woq
