// `woq quantize --measure / --target-kl / --target-bpw` as one library call:
// measure each layer's sensitivity on calibration text (or reuse a saved
// measurement), solve for the budget, then verify the plan on held-out text
// against the float model and refine it when the measured KL misses the
// target (quantize/plan_search.h).
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>

#include "core/progress.h"
#include "core/thread_pool.h"
#include "eval/compare.h"
#include "generate/model_session.h"
#include "quantize/plan_search.h"

namespace woq {

/// The calibration rows estimate_sensitivity takes output errors on unless told (--estimate-rows): the ratios
/// of candidates' errors it needs settle long before all rows (a 4x cheaper estimate of a 7B model's layers).
inline constexpr std::int64_t kEstimateRows = 256;

/// The choices of a plan search. Exactly one of measure_only, target_kl and
/// target_bpw.
struct PlanRequest {
  std::string input;        ///< a model with float linear layers (Hugging Face directory or GGUF)
  std::string output;       ///< the plan (or, with measure_only, the measurement) JSON file
  bool force = false;       ///< replace an existing output
  bool measure_only = false;
  std::optional<double> target_kl;   ///< mean KL, nats per token, on the held-out text
  std::optional<double> target_bpw;  ///< bits per weight of the whole model
  std::string measurement;  ///< a saved measurement to solve from instead of measuring; empty: measure
  std::string calib_file;   ///< calibration text (required to measure)
  std::string verify_file;  ///< held-out text the plan is verified on (required to solve)
  std::int64_t ctx = 128;   ///< tokens per chunk (scored on their second half, as llama-perplexity)
  std::int64_t chunks = 16; ///< chunks of each text at most
  std::string candidates = "all";  ///< all (default_candidates) or gguf (gguf_candidates)
  bool estimate = false;    ///< measure by estimate_sensitivity (one pass per linear), not one per candidate
  /// estimate: the calibration rows each candidate's output error is taken on (error_row_sample); 0: all
  std::optional<std::int64_t> estimate_rows;
  int refine = 3;           ///< re-solves with a tighter target when the measured KL misses it
};

/// A float model's sensitivity (measured, or read from a saved measurement)
/// and its distributions on held-out text, for measuring plans against it:
/// the float model itself is freed after the reference is taken.
class PlanEvaluator {
 public:
  /// Loads `input` in fp32 and measures it on `calib_file` under
  /// `candidates` ("all" or "gguf", see PlanRequest), one at a time or, with
  /// `estimate` set, by estimate_sensitivity with that many error rows (or reads
  /// `measurement`); with `heldout` non-empty, writes its reference rows.
  /// Chunks of ctx tokens, at most `chunks` of each text. Throws woq::Error
  /// for a quantized model, a measurement of another shape, and what
  /// measure_sensitivity throws.
  PlanEvaluator(const std::string& input, const std::string& calib_file, const std::string& measurement,
                const std::string& heldout, std::int64_t ctx, std::int64_t chunks, ThreadPool& pool,
                const std::function<void(const std::string&)>& log, const Progress& progress = nullptr,
                const std::string& candidates = "all", std::optional<std::int64_t> estimate = std::nullopt);
  const Sensitivity& sensitivity() const { return sensitivity_; }
  const ModelConfig& config() const { return session_.config; }
  /// The model loaded with `plan` against the held-out reference.
  CompareStats measure(const QuantPlan& plan);

 private:
  ModelSession session_;
  Sensitivity sensitivity_;
  ScoringPlan held_;
  std::optional<RefLogprobFile> ref_;
};

/// Throws woq::Error unless `output` may be written: absent, or a regular
/// file and `force`; not one of `inputs` (empty ones skipped); in a folder
/// that exists.
void require_new_output(const std::string& output, bool force, std::initializer_list<const std::string*> inputs);

/// A digest of a text ("fnv1a64:<16 hex digits>"), to tell calibration text
/// from held-out text whatever the files are named.
std::string text_digest(const std::string& text);

/// Runs the request on `pool`; `log` receives the lines the CLI prints
/// (without "woq: "), `progress(done, total)` follows the measurement. Throws
/// woq::Error for a bad combination of choices (naming the CLI's flags), an
/// existing output without force, a model whose linears are not float, and
/// what measure_sensitivity, the solves and loading throw.
void run_plan_request(const PlanRequest& request, ThreadPool& pool, const std::function<void(const std::string&)>& log,
                      const Progress& progress = nullptr);

}  // namespace woq
