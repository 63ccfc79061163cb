// The Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3) in Hugging Face
// conventions, with its linear layers in any LowBit format.
//
// Forward pass, per layer (Touvron et al. 2023, "Llama 2"; HF modeling_llama.py):
//   q, k, v = q_proj(RMSNorm(x)) + bq, k_proj(..) + bk, v_proj(..) + bv   (biases: Qwen2)
//   q, k = RMSNorm_head(q), RMSNorm_head(k)                                 (each head: Qwen3)
//   h = x + o_proj(Attention(RoPE(q), RoPE(k), v)) + bo                     (window: Mistral, Qwen2)
//   x = h + down_proj(silu(gate_proj(RMSNorm(h))) * up_proj(RMSNorm(h)))
// then a final RMSNorm and lm_head (tied to the embedding when the config says so).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/progress.h"
#include "core/ranks.h"
#include "core/thread_pool.h"
#include "formats/kquant_mix.h"
#include "formats/low_bit.h"
#include "io/hf_config.h"
#include "kernels/ggml_numerics.h"
#include "model/kv_cache.h"
#include "model/quant_plan.h"

namespace woq {

class Workspace;

/// Weights of one decoder layer. Shapes are [out, in].
struct LayerWeights {
  std::vector<float> attn_norm;  ///< (hidden)
  QuantMatrix wq;                ///< (q_dim, hidden)
  QuantMatrix wk;                ///< (kv_dim, hidden)
  QuantMatrix wv;                ///< (kv_dim, hidden)
  QuantMatrix wo;                ///< (hidden, q_dim)
  std::vector<float> bq, bk, bv;  ///< (q_dim), (kv_dim), (kv_dim); empty without attention_bias
  std::vector<float> bo;         ///< (hidden); empty without o_bias
  std::vector<float> q_norm, k_norm;  ///< (head_dim) each; empty without qk_norm
  std::vector<float> mlp_norm;   ///< (hidden)
  QuantMatrix gate;              ///< (intermediate, hidden)
  QuantMatrix up;                ///< (intermediate, hidden)
  QuantMatrix down;              ///< (hidden, intermediate)

