// Activations rounded to bfloat16 for the bf16 path of matmul
// (Activations::kBf16): what AVX512_BF16's vdpbf16ps and AMX-BF16's
// tdpbf16ps read.
#pragma once

#include <cstdint>
#include <vector>

namespace woq {

/// Values per block of the bf16 activations (one AMX tile row of 64 bytes, one
/// block of the interleaved weight layout).
inline constexpr std::int64_t kBf16Block = 32;

/// m rows of K activations as bfloat16 bits, row t at v[t * stride()], values
/// past K (up to blocks * 32) zero, so that tile kernels may read whole blocks
/// of 32 inputs.
struct Bf16Activations {
  std::int64_t m = 0;
  std::int64_t k = 0;
  std::int64_t blocks = 0;  ///< ceil(k / 32)
  std::vector<std::uint16_t> v;  ///< (m, blocks * 32)

  std::int64_t stride() const { return blocks * kBf16Block; }
  const std::uint16_t* row(std::int64_t t) const { return v.data() + t * stride(); }
};

/// x rounded to bfloat16 the way VCVTNEPS2BF16 does: to nearest even,
/// subnormal inputs to a zero of their sign, NaN quieted (Intel SDM vol. 2).
std::uint16_t round_to_bf16(float x);

/// out[i] = round_to_bf16(x[i]) for i < n: one ISA's kernel (round_row_bf16 below is the scalar one).
using RoundRowBf16 = void (*)(const float* x, std::int64_t n, std::uint16_t* out);

/// The scalar RoundRowBf16.
void round_row_bf16(const float* x, std::int64_t n, std::uint16_t* out);

/// Rounds x [m, k] (row-major fp32) into `out` (its buffer reused when large
/// enough), row by row with `round_row` (every ISA's gives round_to_bf16's bits).
void round_activations_bf16(const float* x, std::int64_t m, std::int64_t k, Bf16Activations& out,
                            RoundRowBf16 round_row = round_row_bf16);

}  // namespace woq
