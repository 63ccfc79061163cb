#include "kernels/bf16_activations.h"

#include <algorithm>
#include <bit>

#include "core/half.h"

namespace woq {

std::uint16_t round_to_bf16(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7f800000u) == 0) return static_cast<std::uint16_t>((bits >> 16) & 0x8000u);  // zero, subnormal
  return fp32_to_bf16(x);
}

void round_row_bf16(const float* x, std::int64_t n, std::uint16_t* out) {
  for (std::int64_t i = 0; i < n; ++i) out[i] = round_to_bf16(x[i]);
}

void round_activations_bf16(const float* x, std::int64_t m, std::int64_t k, Bf16Activations& out,
                            RoundRowBf16 round_row) {
  out.m = m;
  out.k = k;
  out.blocks = (k + kBf16Block - 1) / kBf16Block;
  const std::int64_t stride = out.stride();
  out.v.resize(static_cast<std::size_t>(m * stride));
  for (std::int64_t t = 0; t < m; ++t) {
    std::uint16_t* row = out.v.data() + t * stride;
    round_row(x + t * k, k, row);
    std::fill(row + k, row + stride, std::uint16_t{0});
  }
}

}  // namespace woq
