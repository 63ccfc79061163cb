#include "quantize/plan_request.h"

#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "arch/architecture.h"
#include "core/error.h"
#include "core/hash.h"
#include "eval/compare.h"
#include "eval/reports.h"
#include "generate/model_session.h"
#include "io/json_file.h"
#include "io/safetensors.h"
#include "model/load_request.h"
#include "quantize/plan_search.h"

namespace woq {

namespace {

}  // namespace

void require_new_output(const std::string& output, bool force, std::initializer_list<const std::string*> inputs) {
  std::error_code ec;
  const auto status = std::filesystem::status(output, ec);
  if (std::filesystem::exists(status)) {
    if (!std::filesystem::is_regular_file(status)) fail("{}: exists and is not a regular file", output);
    if (!force) fail("{} exists (use --force to replace it)", output);
  }
  const std::filesystem::path out = std::filesystem::weakly_canonical(output, ec);
  for (const std::string* in : inputs) {
    std::error_code e;
    if (!in->empty() && std::filesystem::weakly_canonical(*in, e) == out)
      fail("{} is also an input of this run: write the output elsewhere", output);
  }
  require_writable_path(output);
}

std::string text_digest(const std::string& text) {
  return "fnv1a64:" + Fnv1a64{}.add(text).hex();
}

namespace {

void check(const PlanRequest& r) {
  const int modes = (r.measure_only ? 1 : 0) + (r.target_kl ? 1 : 0) + (r.target_bpw ? 1 : 0);
  if (modes != 1) fail("give one of --measure, --target-kl and --target-bpw");
  if (r.measure_only && !r.measurement.empty()) fail("--measurement is a saved --measure: give one or the other");
  if (!r.measurement.empty() && (r.candidates != "all" || r.estimate || r.estimate_rows))
    fail("--candidates, --estimate and --estimate-rows choose how --measure measures; a saved --measurement was "
         "measured already");
  if (r.estimate_rows && !r.estimate) fail("--estimate-rows is the rows --estimate takes output errors on: give --estimate");
  if (r.estimate_rows && *r.estimate_rows < 0) fail("--estimate-rows must be 0 (all) or positive, got {}", *r.estimate_rows);
  if (r.measurement.empty() && r.calib_file.empty())
    fail("{}", r.measure_only ? "--measure needs calibration text: --calib-file FILE"
                              : "measuring needs calibration text: --calib-file FILE (or --measurement FILE from an "
                                "earlier --measure)");
  if (!r.measure_only && r.verify_file.empty())
    fail("a plan is verified on held-out text: give --verify-file FILE (not the calibration text)");
  if (!r.measure_only && !r.verify_file.empty() && !r.calib_file.empty()) {
    std::error_code e1, e2;
    if (std::filesystem::weakly_canonical(r.verify_file, e1) == std::filesystem::weakly_canonical(r.calib_file, e2))
      fail("--verify-file is the calibration text: verify on held-out text");
  }
  if (r.ctx < 4) fail("--seqlen must be at least 4, got {}", r.ctx);
  if (r.chunks < 1) fail("--nsamples must be positive, got {}", r.chunks);
  if (r.refine < 0) fail("--refine must be >= 0, got {}", r.refine);
  if (r.measure_only && !r.verify_file.empty()) fail("--verify-file verifies a plan; --measure writes no plan");
  require_new_output(r.output, r.force, {&r.measurement, &r.calib_file, &r.verify_file});
  if (r.output.ends_with(".gguf"))
    fail("{}: a plan or measurement is JSON; write a GGUF file from the plan with woq quantize --plan PLAN -o {}",
         r.output, r.output);
}

// The weights a plan leaves as loaded: embeddings, lm_head when untied, the RMSNorm weights.
std::int64_t other_params(const ModelConfig& c) {
  const std::int64_t embed = c.vocab_size * c.hidden_size;
  return embed * (c.tie_word_embeddings ? 1 : 2) + c.hidden_size * (2 * c.num_hidden_layers + 1);
}

// How many of the measured layers two plans give different formats.
std::int64_t changed_layers(const Sensitivity& s, const QuantPlan& a, const QuantPlan& b) {
  std::int64_t n = 0;
  for (const LayerCost& l : s.layers) {
    const std::optional<QuantSpec> x = l.format_in(a), y = l.format_in(b);
    if (x.has_value() != y.has_value() || (x && spec_json(*x) != spec_json(*y))) ++n;
  }
  return n;
}

struct Verified {
  CompareStats stats;
  bool meets = false;
};

std::string describe_plan(const SolvedPlan& p) {
  std::string s = fmt::format("base {}", spec_name(p.plan.base));
  std::map<std::string, int> others;
  std::string ends;  // lm_head's and the embeddings' formats
  for (const auto& [name, spec] : p.plan.tensors) {
    if (name == kLmHeadModule) ends += fmt::format(", lm_head {}", spec_name(spec));
    else if (name == kEmbeddingsModule) ends += fmt::format(", embeddings {}", spec_name(spec));
    else ++others[spec_name(spec)];
  }
  for (const auto& [name, n] : others) s += fmt::format(", {} x{}", name, n);
  return s + ends;
}

// " (lm_head among them)" and the like: the measured layers beside the block linears.
std::string planned_ends(const Sensitivity& s) {
  const bool head = s.plans_lm_head(), embeddings = s.planned_embeddings() != nullptr;
  return head && embeddings ? " (lm_head and the embeddings among them)"
         : head             ? " (lm_head among them)"
         : embeddings       ? " (the embeddings among them)"
                            : "";
}

// Throws woq::Error naming the candidate when one's bytes are not what its format takes for its layer's shape
// as the model holds it (in the kernels' layout for the measurement's activations; the embeddings' rows as
// stored), or when its format cannot hold that shape.
void check_candidate_bytes(const Sensitivity& s, const std::string& measurement, const ModelConfig& c,
                           ThreadPool& pool) {
  std::map<std::string, std::uint64_t> known;  // by shape and format
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    const LayerCost& l = s.layers[i];
    if (!l.kept_unless_named() && (l.layer < 0 || l.layer >= c.num_hidden_layers)) continue;  // refused below
    const auto [rows, cols] = l.kept_unless_named() ? std::pair(c.vocab_size, c.hidden_size)
                                                    : block_linear_shape(c, l.role);
    for (std::size_t j = 0; j < l.candidates.size(); ++j) {
      const CandidateCost& cand = l.candidates[j];
      const std::string key = fmt::format("{}x{}{} {}", rows, cols, l.is_embeddings() ? " rows" : "",
                                          spec_json(cand.spec).dump());
      if (!known.contains(key)) {
        try {
          QuantMatrix w = allocate_matrix(rows, cols, cand.spec);
          if (!l.is_embeddings()) ready_for_kernels(w, s.activations, false, pool);
          known[key] = w.bytes();
        } catch (const Error& e) {
          fail("{}: layers[{}].candidates[{}] ({} {}): {}", measurement, i, j, l.module(), spec_name(cand.spec),
               e.what());
        }
      }
      if (cand.bytes != known[key])
        fail("{}: layers[{}].candidates[{}]: {} in {} takes {} bytes, not {}: a measurement of another model?",
             measurement, i, j, l.module(), spec_name(cand.spec), known[key], cand.bytes);
    }
  }
}

// Throws woq::Error when the measurement `s` (read from `measurement`) is not of `model` (loaded from `input`
// with its linears as stored, `report`): its layers and their weights, lm_head and the embeddings as held (each
// the model's own float matrix as stored), the other weights' count and bytes.
void check_measured_model(const Sensitivity& s, const std::string& measurement, const std::string& input,
                          LlamaModel& model, const LoadReport& report, ThreadPool& pool) {
  const ModelConfig& c = model.config();
  struct End {
    const LayerCost* cost;
    const QuantMatrix* held;  // the model's own matrix, or nullptr when tied to the other end
    std::string_view name;
  };
  const QuantMatrix* embeddings = c.tie_word_embeddings ? nullptr : &model.embeddings();
  std::int64_t end_params = 0;
  std::uint64_t end_bytes = 0;
  std::size_t ends = 0;
  for (const End& e : {End{s.planned_lm_head(), model.untied_lm_head(), kLmHeadModule},
                       End{s.planned_embeddings(), embeddings, kEmbeddingsModule}}) {
    if (e.cost == nullptr) continue;
    if (e.held == nullptr)
      fail("{}: plans {}, which {} ties to {}: a measurement of another model?", measurement, e.name, input,
           e.name == kLmHeadModule ? "its embeddings" : "lm_head");
    const std::int64_t params = c.vocab_size * c.hidden_size;
    if (e.cost->params != params)
      fail("{}: {} has {} weights; {}'s has {}: a measurement of another model?", measurement, e.name, e.cost->params,
           input, params);
    // As held is what loading leaves it: the float matrix as stored.
    const CandidateCost& held = e.cost->candidates.front();
    if (!is_float_format(e.held->type) || held.spec.type != e.held->type || held.bytes != e.held->bytes())
      fail("{}: {} was measured as {} ({} bytes); {} stores it as {} ({} bytes): a measurement of another model?",
           measurement, e.name, spec_name(held.spec), held.bytes, input, low_bit_name(e.held->type), e.held->bytes());
    end_params += params;
    end_bytes += e.held->bytes();
    ++ends;
  }
  const std::size_t expected = static_cast<std::size_t>(c.num_hidden_layers) * kBlockLinears.size();
  check_candidate_bytes(s, measurement, c, pool);
  if (s.layers.size() != expected + ends)
    fail("{}: measures {} layers, {} has {}: a measurement of another model?", measurement, s.layers.size() - ends,
         input, expected);
  for (std::size_t i = 0; i < expected; ++i) {
    const LayerCost& l = s.layers[i];
    const std::int64_t layer = static_cast<std::int64_t>(i / kBlockLinears.size());
    const LinearSpec& spec = kBlockLinears[i % kBlockLinears.size()];
    if (l.layer != layer || l.role != spec.role || l.params != c.size(spec.rows) * c.size(spec.cols))
      fail("{}: layers[{}] is {} with {} weights; {} has {} with {} here: a measurement of another model?",
           measurement, i, l.module(), l.params, input, plan_module(layer, spec.role),
           c.size(spec.rows) * c.size(spec.cols));
  }
  if (s.other_params != other_params(c) - end_params)
    fail("{}: other_params {} is not {}'s {}: a measurement of another model?", measurement, s.other_params, input,
         other_params(c) - end_params);
  const std::uint64_t other = report.other_bytes + report.lm_head_bytes - end_bytes;
  if (s.other_bytes != other)
    fail("{}: other_bytes {} is not {}'s {} (its embeddings, norms and lm_head as loaded, less the planned ones): a "
         "measurement of another model, or of this one in another dtype?", measurement, s.other_bytes, input, other);
}

// The float format every block linear of `store` is stored in: fp16 or bf16 when all are, else fp32 (which holds
// any of them exactly); nullopt when one is missing or not F16 / BF16 / F32 (GPTQ, a GGUF's ggml types: a
// quantized checkpoint is refused after loading).
std::optional<LowBit> stored_float(const TensorStore& store, const ModelConfig& c) {
  std::optional<DType> dtype;
  bool mixed = false;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& spec : kBlockLinears) {
      const TensorView* t = store.find(linear_tensor(l, spec.role));
      if (t == nullptr || (t->dtype != DType::kF16 && t->dtype != DType::kBF16 && t->dtype != DType::kF32))
        return std::nullopt;
      mixed = mixed || (dtype && t->dtype != *dtype);
      dtype = t->dtype;
    }
  return mixed ? LowBit::kFp32 : dtype == DType::kF16 ? LowBit::kFp16 : dtype == DType::kBF16 ? LowBit::kBf16 : LowBit::kFp32;
}

}  // namespace

