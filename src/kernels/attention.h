// Causal scaled dot-product attention over a key/value cache in tiles of
// positions: query tiles x key tiles with an online softmax (FlashAttention,
// Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient Exact Attention
// with IO-Awareness", Algorithm 1), f32 accumulation.
#pragma once

#include <cstdint>
#include <span>

#include "core/cpu.h"

namespace woq {

class ThreadPool;
class Workspace;

/// Positions per key tile. Tiles start at multiples of it (absolute positions),
/// so that every query meets the same tiles whatever batch it is computed in.
inline constexpr std::int64_t kAttentionKeyTile = 32;

/// Heads and the window of one attention call.
struct AttentionShape {
  std::int64_t heads;     ///< query heads
  std::int64_t kv_heads;  ///< key/value heads; heads must be a multiple (GQA: head h reads kv head h / (heads / kv_heads))
  std::int64_t head_dim;
  std::int64_t window = 0;  ///< sliding window: a query at position i attends to keys j with i - j < window; 0 = all
};

/// Where the keys and values of one sequence (one layer) lie. Key tile b holds
/// positions [b·kAttentionKeyTile, (b+1)·kAttentionKeyTile): its rows are
/// `row_stride` floats apart from keys[b] on (values alike), each row
/// [kv_heads, head_dim]. Rows past the last position attended to are never read.
struct KvTiles {
  std::span<const float* const> keys;    ///< (tiles) first row of each key tile
  std::span<const float* const> values;  ///< (tiles)
  std::int64_t row_stride;               ///< floats from one position's row to the next (>= kv_heads · head_dim)
};

/// out = softmax(q·Kᵀ / √head_dim) · V per query head, causal: query row t is
/// at position pos0 + t and attends to positions [0, pos0 + t] (or the last
/// `window` of them). q, out: [t_count, heads · head_dim] row-major (out must
/// not alias q); kv must cover positions [0, pos0 + t_count).
///
/// Each query runs the key tiles it meets in position order with a running
/// maximum and sum (the online softmax) and the same operations whatever
/// t_count, pos0 (for the same position), the thread count or the ISA: the
/// result of a query is bit for bit the same computed alone (decode) or in any
/// batch (prefill), and on every ISA (the scalar kernel is the reference).
/// exp is a degree-6 polynomial of 2^x (Cephes' exp2f, ~2 ulp), not libm's.
/// Parallel over (tile of query tokens, kv head) jobs, early and late tiles
/// alternating so that contiguous chunks carry equal causal work.
///
/// Throws woq::Error when heads is not a positive multiple of kv_heads or
/// kv covers too few tiles.
///
/// Each thread's work buffer (transposed keys, scores) comes from its arena of
/// `ws` (slot kSlotAttention); the overload without one uses a temporary.
void causal_attention(const float* q, std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape,
                      const KvTiles& kv, float* out, ThreadPool& pool, Workspace& ws, Isa isa = active_isa());
void causal_attention(const float* q, std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape,
                      const KvTiles& kv, float* out, ThreadPool& pool, Isa isa = active_isa());

/// The errors of causal_attention (and ggml_causal_attention): throws woq::Error when heads is not a positive
/// multiple of kv_heads or kv covers too few tiles for positions [0, pos0 + t_count).
void check_attention_call(std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape, const KvTiles& kv);

}  // namespace woq