  /// The linear of `role` (wq for LinearRole::kQ, ...).
  QuantMatrix& linear(LinearRole role);
  const QuantMatrix& linear(LinearRole role) const;
  /// The bias of `role` (bq for LinearRole::kQ, ...). Throws woq::Error for an MLP role (no bias).
  std::vector<float>& bias(LinearRole role);
};

/// [rows, cols] of block linear `role` under config `c` (kBlockLinears' Dim).
inline std::pair<std::int64_t, std::int64_t> block_linear_shape(const ModelConfig& c, LinearRole role) {
  return {c.size(linear_spec(role).rows), c.size(linear_spec(role).cols)};
}

/// How to load a checkpoint.
struct LoadOptions {
  QuantSpec linear;  ///< format of q/k/v/o/gate/up/down; embeddings and norms keep theirs
  /// Format of lm_head; unset keeps the checkpoint's precision. When the
  /// embeddings are tied, a converted lm_head is a separate copy (the
  /// embedding lookup keeps full precision).
  std::optional<QuantSpec> lm_head;
  /// How integer-format matrices (converted or imported) multiply their
  /// inputs; unset: each format's default_activations.
  std::optional<Activations> activations;
  /// Called with (decoder blocks loaded, blocks) after each block; may be null.
  Progress progress;
  /// False: the decoder blocks' linear layers are not read (block_linear
  /// gives empty matrices), for calibration, which computes them itself
  /// (forward_block's `compute`) from weights it streams one block at a time.
  bool block_linears = true;
  /// Set when `linear` is the default format, not one the user asked for: then
  /// the float block linears of a GGUF file whose other block linears are
  /// quantized (the F16 layers llama-quantize left in a Q8_0 or Q4_K_M file)
  /// run as stored, as llama.cpp runs them; a file of float linears only is
  /// still converted to `linear`, as a Hugging Face directory is.
  bool linear_is_default = false;
  /// A llama-quantize K-quant file type (Q4_K_M, ...): when set, each float
  /// block linear converted takes the type its rule gives that layer
  /// (kquant::mix_type; the q5_0 / iq4_nl / q8_0 fallbacks as the sym_int8
  /// group 32 their blocks are, q5_1 as its own blocks), and `linear`
  /// only names the file type's base format. A float token_embd and output
  /// (lm_head) take their rule's types too, as in the file llama-quantize
  /// writes, unless `lm_head` is set.
  const kquant::Mix* mix = nullptr;
  /// A quantization plan (model/quant_plan.h): when set, each float block
  /// linear converted takes the plan's format for it (`linear` is the plan's
  /// base); load() throws woq::Error when the plan names layers the model lacks.
  std::shared_ptr<const QuantPlan> plan = nullptr;
  /// A pipeline stage's share of the model: the decoder blocks [first_block, last_block) (-1: to the last);
  /// the other blocks are not read. The embeddings are read only with block 0 (and, tied to lm_head, with the
  /// last block), the final norm and lm_head only with the last block. load() throws woq::Error for an empty
  /// or out-of-range share.
  std::int64_t first_block = 0;
  std::int64_t last_block = -1;
  /// The rounding outside the matrix products (core/numerics.h); unset: the checkpoint's (ggml for a GGUF file).
  std::optional<Numerics> numerics = std::nullopt;
};

/// What loading did, for the one line the CLI prints.
struct LoadReport {
  Numerics numerics = Numerics::kWoq;     ///< the model's rounding outside the matrix products
  std::int64_t linear_matrices = 0;       ///< matrices stored in `linear`'s format
  std::uint64_t linear_source_bytes = 0;  ///< their size in the checkpoint's dtype
  std::uint64_t linear_bytes = 0;         ///< their size after conversion
  /// Block linears of a quantized GGUF kept in their float dtype (LoadOptions::linear_is_default).
  std::int64_t linear_kept_float = 0;
  std::uint64_t linear_kept_float_bytes = 0;  ///< their size
  /// Labels (LinearSpec::label: "q", ..., "down") of the linears converted to `linear`'s format.
  std::vector<std::string> converted_roles;
  std::uint64_t other_bytes = 0;          ///< embeddings, norms, and lm_head when kept at source precision
  /// A GGUF embedding or lm_head of a ggml type woq lacks was converted to the closest woq format (a warning says which).
  bool other_converted = false;
  std::uint64_t lm_head_bytes = 0;        ///< lm_head when converted by LoadOptions::lm_head, else 0
  std::uint64_t embeddings_bytes = 0;     ///< the embeddings when converted by the plan's model.embed_tokens, else 0
  /// Embeddings / lm_head converted by LoadOptions::mix's rule, e.g. {"token_embd q3_K", "output q6_K"}.
  std::vector<std::string> mixed_other;
  std::string source_dtype;               ///< dtype of the linear weights in the checkpoint
  /// Pre-quantized checkpoints (GPTQ, compressed-tensors, GGUF Q4_0/Q8_0): linear layers used
  /// as stored (GPTQ/Q4_0/Q8_0 repacked into woq's layout, K-quant blocks copied; never re-quantized).
  std::int64_t linear_imported = 0;
  std::uint64_t linear_imported_bytes = 0;  ///< their size in woq's layout
  std::string imported_format;              ///< QuantizationConfig::describe(); empty if none
  /// woq formats of the block linear layers as loaded, e.g. "asym_int4", or
  /// "sym_int4, sym_int8" for a GGUF that mixes types.
  std::string low_bit;
  /// What the block linear layers are, from the checkpoint's own metadata and
  /// the load options: e.g. "GPTQ v1 4-bit asym group_size 128 (woq 0.1.0,
  /// gptq, damp_percent 0.01)", "GGUF Q4_0 (as sym_int4 group 32)",
  /// "sym_int4 (group_size 32, full range) from F32".
  std::string label;
  /// What the converted block linears became: describe(linear), "Q4_K_M
  /// (q4_K, q6_K)" or "plan FILE (sym_int4 g32 x20, sym_int8 per channel x15)".
  std::string conversion;
  /// The linear layers are stored quantized in the checkpoint (GPTQ,
  /// compressed-tensors, GGUF Q4_0/Q8_0): there is no float original inside.
  bool prequantized() const { return linear_imported > 0; }
  /// What the integer-format matrices multiply their inputs as, e.g.
  /// "sym_int4 int8, sym_int8 f32"; empty when there are none.
  std::string activations;
  bool rounded_activations = false;  ///< some matrix rounds its inputs (int8, int16 or bf16 activations)
  double repack_seconds = 0;                ///< wall time of reading and repacking them
  std::vector<std::string> warnings;        ///< oddities of the checkpoint that were tolerated
  double seconds = 0;                     ///< wall time of loading and quantizing
};

/// Sets how the matrix `w` multiplies its inputs, `requested` or else its
/// format's default (int8 for a GGUF file's blocks, `ggml_blocks`), and lays
/// it out for those kernels (prepare_for_kernels), as load() does. A group
/// size the integer kernels cannot take falls back to f32 activations: the
/// returned warning says so (else empty). Float formats are left as they are.
/// Throws woq::Error for a K-quant with activations other than int8 or f32.
std::string ready_for_kernels(QuantMatrix& w, std::optional<Activations> requested, bool ggml_blocks,
                              ThreadPool& pool);

/// A loaded model. One caller at a time: passes share the model's thread pool,
/// kernel workspace and activation buffers (Python's Model holds a mutex, the
/// server runs one engine thread).
class LlamaModel {
 public:
  /// Loads DIR (config.json, generation_config.json, model.safetensors or
  /// sharded) and converts the linear layers of every block per `options`.
  /// Linear layers of a pre-quantized checkpoint (quantization_config in
  /// config.json: GPTQ, AWQ or compressed-tensors pack-quantized) keep their
  /// stored integers; `options.linear` applies only to float layers.
  /// Throws woq::Error naming the file and tensor for missing tensors, wrong
  /// shapes, non-float dtypes, non-finite weights and the config errors of
  /// read_model_config.
  static std::unique_ptr<LlamaModel> load(const std::string& dir, const LoadOptions& options,
                                          ThreadPool& pool, LoadReport* report = nullptr);