PlanEvaluator::PlanEvaluator(const std::string& input, const std::string& calib_file, const std::string& measurement,
                             const std::string& heldout, std::int64_t ctx, std::int64_t chunks, ThreadPool& pool,
                             const std::function<void(const std::string&)>& log, const Progress& progress,
                             const std::string& candidates, std::optional<std::int64_t> estimate) {
  if (candidates != "all" && candidates != "gguf") fail("--candidates '{}' is not one of: all, gguf", candidates);
  const auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  if (measurement.empty() && calib_file.empty())
    fail("measuring needs calibration text: --calib-file FILE (or --measurement FILE from an earlier --measure)");
  session_.open(input, std::shared_ptr<ThreadPool>(&pool, [](ThreadPool*) {}), ModelSession::Parts::kTokenizer);
  // The float model as stored: fp16 / bf16 linears stay so (the float kernels widen them exactly: the same
  // products as their fp32 copies, in half the memory and faster); others are held in fp32.
  const TensorStore store = TensorStore::open(input);
  const std::optional<LowBit> stored = stored_float(store, session_.config);
  LoadOptions as_stored;
  as_stored.linear = QuantSpec{stored.value_or(LowBit::kFp32)};
  // --measure --estimate alone reads the blocks' linears one block at a time (estimate_sensitivity's BlockSource):
  // the float model is never held whole.
  const bool streamed = estimate && heldout.empty() && measurement.empty() && stored;
  as_stored.block_linears = !streamed;
  session_.load(as_stored);
  if (session_.report.prequantized())
    fail("{}: its linear layers are quantized ({}): a plan is measured on a float model", input,
         session_.report.imported_format);
  const std::int64_t limit = session_.config.context_limit();
  const auto text_plan = [&](const std::string& file) {
    ScoringRequest r;
    r.ctx = ctx;
    r.chunks = chunks;
    return scoring_plan(*session_.tokenizer, read_text_file(file), file, r, limit);
  };
  if (!measurement.empty()) {
    sensitivity_ = parse_sensitivity(read_json_file(measurement), measurement);
    check_measured_model(sensitivity_, measurement, input, *session_.model, session_.report, pool);
    say(fmt::format("measurement {}: {} layers{}, {} calibration positions", measurement, sensitivity_.layers.size(),
                    planned_ends(sensitivity_), sensitivity_.positions));
  } else {
    const ScoringPlan calib = text_plan(calib_file);
    const std::uint64_t other_bytes = session_.report.other_bytes + session_.report.lm_head_bytes;
    const auto specs = candidates == "gguf" ? gguf_candidates : default_candidates;
    const auto activations = candidates == "gguf" ? std::optional<Activations>(Activations::kInt8) : std::nullopt;
    const BlockSource blocks = streamed ? float_block_source(store, *session_.model, as_stored.linear, pool) : nullptr;
    sensitivity_ = estimate ? estimate_sensitivity(*session_.model, calib, pool, other_bytes,
                                                   other_params(session_.config), specs, activations, *estimate,
                                                   progress, blocks)
                            : measure_sensitivity(*session_.model, calib, pool, other_bytes,
                                                  other_params(session_.config), specs, activations, progress);
    sensitivity_.model = input;
    sensitivity_.calib_digest = text_digest(read_text_file(calib_file));
    std::size_t tried = 0;
    for (const LayerCost& l : sensitivity_.layers) tried += l.candidates.size();
    say(fmt::format("measured {} layers{}, {} candidate formats in all{} on {} positions of {} in {:.1f} s "
                    "(linears held as {}{})",
                    sensitivity_.layers.size(),
                    sensitivity_.layers.size() > static_cast<std::size_t>(session_.config.num_hidden_layers) *
                                                     kBlockLinears.size()
                        ? planned_ends(sensitivity_)
                    : session_.model->untied_lm_head() == nullptr
                        ? " (lm_head is tied to the embeddings: neither is planned)"
                        : " (lm_head and the embeddings are not float: not planned)",
                    tried,
                    estimate ? fmt::format(" (estimated: one candidate's KL per layer, the others' scaled by output "
                                           "error on {} row{})", sensitivity_.error_rows,
                                           sensitivity_.error_rows == 1 ? "" : "s")
                             : std::string(),
                    sensitivity_.positions, calib_file, sensitivity_.seconds, low_bit_name(as_stored.linear.type),
                    streamed ? ", one block at a time" : ""));
  }
  if (!heldout.empty()) {
    if (text_digest(read_text_file(heldout)) == sensitivity_.calib_digest)
      fail("{} holds the calibration text the measurement was taken on: verify on held-out text", heldout);
    held_ = text_plan(heldout);
    ref_.emplace(RefLogprobFile::create("", held_, session_.config.vocab_size));
    write_reference(*session_.model, held_, 0, *ref_);
  }
  session_.model.reset();
}

