// Finding a quantization plan for an accuracy budget (woq quantize --measure,
// --target-kl, --target-bpw).
//
// Sensitivity: with the model in float, each block linear in turn is
// quantized to each candidate format (every other layer float) and the
// model's next-token distributions on calibration text are compared with the
// float model's: that layer's KL contribution per candidate (the
// one-at-a-time measure; cf. exllamav2's per-layer error measurement, here on
// the model's output). The plan's predicted KL is the sum of its layers'
// contributions. Solve: the plan of fewest bytes whose predicted KL is within
// the target (or of least predicted KL within a bits-per-weight budget): a
// multiple-choice knapsack solved exactly by dynamic programming over bytes
// (in their gcd, or in units of 1/100000 of the largest model when that is
// coarser); deterministic.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/progress.h"
#include "eval/perplexity.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "model/quant_plan.h"

namespace woq {

/// One candidate format of one layer, as measured.
struct CandidateCost {
  QuantSpec spec;
  std::uint64_t bytes = 0;  ///< the layer's weight storage in this format (QuantMatrix::bytes)
  double kl = 0;            ///< mean KL (nats per token) of the model with only this layer in this format
  double kl_stderr = 0;
  bool held = false;        ///< the layer as the measured model holds it (KL 0, no pass run)
};

/// LayerCost::layer of lm_head.
inline constexpr std::int64_t kLmHeadLayer = -1;
/// LayerCost::layer of the input embeddings.
inline constexpr std::int64_t kEmbeddingsLayer = -2;

/// A block linear, lm_head (layer kLmHeadLayer) or the input embeddings (kEmbeddingsLayer; role unused for
/// both), and what each candidate costs.
struct LayerCost {
  std::int64_t layer = 0;
  LinearRole role = LinearRole::kQ;
  std::int64_t params = 0;  ///< rows x cols
  std::vector<CandidateCost> candidates;

  bool is_lm_head() const { return layer == kLmHeadLayer; }
  bool is_embeddings() const { return layer == kEmbeddingsLayer; }
  /// lm_head or the embeddings: its first candidate is it as held, which a plan that does not name it keeps.
  bool kept_unless_named() const { return layer < 0; }
  /// Its plan key: plan_module(layer, role), "lm_head" or "model.embed_tokens".
  std::string module() const;
  /// Its format in `plan`: the block linear's, or lm_head's / the embeddings' when the plan names them.
  std::optional<QuantSpec> format_in(const QuantPlan& plan) const;
};

/// What --measure finds (saved as JSON and reused by later solves).
struct Sensitivity {
  std::string model;                ///< the model path it was measured on
  /// What the candidates' integer layers multiplied their inputs as (int8 for
  /// GGUF candidates, as llama.cpp's dot products); unset: each format's default.
  std::optional<Activations> activations;
  std::int64_t positions = 0;       ///< scored calibration positions
  std::uint64_t other_bytes = 0;    ///< norms and, unless planned, the embeddings and lm_head as loaded
  std::int64_t other_params = 0;    ///< their weights
  /// Every block linear, layer-major, in LinearRole order; then lm_head and then the embeddings when they are
  /// planned (an untied model's float ones).
  std::vector<LayerCost> layers;
  double seconds = 0;               ///< wall time of the measurement
  std::string calib_digest;         ///< text_digest of the calibration text (empty: unknown)
  bool estimated = false;           ///< estimate_sensitivity's (anchor KL scaled by output error), not one at a time
  std::int64_t error_rows = 0;      ///< estimated: the calibration rows each output error was measured on

  /// Total weights (block linears + the others): the bits-per-weight denominator.
  std::int64_t total_params() const;
  /// lm_head among the planned layers, or nullptr.
  const LayerCost* planned_lm_head() const { return planned(kLmHeadLayer); }
  /// The embeddings among the planned layers, or nullptr.
  const LayerCost* planned_embeddings() const { return planned(kEmbeddingsLayer); }
  bool plans_lm_head() const { return planned_lm_head() != nullptr; }

