#include "kernels/q8_activations.h"

#include <algorithm>
#include <cmath>

namespace woq {

namespace {

// Position of value i (0..31) inside a block stored in nibble order.
std::int64_t nibble_slot(std::int64_t i) { return (i % 2 == 0) ? i / 2 : 16 + i / 2; }

}  // namespace

namespace detail {

void quantize_block(const float* x, std::int64_t r, std::int64_t b, Q8Activations& out) {
  const float* xb = x + r * out.k + b * kQ8Block;
  const std::int64_t n = std::min(kQ8Block, out.k - b * kQ8Block);
  float amax = 0.0f;
  for (std::int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(xb[i]));
  const float d = amax / 127.0f;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  std::int8_t* qb = out.q.data() + (r * out.blocks + b) * kQ8Block;
  for (std::int64_t i = 0; i < n; ++i)
    qb[out.nibble_order ? nibble_slot(i) : i] = static_cast<std::int8_t>(std::nearbyint(xb[i] * id));
  out.d[static_cast<std::size_t>(r * out.blocks + b)] = d;
}

}  // namespace detail

void quantize_activations(const float* x, std::int64_t m, std::int64_t k, bool nibble_order,
                          Q8Activations& out, Isa isa) {
  out.m = m;
  out.k = k;
  out.blocks = (k + kQ8Block - 1) / kQ8Block;
  out.nibble_order = nibble_order;
  out.q.assign(static_cast<std::size_t>(m * out.blocks * kQ8Block), 0);
  out.d.resize(static_cast<std::size_t>(m * out.blocks));
  if (isa == Isa::kAvx2) {
    detail::quantize_activations_avx2(x, out);
    return;
  }
  for (std::int64_t r = 0; r < m; ++r)
    for (std::int64_t b = 0; b < out.blocks; ++b) detail::quantize_block(x, r, b, out);
}

}  // namespace woq
