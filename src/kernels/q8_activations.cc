#include "kernels/q8_activations.h"

#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>

#include "core/thread_pool.h"

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
  const float id = inv_scale(127.0f, amax);
  int sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto v = static_cast<std::int8_t>(std::nearbyint(xb[i] * id));
    q[b * kQ8Block + i] = v;
    sum += v;
  }
  out.d[static_cast<std::size_t>(r * out.padded + b)] = d;
  out.qsum[static_cast<std::size_t>(r * out.padded + b)] = sum;
}

void quantize_int16_unit(const float* x, std::int64_t r, std::int64_t j0, Q8Activations& out) {
  const float* xb = x + r * out.k + j0;
  const std::int64_t n = std::min(kInt16ScaleBlocks * kQ8Block, out.k - j0);
  const std::int64_t b0 = j0 / kQ8Block, b1 = (j0 + n + kQ8Block - 1) / kQ8Block;
  float amax = 0.0f;
  bool finite = true;
  for (std::int64_t i = 0; i < n; ++i) {
    finite = finite && std::isfinite(xb[i]);
    amax = std::max(amax, std::fabs(xb[i]));
  }
  const float d = finite ? amax / static_cast<float>(kInt16Max) : std::numeric_limits<float>::quiet_NaN();
  for (std::int64_t b = b0; b < b1; ++b) out.d[static_cast<std::size_t>(r * out.padded + b)] = d;
  if (!finite) return;  // zeros (as reset left them) and a NaN scale: every output they reach is NaN
  const float id = inv_scale(static_cast<float>(kInt16Max), amax);
  std::int8_t* hi = out.q.data() + r * out.padded * kQ8Block + j0;
  std::int8_t* lo = out.lo.data() + r * out.padded * kQ8Block + j0;
  for (std::int64_t i = 0; i < n; ++i) {
    const int v = std::clamp(static_cast<int>(std::nearbyint(xb[i] * id)), -kInt16Max, kInt16Max);
    const int h = (v + 127 + 255 * 128) / 255 - 128;  // floor((v + 127) / 255), the dividend kept positive
    hi[i] = static_cast<std::int8_t>(h);
    lo[i] = static_cast<std::int8_t>(v - 255 * h);
    out.qsum[static_cast<std::size_t>(r * out.padded + (j0 + i) / kQ8Block)] += v;
  }
}

}  // namespace detail

namespace {

// Sizes `out` for m rows of k values and zeroes it; `wide`: with the low parts of int16 activations.
void reset(std::int64_t m, std::int64_t k, bool wide, Q8Activations& out) {
  out.m = m;
  out.k = k;
  out.blocks = (k + kQ8Block - 1) / kQ8Block;
  out.padded = (out.blocks + 7) / 8 * 8;
  out.wide = wide;
  out.scale_blocks = 1;
  // int16 activations: one block more at the end, which AMX's tiles of two blocks may read (and multiply
  // by zeros) past the last row's last block.
  const std::int64_t slack = wide ? kQ8Block : 0;
  out.q.assign(static_cast<std::size_t>(m * out.padded * kQ8Block + slack), 0);
  out.lo.assign(wide ? out.q.size() : 0, 0);
  out.d.assign(static_cast<std::size_t>(m * out.padded), 0.0f);
  out.qsum.assign(static_cast<std::size_t>(m * out.padded), 0);
}

// fn(r0, r1) over the rows of an m x k batch: split over the pool when there is enough work for it (a
// decode step's one row stays on the calling thread).
void over_rows(std::int64_t m, std::int64_t k, ThreadPool* pool,
               const std::function<void(std::int64_t, std::int64_t)>& fn) {
  constexpr std::int64_t kMinValues = 16384;  // per task
  if (pool == nullptr || m * k < 2 * kMinValues) return fn(0, m);
  pool->parallel_for(m, fn, std::max<std::int64_t>(1, kMinValues / std::max<std::int64_t>(k, 1)));
}

}  // namespace

void quantize_activations(const float* x, std::int64_t m, std::int64_t k, Q8Activations& out, Isa isa,
                          ThreadPool* pool) {
  reset(m, k, false, out);
  const auto quantize = detail::kernels(isa).quantize_q8;
  over_rows(m, k, pool, [&](std::int64_t r0, std::int64_t r1) { quantize(x, out, r0, r1); });
}

void quantize_activations_int16(const float* x, std::int64_t m, std::int64_t k, Q8Activations& out, Isa isa,
                                ThreadPool* pool) {
  reset(m, k, true, out);
  out.scale_blocks = kInt16ScaleBlocks;
  const auto quantize = detail::kernels(isa).quantize_int16;
  over_rows(m, k, pool, [&](std::int64_t r0, std::int64_t r1) { quantize(x, out, r0, r1); });
}

}  // namespace woq