 private:
  const LayerCost* planned(std::int64_t layer) const;
};

/// Loads (`load` true) or drops the float linears of decoder block `layer` of
/// the model being measured, for a model loaded without them
/// (LoadOptions::block_linears false); null: the model holds every block.
using BlockSource = std::function<void(std::int64_t layer, bool load)>;

/// The BlockSource of `model` (loaded from `store` without its block linears): block l's seven float linears
/// read by read_float_linear (quantize/gptq_calibration.h: shapes checked against the config, NaN/Inf refused,
/// pages released) and held in `held` (a float format: fp16 / bf16 / fp32, as LlamaModel::load holds them), or
/// dropped. `store`, `model` and `pool` must outlive it. Throws what read_float_linear and quantize_matrix throw.
BlockSource float_block_source(const TensorStore& store, LlamaModel& model, const QuantSpec& held, ThreadPool& pool);

/// The default candidates for a layer whose rows are `k` long: fp16; sym_int8
/// per channel and group 32; sym_int4 and asym_int4 at group 32, 64, 128
/// and per channel (groups of k or more counted once, as per channel); the
/// K-quants q6_k ... q2_k when k is a multiple of 256.
std::vector<QuantSpec> default_candidates(std::int64_t k);
/// The candidates a GGUF file holds (woq quantize --plan P -o F.gguf writes
/// them): fp16, and when k is a multiple of 32 Q8_0 (sym_int8 g32) and Q4_0
/// (sym_int4 g32), and the K-quants when it is one of 256.
std::vector<QuantSpec> gguf_candidates(std::int64_t k);

/// Measures every block linear of `model` (loaded with float linears; each is
/// restored after its turn), and lm_head and the input embeddings when they
/// are float and not tied to each other, under `candidates(k)` on `calib`
/// against the model's own distributions (lm_head and the embeddings also as
/// held, their first candidate: a plan may leave them so; an embeddings
/// candidate's KL is that of the whole model with its rows looked up);
/// `other_bytes` / `other_params`: the weights that are not block linears
/// (embeddings, norms, lm_head; lm_head's and the embeddings' are moved to
/// their LayerCost when they are measured); `activations`: the integer
/// layers' (unset: each format's default). `progress(done, total)` after
/// each layer. Each KL is computed from the float model's hidden states at the
/// layer's block (the blocks before it are unchanged), scoring what
/// compare_with_reference scores, to the same bits. Throws woq::Error when a block linear is not float, or what
/// quantize_matrix and forward throw.
Sensitivity measure_sensitivity(LlamaModel& model, const ScoringPlan& calib, ThreadPool& pool,
                                std::uint64_t other_bytes, std::int64_t other_params,
                                const std::function<std::vector<QuantSpec>(std::int64_t k)>& candidates,
                                std::optional<Activations> activations,
                                const Progress& progress = nullptr);

/// The calibration rows (of `total`, all sequences' tokens one after another)
/// estimate_sensitivity takes output errors on when asked for `n`: one row of
/// each of n equal strata, at a golden-ratio offset within it so that the rows
/// do not line up with the sequences' positions (a stride dividing the sequence
/// length would take every sequence's first token, whose activations are often
/// the largest); all rows when n <= 0 or n >= total. taken[r] is 1 for a row taken.
std::vector<char> error_row_sample(std::int64_t total, std::int64_t n);

/// The cheaper estimate of measure_sensitivity (--measure --estimate): per
/// block linear, the output error ||X W_c^T - X W^T||^2 of every candidate c
/// on the layer's own calibration inputs X (the float model's), and the exact
/// one-at-a-time KL of one anchor candidate (sym_int4 g32 when offered, else the
/// one of largest output error); every other candidate's KL is the anchor's
/// scaled by its output error / the anchor's (KL grows with the square of a
/// small perturbation of the logits, as the output error does). One forward pass
/// per block linear instead of one per block linear and candidate (lm_head's
/// candidates, a pass of lm_head alone each, are measured exactly; the
/// embeddings' output error is that of their rows looked up, ||E_c[t] - E[t]||^2
/// over the taken rows' tokens t, with one whole-model pass for the anchor). The output
/// errors are taken on `error_rows` calibration rows (error_row_sample; 0 or
/// more than there are: all), the KL on all.
/// Each anchor's hidden states are carried through the blocks as they come
/// and its KL taken after the last one, so with `blocks` the model need hold
/// one block's linears at a time (blocks(l, true) fills block l's, blocks(l,
/// false) may drop them; the reference distributions come from the float
/// states after the last block, the same bits as write_reference): memory of
/// one block plus an anchor's states per measured layer (tokens x hidden
/// floats each) instead of every block. Same results with or without it.
/// Same arguments and errors as measure_sensitivity; Sensitivity::estimated and
/// error_rows are set.
Sensitivity estimate_sensitivity(LlamaModel& model, const ScoringPlan& calib, ThreadPool& pool,
                                 std::uint64_t other_bytes, std::int64_t other_params,
                                 const std::function<std::vector<QuantSpec>(std::int64_t k)>& candidates,
                                 std::optional<Activations> activations, std::int64_t error_rows = 0,
                                 const Progress& progress = nullptr, const BlockSource& blocks = nullptr);

nlohmann::ordered_json sensitivity_json(const Sensitivity& s);
/// Throws woq::Error naming `source` and the field for a malformed measurement.
Sensitivity parse_sensitivity(const nlohmann::json& json, const std::string& source);

/// A solved plan with its predicted cost.
struct SolvedPlan {
  QuantPlan plan;
  std::uint64_t bytes = 0;     ///< block linears + the others
  double bits_per_weight = 0;  ///< bytes * 8 / Sensitivity::total_params()
  double predicted_kl = 0;     ///< sum of the chosen candidates' KL
  double predicted_kl_stderr = 0;  ///< sqrt of the sum of their squared standard errors
};

/// The plan of fewest bytes whose predicted KL <= target_kl. Throws
/// woq::Error when even the most accurate candidates predict more.
SolvedPlan solve_for_kl(const Sensitivity& s, double target_kl);
/// The plan of least predicted KL within target_bpw bits per weight. Throws
/// woq::Error when even the smallest candidates need more.
SolvedPlan solve_for_bpw(const Sensitivity& s, double target_bpw);
/// Bits per weight of the plan of every layer's smallest candidate.
double smallest_bpw(const Sensitivity& s);
/// The predicted cost of `plan` under `s`; throws woq::Error when the plan
/// gives a layer a format `s` did not measure for it.
SolvedPlan predict(const Sensitivity& s, const QuantPlan& plan);

}  // namespace woq
