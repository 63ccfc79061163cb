#include "kernels/q8_activations.h"

#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace woq {

namespace detail {

void quantize_block(const float* x, std::int64_t r, std::int64_t b, Q8Activations& out) {
  const float* xb = x + r * out.k + b * kQ8Block;
  const std::int64_t n = std::min(kQ8Block, out.k - b * kQ8Block);
  float amax = 0.0f;
  bool finite = true;
  for (std::int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(xb[i]);
    amax = std::max(amax, std::fabs(xb[i]));
  }
  std::int8_t* q = out.q.data() + r * out.padded * kQ8Block;
  if (!finite) {  // every output this block reaches becomes NaN, on every ISA
    for (std::int64_t i = 0; i < n; ++i) q[b * kQ8Block + i] = 0;
    out.d[static_cast<std::size_t>(r * out.padded + b)] = std::numeric_limits<float>::quiet_NaN();
    out.qsum[static_cast<std::size_t>(r * out.padded + b)] = 0;
    return;
  }
  const float d = amax / 127.0f;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto v = static_cast<std::int8_t>(std::nearbyint(xb[i] * id));
    q[b * kQ8Block + i] = v;
    sum += v;
  }
  out.d[static_cast<std::size_t>(r * out.padded + b)] = d;
  out.qsum[static_cast<std::size_t>(r * out.padded + b)] = sum;
}

}  // namespace detail

void quantize_activations(const float* x, std::int64_t m, std::int64_t k, Q8Activations& out, Isa isa) {
  out.m = m;
  out.k = k;
  out.blocks = (k + kQ8Block - 1) / kQ8Block;
  out.padded = (out.blocks + 7) / 8 * 8;
  out.q.assign(static_cast<std::size_t>(m * out.padded * kQ8Block), 0);
  out.d.assign(static_cast<std::size_t>(m * out.padded), 0.0f);
  out.qsum.assign(static_cast<std::size_t>(m * out.padded), 0);
  detail::kernels(isa).quantize_q8(x, out);
}

}  // namespace woq
