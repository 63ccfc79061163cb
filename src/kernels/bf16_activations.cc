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

void round_activations_bf16(const float* x, std::int64_t m, std::int64_t k, Bf16Activations& out) {
  out.m = m;
  out.k = k;
  out.blocks = (k + kBf16Block - 1) / kBf16Block;
  out.rows = (m + kBf16RowPad - 1) / kBf16RowPad * kBf16RowPad;
  const std::int64_t stride = out.stride();
  out.v.assign(static_cast<std::size_t>(out.rows * stride), 0);
  for (std::int64_t t = 0; t < m; ++t) {
    std::uint16_t* row = out.v.data() + t * stride;
    const float* in = x + t * k;
    for (std::int64_t i = 0; i < k; ++i) row[i] = round_to_bf16(in[i]);
  }
}

}  // namespace woq