  const ModelConfig& config() const { return config_; }

  /// With ggml numerics a pass of a single row takes llama.cpp's one-token order (ggml_causal_attention's
  /// single_row_pass), so that token-by-token generation gives llama-cli's logits; `on` makes every pass take
  /// the batched order instead, so that a sequence's results do not depend on the rows beside it (the server).
  /// No effect with woq's numerics, which are batch-invariant anyway.
  void set_batch_invariant(bool on) { batch_invariant_ = on; }

  /// Runs later forward passes on `pool` (e.g. to benchmark several thread
  /// counts without reloading). The pool must outlive its use.
  void set_thread_pool(ThreadPool& pool) { pool_ = &pool; }
  /// Makes this model one stage of a pipeline over `ranks`: rank r holds the blocks LoadOptions::first_block..
  /// last_block gave it, rank r - 1 the blocks before, rank r + 1 those after. Each forward pass then takes the
  /// hidden states from rank r - 1 (rank 0: embeds the tokens), runs its blocks (its KV caches have room for every
  /// block; only its own are written), hands the states to rank r + 1, and every rank returns the logits the last rank computes (one
  /// process's, bit for bit). Every rank must make the same forward calls in the same order. `ranks` must
  /// outlive the model's use. Throws woq::Error when the stages do not fit together.
  void set_pipeline(Ranks& ranks);

  /// A cache for up to `capacity` tokens of the blocks this model runs (all, or
  /// a pipeline stage's); throws woq::Error if capacity is not in
  /// [1, context_limit()].
  KVCache make_cache(std::int64_t capacity) const;
  /// Bytes of weights one decode step reads: every linear layer, the norms,
  /// lm_head and one embedding row.
  std::uint64_t weight_bytes_per_token() const;

  /// Longest sequence the model supports: max_position_embeddings.
  std::int64_t context_limit() const;

  /// Runs `tokens` at positions [cache.size(), cache.size() + T) and appends
  /// their keys/values to the cache. Writes logits to `logits`: [T, vocab]
  /// when `all_logits`, else [1, vocab] for the last token. Throws woq::Error
  /// for an empty input, a token id outside [0, vocab) or a full cache.
  void forward(std::span<const std::int32_t> tokens, KVCache& cache, bool all_logits,
               std::vector<float>& logits);

