// The operations of a transformer outside its matrix products, rounded as
// llama.cpp's CPU backend rounds them (ggml c392e5094, ggml-cpu.c and
// llamafile/sgemm.cpp, built by GCC 12 for the CPU it runs on), so that woq
// computes llama.cpp's logits for the same GGUF file (Numerics::kGgml).
//
// ggml's vector code sums in lanes: 16 in its AVX-512 build, 8 in its AVX2
// build, and its exp (ggml_v_expf) differs between the two. Each function
// here takes the lane count of the build it reproduces (ggml_lanes(isa) for
// the running one); the scalar code computes every width's bits, the ISA
// kernels compute their own width's faster.
#pragma once

#include <cstdint>
#include <vector>

#include "core/cpu.h"
#include "kernels/attention.h"

namespace woq {

class ThreadPool;

/// The f32 lanes of the ggml build that `isa` matches: 16 for the AVX-512
/// ISAs, 8 for AVX2 and scalar (scalar reproduces the AVX2 build).
int ggml_lanes(Isa isa);

/// ggml_v_expf (an exp2 polynomial after Arm's optimized-routines, max error
/// 1.45 ulp + 0.5) of the `lanes`-wide build (16: AVX-512F, 8: AVX2 + FMA),
/// element by element. Throws woq::Error for other lane counts.
float ggml_expf(float x, int lanes);

/// ggml_rms_norm then ggml_mul: mean = (float)(Σ (double)(x·x rounded to float)) / n,
/// out = (x · (1 / sqrtf(mean + eps))) · weight. x, weight, out: [n]; out may alias x.
void ggml_rms_norm(const float* x, const float* weight, std::int64_t n, float eps, float* out);

/// ggml_rope_ext's angles for one position: theta_0 = pos, theta_{i+1} =
/// theta_i · theta_scale in float (theta_scale = powf(base, -2/head_dim)),
/// angle_i = freq_scale · (theta_i / freq_factors[i]) (rope_yarn without its
/// extrapolation mix), cos/sin by cosf/sinf. cos_sin: [head_dim] as (cos, sin) pairs.
struct GgmlRope {
  float theta_scale = 1.0f;
  float freq_scale = 1.0f;          ///< 1 / the linear scaling factor
  std::vector<float> freq_factors;  ///< (head_dim / 2) divisors (llama3's rope_freqs), or empty
  bool interleave = false;          ///< ggml's normal RoPE on permuted q/k rows (ggml_rope)
};
void ggml_rope_angles(const GgmlRope& rope, std::int64_t head_dim, std::int64_t pos, float* cos_sin);

/// Rotates `heads` vectors of head_dim, each in HF's rotate_half layout (pair i
/// is (i, i + head_dim/2)), by the angles of ggml_rope_angles, as GCC 12
/// compiles ggml's rotation in its `lanes`-wide build (measured against
/// libggml-cpu for head sizes 16 to 128): one fma each output,
/// x0' = fma(x0, cos, -(x1·sin)), x1' = fma(x0, sin, x1·cos), for every pair
/// of the NEOX mode and for the normal mode's pairs in its vector loop
/// (head_dim/2 rounded down to 4 with 16 lanes, to 2 with 8); its other pairs
/// x0·cos - x1·sin and x0·sin + x1·cos with every product rounded.
/// `interleave` writes pair i to (2i, 2i + 1): the layout of ggml's normal
/// (not NEOX) RoPE on a GGUF whose q/k rows llama.cpp's converter permuted, so
/// that attention's dot products then sum in ggml's order.
void ggml_rope(float* x, std::int64_t heads, std::int64_t head_dim, const float* cos_sin, bool interleave,
               int lanes);

/// gate[r, i] = silu(gate[r, i]) · up[r, i] for `rows` rows of n, silu(v) =
/// v / (1 + exp(-v)) as ggml_vec_silu_f32 computes each row: ggml_expf of
/// the build for the first n rounded down to `lanes`, libm's expf for the rest.
void ggml_silu_mul(float* gate, const float* up, std::int64_t rows, std::int64_t n, Isa isa = active_isa());
void ggml_silu_mul_reference(float* gate, const float* up, std::int64_t rows, std::int64_t n, int lanes);

/// The attention of llama.cpp's graph without flash attention, for prompt
/// batches (llamafile's tinyBLAS multiplies the probabilities with V): per
/// query head and position p = pos0 + t,
///   s_j = ggml_vec_dot_f32(q, k_j) · (1 / sqrt(head_dim)) for the keys j the
///         query sees (p - j < window, j <= p), four accumulators of `lanes`;
///   e_j = ggml_expf(s_j - max s), their sum in double of each `lanes`-chunk's
///         float sum (chunks from position 0);
///   out = Σ_j v_j · (e_j · (float)(1 / sum)), one lane per j mod lanes,
///         each lane a chain of fmas in position order, then the lanes summed.
/// llama.cpp multiplies by V so when its batch (ubatch) has two tokens or
/// more; for one token (decode) tinyBLAS declines and ggml_vec_dot_f32 sums
/// each output over its padded cache (n_kv = p + 1 rounded up to 32): four
/// accumulators of `lanes` over the first n_kv rounded down to 4·lanes
/// positions, then the rest one by one. `single_row_pass` (the forward pass
/// has one row in all) takes that order, so that token-by-token generation
/// gives llama-cli's logits too. Otherwise a query's result does not depend on
/// the batch it is in. Shapes, layouts and errors as causal_attention.
void ggml_causal_attention(const float* q, std::int64_t t_count, std::int64_t pos0, const AttentionShape& shape,
                           const KvTiles& kv, float* out, ThreadPool& pool, Isa isa = active_isa(),
                           bool single_row_pass = false);
/// The same in scalar code with `lanes` (8 or 16) lanes.
void ggml_causal_attention_reference(const float* q, std::int64_t t_count, std::int64_t pos0,
                                     const AttentionShape& shape, const KvTiles& kv, float* out, ThreadPool& pool,
                                     int lanes, bool single_row_pass = false);

}  // namespace woq
