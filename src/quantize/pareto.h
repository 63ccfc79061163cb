// `woq eval pareto`: the size / accuracy trade-off of a model's quantizations
// at a glance. Every point is measured on held-out text against the float
// model (mean KL with its standard error, same-top %, PPL ratio): the uniform
// formats, llama-quantize's rule mixes (Q2_K ... Q6_K by llama_tensor_get_type;
// where a row length is no multiple of 256 the rule's K-quant stands for the
// woq format of about its bits), and woq's solved plans at the size of each of
// those. Drawn with gnuplot (PNG) and written as JSON.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/progress.h"
#include "core/thread_pool.h"
#include "quantize/plan_search.h"

namespace woq {

/// One measured point.
struct ParetoPoint {
  std::string kind;  ///< "uniform", "rule" or "plan"
  std::string name;  ///< "sym_int4 g32", "Q4_K_M rule", "plan @ 4.50 bpw"
  std::uint64_t bytes = 0;
  double bits_per_weight = 0;
  double predicted_kl = 0;
  double mean_kl = 0, kl_stderr = 0;
  double same_top = 0, ppl_ratio = 0;
};

struct ParetoRequest {
  std::string input;        ///< a float model
  std::string calib_file;   ///< calibration text for the measurement (unless `measurement`)
  std::string measurement;  ///< a saved woq quantize --measure output; empty: measure
  std::string file;         ///< held-out text every point is measured on
  std::int64_t ctx = 128;
  std::int64_t chunks = 16;
  std::string png;   ///< the plot; empty: none
  std::string json;  ///< the points; empty: none
};

/// The llama-quantize file type `mix` as a plan for a model of `config`: each
/// block linear in the K-quant its rule gives, or, where a row length is not a
/// multiple of 256, the woq format of about that many bits (q2_K: sym_int4
/// per channel, q3_K: sym_int4 g128, q4_K: sym_int4 g32, q5_K: asym_int4 g32,
/// q6_K and q8_0: sym_int8 per channel).
QuantPlan rule_plan(const kquant::Mix& mix, const ModelConfig& config);

/// Measures every point (`log` gets one line each). Throws woq::Error as
/// run_plan_request does, and when gnuplot is missing or fails (naming it).
std::vector<ParetoPoint> run_pareto(const ParetoRequest& request, ThreadPool& pool,
                                    const std::function<void(const std::string&)>& log);

/// Draws `points` to the PNG `path` with gnuplot (KL, log scale, against bits
/// per weight). Throws woq::Error when gnuplot is not installed or fails.
void plot_pareto(const std::vector<ParetoPoint>& points, const std::string& title, const std::string& path);

nlohmann::ordered_json pareto_json(const std::vector<ParetoPoint>& points);

}  // namespace woq