  /// One batched pass over several sequences (continuous batching, with
  /// chunked prefill): sequence i continues caches[i] with the next rows[i]
  /// tokens of `tokens` (the sequences' tokens one after another; rows[i] >= 1:
  /// a decode step's token or a chunk of a prompt). Writes logits [n, vocab],
  /// row i after sequence i's last token. Each row equals what forward() gives
  /// that sequence alone, bit for bit (the kernels' sums do not depend on the
  /// batch). Throws woq::Error for a size mismatch, a cache given twice, a bad
  /// id or a full cache.
  void forward_batch(std::span<const std::int32_t> tokens, std::span<const std::int64_t> rows,
                     std::span<KVCache* const> caches, std::vector<float>& logits);

  // Block-by-block access, for calibration (GPTQ).

  /// Receives the input x [rows, K] of block linear `role` just before it runs.
  using LinearObserver = std::function<void(LinearRole role, const float* x, std::int64_t rows)>;
  /// Token embeddings: x [tokens.size(), hidden]. Throws woq::Error for an id outside [0, vocab).
  void embed(std::span<const std::int32_t> tokens, float* x) const;
  /// Computes y [rows, N] = x [rows, K] W^T for block linear `role` in place of the model's own weights.
  using LinearCompute = std::function<void(LinearRole role, const float* x, std::int64_t rows, float* y)>;
  /// Runs decoder block `layer` in place on the hidden states x [T, hidden] of
  /// one sequence at positions [0, T) (with its own KV), calling `observe`
  /// (when set) before each linear; with `compute` set, the linears are
  /// computed by it (the model's norms, biases, RoPE and attention stay).
  /// Its KV cache stays allocated for the next call with the same T, its
  /// activations (shared with forward) for any T up to the largest so far
  /// (fresh pages cost a calibration forward ~10 %). Throws woq::Error for a
  /// bad layer or T.
  void forward_block(std::int64_t layer, float* x, std::int64_t t_count, const LinearObserver& observe,
                     const LinearCompute& compute = nullptr);
  /// forward_block on several sequences in one pass: x [sum of lengths, hidden] holds them one after another,
  /// sequence i's lengths[i] rows at positions [0, lengths[i]) with its own KV; `observe` and `compute` see
  /// all rows at once. Each row equals what forward_block gives its sequence alone, bit for bit (the kernels'
  /// sums do not depend on the batch); the linears read their weights once per pass, not once per sequence.
  /// `skip` (empty, or one count per sequence in [0, lengths[i]]): sequence i's first skip[i] rows give their
  /// keys and values but go no further (no query, attention or MLP; their rows of x are left as they were),
  /// for callers that need only the later rows' outputs (scoring the last block); the other rows' outputs
  /// are the same bits, and `observe` / `compute` see the rows each linear runs on.
  /// Throws woq::Error for a bad layer, no sequences, a bad length or skip.
  void forward_block(std::int64_t layer, float* x, std::span<const std::int64_t> lengths,
                     const LinearObserver& observe, const LinearCompute& compute = nullptr,
                     std::span<const std::int64_t> skip = {});
  /// Logits [rows, vocab] of hidden states x [rows, hidden] that have left the last block (forward_block's
  /// output): the final RMSNorm and lm_head, bit for bit the rows forward() gives (the kernels' sums do not
  /// depend on the batch). Throws woq::Error for rows < 1.
  void head(const float* x, std::int64_t rows, std::vector<float>& logits);
  /// Linear `role` of block `layer`, to inspect or replace. Throws woq::Error for a bad layer.
  QuantMatrix& block_linear(std::int64_t layer, LinearRole role);
  /// The matrix lm_head multiplies by (vocab, hidden): lm_head, or the embeddings when tied.
  const QuantMatrix& output_matrix() const { return lm_head_ ? *lm_head_ : embed_; }
  /// lm_head when it is its own matrix (vocab, hidden; untied, or a tied model's copy loaded with
  /// LoadOptions::lm_head), to inspect or replace; nullptr when the embeddings serve as lm_head (or another
  /// pipeline rank holds it).
  QuantMatrix* untied_lm_head() { return lm_head_.get(); }
  /// The embeddings (vocab, hidden; rows looked up by embed()), to inspect or replace; also lm_head when tied.
  QuantMatrix& embeddings() { return embed_; }

