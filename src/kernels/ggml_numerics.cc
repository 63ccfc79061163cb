// ggml_numerics.h: RMSNorm and RoPE (one scalar implementation: ggml's are
// scalar or element-wise), the dispatch of SiLU and attention to the ISA
// kernels, and their scalar reference of both lane widths.
#include "kernels/ggml_numerics.h"

#include <math.h>  // sincosf (glibc)

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/ggml_numerics_tile.h"

namespace woq {
namespace {

void check_lanes(int lanes) {
  if (lanes != 8 && lanes != 16) fail("ggml numerics: {} lanes; ggml's x86 builds have 8 (AVX2) or 16 (AVX-512)", lanes);
}

const detail::GgmlKernels kGgmlScalar8 = {detail::ggml_attention_items<detail::GgmlScalar<8>>,
                                          detail::ggml_attention_jobs<detail::GgmlScalar<8>>,
                                          detail::ggml_silu_rows<detail::GgmlScalar<8>>};
const detail::GgmlKernels kGgmlScalar16 = {detail::ggml_attention_items<detail::GgmlScalar<16>>,
                                           detail::ggml_attention_jobs<detail::GgmlScalar<16>>,
                                           detail::ggml_silu_rows<detail::GgmlScalar<16>>};

const detail::GgmlKernels& scalar_kernels(int lanes) {
  check_lanes(lanes);
  return lanes == 16 ? kGgmlScalar16 : kGgmlScalar8;
}

const detail::GgmlKernels& kernels_of(Isa isa) {
  if (isa >= Isa::kAvx512) return detail::kGgmlAvx512;
  if (isa == Isa::kAvx2) return detail::kGgmlAvx2;
  return scalar_kernels(ggml_lanes(isa));
}

// One query row: its heads one by one; more: jobs of query tiles that share transposed keys and values.
void run_attention(const float* q, std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape,
                   const KvTiles& kv, float* out, ThreadPool& pool, const detail::GgmlKernels& k, bool single_row_pass) {
  check_attention_call(t_count, pos0, shape, kv);
  if (t_count < 1) return;
  if (single_row_pass && t_count != 1) fail("attention: a single-row pass of {} query rows", t_count);
  const detail::GgmlAttentionArgs args{q, out, t_count, pos0, shape, &kv, single_row_pass};
  if (t_count == 1) {
    pool.parallel_for(shape.heads, [&](std::int64_t begin, std::int64_t end) { k.items(args, begin, end); });
  } else {
    const std::int64_t tiles = (t_count + detail::kGgmlQueryTile - 1) / detail::kGgmlQueryTile;
    pool.parallel_for(tiles * shape.kv_heads, [&](std::int64_t begin, std::int64_t end) { k.jobs(args, begin, end); });
  }
}

}  // namespace

int ggml_lanes(Isa isa) { return isa >= Isa::kAvx512 ? 16 : 8; }

float ggml_expf(float x, int lanes) {
  check_lanes(lanes);
  return lanes == 16 ? detail::ggml_expf16(x) : detail::ggml_expf8(x);
}

void ggml_rms_norm(const float* x, const float* weight, std::int64_t n, float eps, float* out) {
  double sum = 0.0;
  for (std::int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const auto mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (std::int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

void ggml_rope_angles(const GgmlRope& rope, std::int64_t head_dim, std::int64_t pos, float* cos_sin) {
  float theta = static_cast<float>(pos);
  for (std::int64_t i = 0; i < head_dim / 2; ++i) {
    const float ff = rope.freq_factors.empty() ? 1.0f : rope.freq_factors[static_cast<std::size_t>(i)];
    const float angle = rope.freq_scale * (theta / ff);
    ::sincosf(angle, &cos_sin[2 * i + 1], &cos_sin[2 * i]);  // what GCC makes of ggml's cosf and sinf
    theta *= rope.theta_scale;
  }
}

void ggml_rope(float* x, std::int64_t heads, std::int64_t head_dim, const float* cos_sin, bool interleave,
               int lanes) {
  check_lanes(lanes);
  // The normal mode's vector loop rotates pairs in steps of 4 (16 lanes) or 2 (8 lanes) with fmaddsub; the
  // pairs left over take its SSE tail: two products, then a subtract and an add. NEOX fuses every pair.
  const std::int64_t half = head_dim / 2, step = lanes == 16 ? 4 : 2;
  const std::int64_t fused = interleave ? half / step * step : half;
  // Pair i's outputs go to (i, i + half), or to (2i, 2i + 1) when interleaved: written after the whole
  // head is read (at most 2^20 floats of head, config_limits).
  thread_local std::vector<float> rotated;
  rotated.resize(static_cast<std::size_t>(head_dim));
  for (std::int64_t h = 0; h < heads; ++h) {
    float* v = x + h * head_dim;
    for (std::int64_t i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float x0 = v[i], x1 = v[i + half];
      const bool vector = i < fused;
      rotated[static_cast<std::size_t>(interleave ? 2 * i : i)] = vector ? std::fma(x0, c, -(x1 * s)) : x0 * c - x1 * s;
      rotated[static_cast<std::size_t>(interleave ? 2 * i + 1 : i + half)] =
          vector ? std::fma(x0, s, x1 * c) : x0 * s + x1 * c;
    }
    std::copy(rotated.begin(), rotated.end(), v);
  }
}

void ggml_silu_mul_reference(float* gate, const float* up, std::int64_t rows, std::int64_t n, int lanes) {
  scalar_kernels(lanes).silu_rows(gate, up, 0, rows, n);
}

void ggml_silu_mul(float* gate, const float* up, std::int64_t rows, std::int64_t n, Isa isa) {
  kernels_of(isa).silu_rows(gate, up, 0, rows, n);
}

void ggml_causal_attention_reference(const float* q, std::int64_t t_count, std::int64_t pos0,
                                     const AttentionShape& shape, const KvTiles& kv, float* out, ThreadPool& pool,
                                     int lanes, bool single_row_pass) {
  run_attention(q, t_count, pos0, shape, kv, out, pool, scalar_kernels(lanes), single_row_pass);
}

void ggml_causal_attention(const float* q, std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape,
                           const KvTiles& kv, float* out, ThreadPool& pool, Isa isa, bool single_row_pass) {
  run_attention(q, t_count, pos0, shape, kv, out, pool, kernels_of(isa), single_row_pass);
}

}  // namespace woq
