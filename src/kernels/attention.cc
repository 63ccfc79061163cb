// causal_attention: the jobs, their order and the ISA dispatch; the scalar
// (reference) instance of the tile kernel (attention_tile.h).
#include "kernels/attention.h"

#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/attention_tile.h"
#include "kernels/workspace.h"

namespace woq {
namespace detail {
namespace {

template <>
void transpose_keys<Lane1>(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt) {
  for (std::int64_t j = 0; j < n; ++j)
    for (std::int64_t i = 0; i < d; ++i) kt[i * kT + j] = k[j * stride + i];
  for (std::int64_t i = 0; i < d; ++i) std::fill(kt + i * kT + n, kt + (i + 1) * kT, 0.0f);
}

}  // namespace

void attention_job_scalar(const AttentionJob& job) { run_attention_job<Lane1>(job); }

}  // namespace detail

void causal_attention(const float* q, std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape,
                      const KvTiles& kv, float* out, ThreadPool& pool, Isa isa) {
  Workspace ws;
  causal_attention(q, t_count, pos0, shape, kv, out, pool, ws, isa);
}

void check_attention_call(std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape, const KvTiles& kv) {
  if (shape.kv_heads < 1 || shape.heads < 1 || shape.heads % shape.kv_heads != 0 || shape.head_dim < 1)
    fail("attention: {} query heads, {} kv heads and head_dim {} (heads must be a positive multiple of kv_heads)",
         shape.heads, shape.kv_heads, shape.head_dim);
  if (t_count < 1) return;
  const std::int64_t tiles_needed = (pos0 + t_count + kAttentionKeyTile - 1) / kAttentionKeyTile;
  if (static_cast<std::int64_t>(kv.keys.size()) < tiles_needed ||
      static_cast<std::int64_t>(kv.values.size()) < tiles_needed)
    fail("attention: positions [0, {}) need {} key/value tiles, got {} and {}", pos0 + t_count, tiles_needed,
         kv.keys.size(), kv.values.size());
}

void causal_attention(const float* q, std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape,
                      const KvTiles& kv, float* out, ThreadPool& pool, Workspace& ws, Isa isa) {
  check_attention_call(t_count, pos0, shape, kv);
  if (t_count < 1) return;
  void (*run_job)(const detail::AttentionJob&) = isa >= Isa::kAvx512 ? detail::attention_job_avx512
                                                 : isa == Isa::kAvx2  ? detail::attention_job_avx2
                                                                      : detail::attention_job_scalar;
  const std::int64_t group = shape.heads / shape.kv_heads;
  const std::int64_t tiles = (t_count + detail::kAttentionQueryTile - 1) / detail::kAttentionQueryTile;
  // A job per (query tile, kv head) shares each transposed key tile among the
  // tile's tokens and the group's heads; when that leaves threads idle (decode
  // with few kv heads), a job per head. Either way each query's arithmetic is the same.
  const std::int64_t parts = tiles * shape.kv_heads >= 4 * pool.size() ? 1 : group;
  const std::int64_t heads_per_job = group / parts;
  const std::int64_t per_tile = shape.kv_heads * parts;
  ws.fit(pool.size());
  pool.parallel_for_threads(tiles * per_tile, [&](int thread, std::int64_t begin, std::int64_t end) {
    float* work = ws.arena(thread).get<float>(
        kSlotAttention, detail::attention_work_floats(shape.head_dim, detail::kAttentionQueryTile * heads_per_job));
    for (std::int64_t j = begin; j < end; ++j) {
      // Causal work grows with the tile: jobs alternate between early and late
      // tiles (0, last, 1, last - 1, ...) so that contiguous chunks carry equal work.
      const std::int64_t u = j / per_tile;
      const std::int64_t tile = u % 2 == 0 ? u / 2 : tiles - 1 - u / 2;
      const std::int64_t h0 = (j % per_tile) * heads_per_job;
      const std::int64_t t0 = tile * detail::kAttentionQueryTile;
      const detail::AttentionJob job{.q = q,
                                     .out = out,
                                     .q_stride = shape.heads * shape.head_dim,
                                     .head_dim = shape.head_dim,
                                     .t0 = t0,
                                     .tokens = std::min(detail::kAttentionQueryTile, t_count - t0),
                                     .pos0 = pos0,
                                     .h0 = h0,
                                     .h_count = heads_per_job,
                                     .kvh = h0 / group,
                                     .window = shape.window,
                                     .kv = &kv,
                                     .work = work};
      run_job(job);
    }
  });
}

}  // namespace woq