  ~LlamaModel();

 private:
  struct Scratch;
  struct BlockPass;  ///< forward_block's KV cache, kept for the next call of the same length
  /// `rows` consecutive rows of a pass continuing the sequence in `cache` at pos0.
  struct Segment {
    KVCache* cache;
    std::int64_t pos0;
    std::int64_t rows;
    std::int64_t skip = 0;  ///< leading rows that give keys and values only (forward_block's skip)
  };
  void block(std::int64_t layer, float* x, std::span<const Segment> segments, std::int64_t cache_layer,
             Scratch& scratch, const LinearObserver* observe, const LinearCompute* compute = nullptr);
  /// A micro-batch of a pass: its tokens (its segments' rows in order) and the rows whose logits it gives.
  struct Part {
    std::span<const std::int32_t> tokens;
    std::vector<Segment> segments;
    std::vector<std::int64_t> logit_rows;
  };
  /// The pass of `tokens` (the segments' rows in order) as run() takes it: one part, or in a pipeline
  /// micro-batches of about 1/(4 · ranks) of the rows (at least kMinMicroBatch; a segment may be cut between
  /// two), giving the logits of each segment's last row, or of every row with `all_logits` (one part).
  std::vector<Part> micro_batches(std::span<const std::int32_t> tokens, std::span<const Segment> segments,
                                  bool all_logits) const;
  /// Embeds each part's tokens, runs every block on it (a pipeline stage: hands it on as soon as it is done)
  /// and writes logits [all parts' logit rows, vocab], in order (a pipeline: computed by the last rank and
  /// broadcast once, after the last part). Throws woq::Error for a token id outside [0, vocab), on every rank
  /// before any part runs.
  void run(std::span<const Part> parts, std::vector<float>& logits);
  /// The final RMSNorm and lm_head of rows `logit_rows` of x [T, hidden], into logits [logit_rows.size(), vocab].
  void final_logits(const float* x, std::span<const std::int64_t> logit_rows, std::vector<float>& logits);
  LlamaModel(ModelConfig config, ThreadPool& pool);
  /// pass_rows: the rows of the whole forward pass (ggml numerics follow llama.cpp's one-token batches).
  void attention(const float* q, std::int64_t t_count, std::int64_t pos0, std::int64_t cache_layer,
                 std::int64_t window, KVCache& cache, float* out, std::int64_t pass_rows);
  /// RMSNorm of one vector of n with config_.numerics' rounding.
  void norm(const float* x, const float* weight, std::int64_t n, float* out) const;
  /// RoPE of `heads` vectors at position pos with config_.numerics' rounding (cos_sin: its buffer).
  void rotate(float* x, std::int64_t heads, std::int64_t pos, std::vector<float>& cos_sin) const;

  ModelConfig config_;
  ThreadPool* pool_;
  QuantMatrix embed_;                     ///< (vocab, hidden), source precision
  std::unique_ptr<QuantMatrix> lm_head_;  ///< (vocab, hidden); null when tied to embed_
  std::vector<LayerWeights> layers_;
  std::vector<float> final_norm_;  ///< (hidden)
  std::vector<float> inv_freq_;    ///< (head_dim / 2) RoPE frequencies after rope_scaling
  GgmlRope ggml_rope_;             ///< the same for Numerics::kGgml
  std::unique_ptr<BlockPass> block_pass_;
  std::unique_ptr<Scratch> scratch_;      ///< the activations of the last passes, reused
  std::unique_ptr<Workspace> workspace_;  ///< the kernels' reusable buffers (matmul, attention)
  std::int64_t first_block_ = 0, last_block_ = 0;  ///< the blocks this process runs (all, outside a pipeline)
  Ranks* pipeline_ = nullptr;                       ///< set_pipeline's ranks; null: one process
  bool batch_invariant_ = false;                    ///< set_batch_invariant
};

}  // namespace woq
