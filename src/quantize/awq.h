// AWQ (Lin et al., "AWQ: Activation-aware Weight Quantization for LLM
// Compression and Acceleration", MLSys 2024), as AutoAWQ runs it
// (awq/quantize/quantizer.py), block by block over calibration text:
//  1. The block runs in float on the calibration hidden states; the inputs
//     of its linears and the outputs of attention (after o_proj) and of the
//     MLP (after down_proj) are recorded.
//  2. For each group of linears sharing an input — q/k/v after the attention
//     norm, o after v (only when v's output is o's input: no GQA, no v bias),
//     gate/up after the MLP norm, down after up — a per-input-channel scale
//     s = x_mean^a / (w_mean^(1-a) + 1e-4), normalised by sqrt(max s · min s),
//     is searched over a = 0, 1/grid, ..., (grid-1)/grid for the least mean
//     squared error of that group's module output with Q(W·s)/s in place of W
//     (x_mean: mean |x| per channel; w_mean: mean over rows of |W| / max|W| of
//     its group); s = 1 is kept when no grid point beats it on the
//     calibration loss (AutoAWQ always scales). The chosen s is folded
//     exactly: W·s for the group, the preceding RMSNorm weight or linear's
//     rows divided by s.
//  3. Weight clipping (o, v, gate, up, down; not q/k): per output row and
//     group, the threshold max|W|·(1 - i/grid), i < grid/2, whose quantized
//     group output on sampled inputs is closest to the float one.
//  4. The scaled, clipped weights are quantized by round to nearest in the
//     requested format, or by GPTQ (awq+gptq) with Hessians of the scaled inputs.
// The next block sees this block's float outputs, as AutoAWQ's (or, with
// AwqOptions::propagate_quantized, --awq-propagate quantized, its outputs as
// quantized, as woq's GPTQ does).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quantize/gptq.h"
#include "quantize/gptq_calibration.h"
#include "quantize/quantize_checkpoint.h"

namespace woq {

/// Settings of AWQ.
struct AwqOptions {
  QuantSpec spec;                  ///< the integer format searched for and written (AWQ's: asym_int4 g128)
  int grid = 20;                   ///< scale exponents a = i / grid, i < grid (AutoAWQ's n_grid)
  bool clip = true;                ///< the clipping search (AutoAWQ's apply_clip)
  int clip_grid = 20;              ///< clipping thresholds max·(1 - i/clip_grid), i < clip_grid / 2 (AutoAWQ's)
  /// Calibration rows each scale search's loss is measured on, evenly spaced (q/k/v: whole sequences,
  /// ceil(search_tokens / length) of them); 0: all (AutoAWQ's). x_mean always takes every row.
  std::int64_t search_tokens = 512;
  std::int64_t clip_tokens = 512;  ///< calibration rows the clipping search samples, evenly spaced (n_sample_token)
  /// awq+gptq: GPTQ on the scaled, clipped weights (these settings, spec from `spec`); unset: round to nearest.
  std::optional<GptqOptions> gptq;
  /// Per-linear formats (awq_plan's for --format awq: the layers AWQ cannot pack stay float); unset: `spec`.
  std::shared_ptr<const QuantPlan> plan = nullptr;
  /// The next block sees this block's outputs as quantized (as woq's GPTQ does); false (the default): its
  /// float outputs (AutoAWQ's order).
  bool propagate_quantized = false;
};

/// One scaled group of one block: what the search chose.
struct AwqScale {
  std::string group;            ///< "q/k/v", "o", "gate/up", "down"
  double ratio = 0;             ///< the exponent a chosen; -1: none (s = 1 beat every grid point)
  double loss = 0;              ///< its mean squared error
  double loss_unscaled = 0;     ///< the error with s = 1 (a = 0 without w_mean), for the report
  std::vector<float> scales;    ///< s [K]
  double seconds = 0;           ///< the search's time
};

/// What AWQ did to one block, and how long each part took (seconds).
struct AwqLayerReport {
  std::int64_t layer = 0;
  std::vector<AwqScale> scales;
  std::vector<std::string> skipped;  ///< groups not scaled, with why ("o: v's output is not o's input (GQA)")
  double forward = 0, search = 0, clip = 0, quantize = 0;
};

/// The scale search of one group (step 2), exposed for the reference test:
/// x_mean [K], w_mean [K] as defined above, `loss(s)` the module's error with
/// Q(W·s)/s. Returns the best of the grid (the first on ties), loss_unscaled
/// left 0.
AwqScale awq_search_scale(const std::vector<double>& x_mean, const std::vector<double>& w_mean, int grid,
                          const std::function<double(const std::vector<float>&)>& loss);

/// AutoAWQ's w_mean of the concatenated weights `w` (each row-major [rows_i, k]):
/// per input channel, the mean over all rows of |W| / (max |W| of its group + 1e-6),
/// groups of `group_size` along K (-1: K). The groups split over `pool` when given (the same bits).
std::vector<double> awq_weight_mean(const std::vector<std::pair<const float*, std::int64_t>>& w, std::int64_t k,
                                    std::int64_t group_size, ThreadPool* pool = nullptr);

/// AWQ's clipping search (step 3; AutoAWQ's _compute_best_clip) of W [n, k]
/// row-major on inputs x [T, k]: per output row and group of spec.group_size
/// (-1: k), the threshold max|W_g|·(1 − i/grid), i < grid/2, whose error
/// Σ_t (x_tg · (Q(clip(W)) − W)_g)² is least (the first on ties), with Q
/// round to nearest in `spec`; W is clamped to it. Returns the thresholds
/// [n, groups]. Throws what quantize_matrix throws.
std::vector<float> awq_clip(std::vector<float>& w, std::int64_t n, std::int64_t k, const std::vector<float>& x,
                            const QuantSpec& spec, int grid, ThreadPool& pool);

/// Matrices per block in AWQ's --resume directory (ResumeDir): the seven
/// linears, the two folded RMSNorm weights and the q/k/v, o, gate/up and down
/// input scales (1 where none was searched), each an fp32 row.
inline constexpr std::int64_t kAwqResumeMatrices = static_cast<std::int64_t>(kBlockLinears.size()) + 6;

/// The BlockQuantizer of AWQ for `model` (loaded without its block linears:
/// load_for_calibration) reading float weights from `store`: each block's
/// seven linears in options.spec plus its two RMSNorm weights with the
/// scales folded in (QuantizedBlock::replaced). Reports each block to
/// `on_layer`. With `resume` (a ResumeDir of kAwqResumeMatrices per block),
/// each finished block is saved there, and the blocks finished before are
/// read back instead of searched (the same output as an uninterrupted run).
/// Throws woq::Error for empty or ragged calibration, non-finite weights,
/// and what quantize_matrix / GPTQ throw (naming the tensor).
BlockQuantizer awq_block_quantizer(LlamaModel& model, const TensorStore& store, Calibration calibration,
                                   const AwqOptions& options, ThreadPool& pool,
                                   const std::function<void(const AwqLayerReport&)>& on_layer,
                                   ResumeDir* resume = nullptr);

}  // namespace woq