CompareStats PlanEvaluator::measure(const QuantPlan& plan) {
  if (!ref_) fail("PlanEvaluator::measure: no held-out text was given");
  session_.load(load_options_of(plan));
  const CompareStats stats = compare_with_reference(*session_.model, held_, 0, *ref_);
  session_.model.reset();
  return stats;
}

void run_plan_request(const PlanRequest& r, ThreadPool& pool, const std::function<void(const std::string&)>& log,
                      const Progress& progress) {
  check(r);
  const auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  PlanEvaluator eval(r.input, r.calib_file, r.measurement, r.measure_only ? std::string() : r.verify_file, r.ctx,
                     r.chunks, pool, log, progress, r.candidates,
                     r.estimate ? std::optional<std::int64_t>(r.estimate_rows.value_or(kEstimateRows)) : std::nullopt);
  const Sensitivity& s = eval.sensitivity();
  if (r.measure_only) {
    write_json_file(r.output, sensitivity_json(s));
    say(fmt::format("wrote {}", r.output));
    return;
  }

  const double target = r.target_kl.value_or(0);
  double solve_target = target;
  SolvedPlan solved, previous;
  Verified v;
  for (int round = 0;; ++round) {
    if (round == 0) {
      solved = r.target_kl ? solve_for_kl(s, solve_target) : solve_for_bpw(s, *r.target_bpw);
    } else {
      try {
        solved = solve_for_kl(s, solve_target);
      } catch (const Error& e) {
        say(fmt::format("cannot aim lower than plan {} ({}): keeping it", round, e.what()));
        break;
      }
      if (changed_layers(s, previous.plan, solved.plan) == 0) {
        say(fmt::format("aiming lower gives plan {} again: keeping it", round));
        solved = previous;
        break;
      }
    }
    v.stats = eval.measure(solved.plan);
    v.meets = !r.target_kl || v.stats.mean_kl <= target;
    say(fmt::format("plan {}: {}{} ({:.3f} bits per weight, {:.3f} MiB): predicted KL {:.4g} +/- {:.2g}, measured on {} "
                    "{:.4g} +/- {:.2g}{}",
                    round + 1, describe_plan(solved),
                    round > 0 ? fmt::format(" ({} layers in other formats than plan {}'s)",
                                            changed_layers(s, previous.plan, solved.plan), round)
                              : std::string(),
                    solved.bits_per_weight, static_cast<double>(solved.bytes) / 1048576.0,
                    solved.predicted_kl, solved.predicted_kl_stderr, r.verify_file, v.stats.mean_kl,
                    v.stats.kl_stderr, r.target_kl ? fmt::format(" (target {})", target) : std::string()));
    if (v.meets || round >= r.refine) break;
    // Aim lower by the ratio the prediction missed by, and 3 % more (the measured KL has its own noise).
    solve_target *= 0.97 * target / v.stats.mean_kl;
    previous = solved;
  }
  solved.plan.info["solve"] = {{"target_kl", r.target_kl ? nlohmann::json(target) : nlohmann::json(nullptr)},
                               {"target_bpw", r.target_bpw ? nlohmann::json(*r.target_bpw) : nlohmann::json(nullptr)},
                               {"solved_for_kl", r.target_kl ? nlohmann::json(solve_target) : nlohmann::json(nullptr)},
                               {"predicted_kl", solved.predicted_kl},
                               {"predicted_kl_stderr", solved.predicted_kl_stderr},
                               {"bytes", solved.bytes},
                               {"bits_per_weight", solved.bits_per_weight},
                               {"model", r.input},
                               {"measurement", r.measurement.empty() ? r.calib_file : r.measurement},
                               {"positions", s.positions}};
  solved.plan.info["verify"] = {{"file", r.verify_file},
                                {"positions", v.stats.positions},
                                {"mean_kl", v.stats.mean_kl},
                                {"kl_stderr", v.stats.kl_stderr},
                                {"same_top", v.stats.same_top},
                                {"same_top_stderr", v.stats.same_top_stderr},
                                {"ppl_ratio", v.stats.ppl_ratio},
                                {"meets_target", v.meets}};
  write_plan(solved.plan, r.output);
  say(fmt::format("verified on {} positions of {}: mean KL {:.4g} +/- {:.2g}, same top token {:.2f} +/- {:.2f} %, PPL "
                  "ratio {:.4f}",
                  v.stats.positions, r.verify_file, v.stats.mean_kl, v.stats.kl_stderr, 100 * v.stats.same_top,
                  100 * v.stats.same_top_stderr, v.stats.ppl_ratio));
  if (!v.meets)
    say(fmt::format("warning: the measured KL {:.4g} misses the target {} by {:.1f} % after {} refinements; the plan is "
                    "written with verify.meets_target false",
                    v.stats.mean_kl, target, 100 * (v.stats.mean_kl / target - 1), r.refine));
  say(fmt::format("wrote {} (load it with --plan {})", r.output, r.output));
}

}  // namespace woq
