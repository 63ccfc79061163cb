#include "quantize/plan_search.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "eval/compare.h"
#include "eval/reports.h"
#include "formats/kquant.h"
#include "io/json_file.h"
#include "kernels/matmul.h"
#include "quantize/gptq_calibration.h"

namespace woq {

namespace {

// Largest byte or weight count a measurement may hold (sums of 2^16 of them stay exact in int64 and double).
constexpr std::int64_t kMaxCount = std::int64_t{1} << 48;

// Index of the chosen candidate of every layer.
using Choice = std::vector<std::size_t>;

struct Totals {
  std::uint64_t bytes = 0;
  double kl = 0;
};

Totals totals(const Sensitivity& s, const Choice& choice) {
  Totals t{s.other_bytes, 0};
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    const CandidateCost& c = s.layers[i].candidates[choice[i]];
    t.bytes += c.bytes;
    t.kl += c.kl;
  }
  return t;
}

// The least predicted KL for every byte budget: a multiple-choice knapsack by
// dynamic programming over the planned layers' bytes in units of `unit` (their
// gcd, or coarser so that at most kMaxUnits budgets are tracked; each layer's
// bytes rounded up, so a budget is never exceeded). Exact when unit is the gcd.
class Knapsack {
 public:
  static constexpr std::uint64_t kMaxUnits = 100000;

  explicit Knapsack(const Sensitivity& s) : s_(s) {
    std::uint64_t g = 0, most = 0;
    for (const LayerCost& l : s.layers) {
      std::uint64_t top = 0;
      for (const CandidateCost& c : l.candidates) {
        g = std::gcd(g, c.bytes);
        top = std::max(top, c.bytes);
      }
      most += top;
    }
    unit_ = std::max<std::uint64_t>({g, 1, (most + kMaxUnits - 1) / kMaxUnits});
    std::vector<double> best(1, 0.0);  // least KL within b units, for b < best.size()
    for (const LayerCost& l : s.layers) {
      std::uint64_t top = 0;
      for (const CandidateCost& c : l.candidates) top = std::max(top, units(c.bytes));
      std::vector<double> next(best.size() + top, std::numeric_limits<double>::infinity());
      std::vector<std::uint16_t> arg(next.size(), 0);
      for (std::size_t j = 0; j < l.candidates.size(); ++j) {
        const std::uint64_t w = units(l.candidates[j].bytes);
        for (std::size_t b = 0; b < best.size(); ++b) {
          const double kl = best[b] + l.candidates[j].kl;
          if (kl < next[b + w]) {
            next[b + w] = kl;
            arg[b + w] = static_cast<std::uint16_t>(j);
          }
        }
      }
      // "Within b units": carry the better smaller budget forward (and its choice).
      for (std::size_t b = 1; b < next.size(); ++b)
        if (next[b - 1] <= next[b]) {
          next[b] = next[b - 1];
          arg[b] = kCarried;
        }
      best = std::move(next);
      args_.push_back(std::move(arg));
    }
    best_ = std::move(best);
  }

  /// The fewest units whose least KL is <= kl, or nullopt.
  std::optional<std::uint64_t> units_for_kl(double kl) const {
    for (std::size_t b = 0; b < best_.size(); ++b)
      if (std::isfinite(best_[b]) && best_[b] <= kl) return b;
    return std::nullopt;
  }
  /// The choice of least KL whose block linears take at most `bytes`, or
  /// nullopt when none fit. Units rounded up overstate a choice by up to a unit
  /// per layer: budgets that far beyond are tried too, from the largest down,
  /// and the first choice that really fits is taken.
  std::optional<Choice> within(double bytes) const {
    const double top = std::floor(bytes / static_cast<double>(unit_)) + static_cast<double>(s_.layers.size());
    std::uint64_t b = top >= static_cast<double>(best_.size() - 1) ? best_.size() - 1 : static_cast<std::uint64_t>(top);
    for (;; --b) {
      if (std::isfinite(best_[b])) {
        Choice c = choice(b);
        double used = 0;
        for (std::size_t i = 0; i < c.size(); ++i) used += static_cast<double>(s_.layers[i].candidates[c[i]].bytes);
        if (used <= bytes) return c;
      }
      if (b == 0) return std::nullopt;
    }
  }
  /// The choice of least KL within `b` units.
  Choice choice(std::uint64_t b) const {
    Choice c(s_.layers.size());
    for (std::size_t i = s_.layers.size(); i-- > 0;) {
      while (args_[i][b] & kCarried) --b;  // the budget that was carried forward
      c[i] = args_[i][b];
      b -= units(s_.layers[i].candidates[c[i]].bytes);
    }
    return c;
  }

 private:
  static constexpr std::uint16_t kCarried = 0x8000;
  std::uint64_t units(std::uint64_t bytes) const { return (bytes + unit_ - 1) / unit_; }
  const Sensitivity& s_;
  std::uint64_t unit_ = 1;
  std::vector<double> best_;
  std::vector<std::vector<std::uint16_t>> args_;
};

// The plan of `choice`: its most common format as the base, the others by module.
SolvedPlan make_plan(const Sensitivity& s, const Choice& choice) {
  std::map<std::string, std::pair<int, QuantSpec>> counts;
  std::vector<std::string> order;
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    if (s.layers[i].kept_unless_named()) continue;  // the base is the block linears'
    const QuantSpec& spec = s.layers[i].candidates[choice[i]].spec;
    const std::string key = spec_json(spec).dump();
    if (!counts.contains(key)) order.push_back(key);
    auto& [n, kept] = counts[key];
    ++n;
    kept = spec;
  }
  std::string base_key = order.front();
  for (const std::string& key : order)
    if (counts[key].first > counts[base_key].first) base_key = key;
  SolvedPlan out;
  out.plan.base = counts[base_key].second;
  out.plan.activations = s.activations;
  double var = 0;
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    const CandidateCost& c = s.layers[i].candidates[choice[i]];
    // lm_head or the embeddings unnamed stay as the checkpoint stores them (as measured: held); a block linear
    // unnamed takes the base.
    if (s.layers[i].kept_unless_named() ? !c.held : spec_json(c.spec).dump() != base_key)
      out.plan.tensors[s.layers[i].module()] = c.spec;
    var += c.kl_stderr * c.kl_stderr;
  }
  const Totals t = totals(s, choice);
  out.bytes = t.bytes;
  out.predicted_kl = t.kl;
  out.predicted_kl_stderr = std::sqrt(var);
  out.bits_per_weight = 8.0 * static_cast<double>(t.bytes) / static_cast<double>(s.total_params());
  return out;
}

void require_measured(const Sensitivity& s) {
  if (s.layers.empty()) fail("the sensitivity measurement holds no layers");
  for (const LayerCost& l : s.layers)
    if (l.candidates.empty() || l.candidates.size() >= 0x8000)
      fail("the sensitivity measurement has {} candidates for {} (1 to 32767)", l.candidates.size(), l.module());
}

}  // namespace

std::string LayerCost::module() const {
  return is_lm_head() ? std::string(kLmHeadModule) : is_embeddings() ? std::string(kEmbeddingsModule)
                                                                      : plan_module(layer, role);
}

std::optional<QuantSpec> LayerCost::format_in(const QuantPlan& plan) const {
  return is_lm_head() ? plan.lm_head() : is_embeddings() ? plan.embeddings()
                                                         : std::optional<QuantSpec>(plan.linear(layer, role));
}

const LayerCost* Sensitivity::planned(std::int64_t layer) const {
  const auto it = std::find_if(layers.begin(), layers.end(), [&](const LayerCost& l) { return l.layer == layer; });
  return it == layers.end() ? nullptr : &*it;
}

std::int64_t Sensitivity::total_params() const {
  std::int64_t n = other_params;
  for (const LayerCost& l : layers) n += l.params;
  return n;
}

std::vector<QuantSpec> default_candidates(std::int64_t k) {
  std::vector<QuantSpec> out{QuantSpec{LowBit::kFp16}, QuantSpec{LowBit::kSymInt8, -1}};
  if (k > 32) out.push_back({LowBit::kSymInt8, 32});
  for (const LowBit type : {LowBit::kSymInt4, LowBit::kAsymInt4}) {
    for (const std::int64_t g : {32, 64, 128})
      if (g < k) out.push_back({type, g});
    out.push_back({type, -1});
  }
  if (k % kquant::kSuperBlock == 0)
    for (const LowBit type : {LowBit::kQ6_K, LowBit::kQ5_K, LowBit::kQ4_K, LowBit::kQ3_K, LowBit::kQ2_K})
      out.push_back({type, kquant::kSuperBlock});
  return out;
}

std::vector<QuantSpec> gguf_candidates(std::int64_t k) {
  std::vector<QuantSpec> out{QuantSpec{LowBit::kFp16}};
  if (k % 32 == 0) {  // else GGUF's Q4_0 / Q8_0 blocks do not fit: F16 only
    out.push_back({LowBit::kSymInt8, 32});
    out.push_back({LowBit::kSymInt4, 32});
  }
  if (k % kquant::kSuperBlock == 0)
    for (const LowBit type : {LowBit::kQ6_K, LowBit::kQ5_K, LowBit::kQ4_K, LowBit::kQ3_K, LowBit::kQ2_K})
      out.push_back({type, kquant::kSuperBlock});
  return out;
}

namespace {

// Candidate `spec` of the float matrix `w`, laid out for the kernels.
QuantMatrix candidate_matrix(const QuantMatrix& w, const QuantSpec& spec, std::optional<Activations> activations,
                             ThreadPool& pool) {
  const RowReader read = [&w](std::int64_t r, float* out) { widen_row(w, r, out); };
  QuantMatrix q = quantize_matrix(read, w.rows, w.cols, spec, &pool);
  ready_for_kernels(q, activations, false, pool);
  return q;
}

// Whether candidate `spec` of the float matrix `w` is `w` itself (the float format it is held in): then its
// outputs are the float model's, its KL and output error exactly 0, and no pass is run for it.
bool is_held_format(const QuantMatrix& w, const QuantSpec& spec) {
  return is_float_format(spec.type) && spec.type == w.type;
}

void require_float(const QuantMatrix& w, std::int64_t layer, LinearRole role) {
  if (!is_float_format(w.type))
    fail("{}: is {}, not float: measure the float model (--low-bit fp32)", plan_module(layer, role),
         low_bit_name(w.type));
}

}  // namespace

BlockSource float_block_source(const TensorStore& store, LlamaModel& model, const QuantSpec& held, ThreadPool& pool) {
  return [&store, &model, held, &pool](std::int64_t layer, bool load) {
    std::vector<float> w;
    for (const LinearSpec& spec : kBlockLinears) {
      QuantMatrix& slot = model.block_linear(layer, spec.role);
      if (!load) {
        slot = QuantMatrix{};
        continue;
      }
      read_float_linear(store, model.config(), layer, spec.role, w);
      const auto [n, k] = block_linear_shape(model.config(), spec.role);
      slot = quantize_matrix(w.data(), n, k, held, &pool);
    }
  };
}

std::vector<char> error_row_sample(std::int64_t total, std::int64_t n) {
  std::vector<char> taken(static_cast<std::size_t>(std::max<std::int64_t>(total, 0)), n <= 0 || n >= total);
  if (n <= 0 || n >= total) return taken;
  constexpr double kGolden = 0.6180339887498949;  // (sqrt(5) - 1) / 2
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t first = i * total / n, width = (i + 1) * total / n - first;
    const double offset = static_cast<double>(i) * kGolden;
    taken[static_cast<std::size_t>(first + static_cast<std::int64_t>((offset - std::floor(offset)) * static_cast<double>(width)))] = 1;
  }
  return taken;
}

namespace {

// The anchor of estimate_sensitivity among `specs`: sym_int4 g32 when offered, else none (the candidate of
// largest output error).
std::optional<std::size_t> preferred_anchor(const std::vector<QuantSpec>& specs) {
  for (std::size_t j = 0; j < specs.size(); ++j)
    if (specs[j].type == LowBit::kSymInt4 && specs[j].group_size == 32) return j;
  return std::nullopt;
}

// estimate_sensitivity's KLs of `cost`'s candidates: the anchor's (candidate a) measured one, `st`; the others'
// scaled from it by their output error `err` over the anchor's.
void scale_from_anchor(LayerCost& cost, const std::vector<double>& err, std::size_t a, const CompareStats& st) {
  for (std::size_t j = 0; j < cost.candidates.size(); ++j) {
    const double scale = err[a] > 0 ? err[j] / err[a] : 0.0;
    cost.candidates[j].kl = j == a ? st.mean_kl : st.mean_kl * scale;
    cost.candidates[j].kl_stderr = j == a ? st.kl_stderr : st.kl_stderr * scale;
  }
}

// What both measures share: the float model's distributions on the calibration
// text, the Sensitivity's fixed fields, the calibration sequences' hidden
// states at the input of the block being measured (the float model's, carried
// block by block; all sequences one after another, each block run on all of
// them in one pass), and the KL with one linear of that block swapped,
// computed from those states on (the blocks before it are the float model's,
// unchanged).
struct Measuring {
  // A block runs on groups of sequences of at most this many tokens (one sequence at least): its weights are
  // read once per group, and its activations held for one group.
  static constexpr std::int64_t kGroupTokens = 1024;

  // `reference`: the float model's distributions now (write_reference), or from the last block's states
  // (settle_pending, for a model whose blocks come one at a time).
  Measuring(LlamaModel& m, const ScoringPlan& c, std::uint64_t other_bytes, std::int64_t other_params,
            std::optional<Activations> activations, bool reference = true)
      : model(m), calib(c), ref(RefLogprobFile::create("", c, m.config().vocab_size)) {
    if (reference) write_reference(model, calib, 0, ref);
    s.positions = calib.scored_tokens();
    s.other_bytes = other_bytes;
    s.other_params = other_params;
    s.activations = activations;
    for (const auto& seq : calib.sequences) {
      const auto n = static_cast<std::int64_t>(tokens.size()), t = static_cast<std::int64_t>(seq.size());
      if (groups.empty() || n + t - offsets[groups.back()] > kGroupTokens) groups.push_back(lengths.size());
      offsets.push_back(n);
      lengths.push_back(t);
      tokens.insert(tokens.end(), seq.begin(), seq.end());
    }
    groups.push_back(lengths.size());
    hidden.resize(tokens.size() * static_cast<std::size_t>(model.config().hidden_size));
    model.embed(tokens, hidden.data());
  }
  // Block `block` of the float model run on a copy of `hidden` (calling `observe` with each linear's input, all
  // sequences' rows at once): the next block's input.
  std::vector<float> run_block(const LlamaModel::LinearObserver& observe = nullptr) {
    std::vector<float> out = hidden;
    run_blocks(block, block + 1, out, observe);
    return out;
  }
  // On to the next block, whose input run_block gave.
  void advance(std::vector<float> next) {
    hidden = std::move(next);
    ++block;
  }
  // The model's KL against the reference with `slot` (a linear of block `block`) replaced by `w`; `slot` is
  // restored after. The same bits as compare_with_reference on the whole model (forward_block and head are
  // forward's block and head, and the kernels do not depend on the batch).
  CompareStats kl_with(QuantMatrix& slot, QuantMatrix w) {
    QuantMatrix original = std::move(slot);
    slot = std::move(w);
    CompareStats st;
    try {
      st = kl_from_block();
    } catch (...) {
      slot = std::move(original);
      throw;
    }
    slot = std::move(original);
    return st;
  }
  // The layers measured: the block linears, and lm_head and the embeddings when they are planned.
  std::int64_t linears() const {
    return model.config().num_hidden_layers * static_cast<std::int64_t>(kBlockLinears.size()) +
           (plans_lm_head() ? 1 : 0) + (plans_embeddings() ? 1 : 0);
  }
  // The embeddings are planned when they are their own float matrix (tied, they are also lm_head).
  bool plans_embeddings() const {
    return !model.config().tie_word_embeddings && is_float_format(model.embeddings().type);
  }
  // lm_head is planned when it is its own float matrix (tied to the embeddings it is not a linear of its own).
  bool plans_lm_head() const {
    const QuantMatrix* head = model.untied_lm_head();
    return head != nullptr && is_float_format(head->type);
  }
  // lm_head's candidates, from the last block's output (block == the layer count): first lm_head as held (KL 0;
  // a plan that leaves lm_head out keeps it so), then each other candidate by one pass of lm_head alone (exact,
  // in both measures). Its weights move from other_bytes / other_params to its LayerCost.
  void measure_lm_head(const std::function<std::vector<QuantSpec>(std::int64_t k)>& candidates, ThreadPool& pool,
                       const Progress& progress) {
    if (!plans_lm_head()) return;
    QuantMatrix& head = *model.untied_lm_head();
    LayerCost cost{kLmHeadLayer, LinearRole::kQ, head.rows * head.cols, {}};
    cost.candidates.push_back({QuantSpec{head.type}, head.bytes(), 0, 0, true});
    for (const QuantSpec& spec : candidates(head.cols)) {
      if (is_held_format(head, spec)) continue;
      QuantMatrix w = candidate_matrix(head, spec, s.activations, pool);
      const std::uint64_t bytes = w.bytes();
      const CompareStats st = kl_with(head, std::move(w));
      cost.candidates.push_back({spec, bytes, st.mean_kl, st.kl_stderr});
    }
    s.other_bytes -= head.bytes();
    s.other_params -= cost.params;
    s.layers.push_back(std::move(cost));
    if (progress) progress(static_cast<std::int64_t>(s.layers.size()), linears());
  }

  // The embeddings' candidates, at block 0 (before any advance): first the embeddings as held (KL 0; a plan
  // that leaves them out keeps them so), then each other candidate with its rows looked up. Its KL: a whole-model
  // pass (`taken` null), or, estimated, the anchor's KL (pending) scaled by the candidate's error
  // ||E_c[t] - E[t]||^2 over the tokens t of the taken rows. Only the rows of the calibration tokens are
  // quantized (every format rounds a row on its own); the bytes are the whole matrix's. Their weights move from
  // other_bytes / other_params to their LayerCost, which finish() puts last.
  void measure_embeddings(const std::function<std::vector<QuantSpec>(std::int64_t k)>& candidates, ThreadPool& pool,
                          const std::vector<char>* taken) {
    if (!plans_embeddings()) return;
    if (block != 0) fail("internal: the embeddings are measured before block 0 runs");
    const QuantMatrix& e = model.embeddings();
    const std::int64_t h = e.cols;
    LayerCost cost{kEmbeddingsLayer, LinearRole::kQ, e.rows * e.cols, {}};
    cost.candidates.push_back({QuantSpec{e.type}, e.bytes(), 0, 0, true});
    // The calibration's distinct tokens (the rows quantized), and each token's row among them.
    std::vector<std::int32_t> used(tokens.begin(), tokens.end());
    std::sort(used.begin(), used.end());
    used.erase(std::unique(used.begin(), used.end()), used.end());
    const auto row_of = [&](std::int32_t t) { return std::lower_bound(used.begin(), used.end(), t) - used.begin(); };
    std::vector<std::int32_t> looked;  // the taken rows' tokens
    for (std::size_t r = 0; taken != nullptr && r < tokens.size(); ++r)
      if ((*taken)[r]) looked.push_back(tokens[r]);
    std::vector<float> ref_rows(looked.size() * static_cast<std::size_t>(h)), row(static_cast<std::size_t>(h));
    model.embed(looked, ref_rows.data());
    // The states at block 0 with candidate rows `w` looked up.
    const auto embed_with = [&](const QuantMatrix& w) {
      std::vector<float> x(hidden.size());
      for (std::size_t i = 0; i < tokens.size(); ++i) dequantize_row(w, row_of(tokens[i]), x.data() + i * h);
      return x;
    };
    const std::vector<QuantSpec> specs = candidates(h);
    const std::optional<std::size_t> preferred = preferred_anchor(specs);
    std::vector<double> err{0.0};
    std::optional<QuantMatrix> anchor;
    std::size_t a = 0;
    for (std::size_t j = 0; j < specs.size(); ++j) {
      if (is_held_format(e, specs[j])) continue;
      QuantMatrix w = quantize_matrix([&](std::int64_t r, float* out) { widen_row(e, used[r], out); },
                                            static_cast<std::int64_t>(used.size()), h, specs[j], &pool);
      const std::uint64_t bytes = allocate_matrix(e.rows, e.cols, specs[j]).bytes();
      if (taken == nullptr) {
        const CompareStats st = kl_with_input(embed_with(w));
        cost.candidates.push_back({specs[j], bytes, st.mean_kl, st.kl_stderr});
        continue;
      }
      double x = 0;
      for (std::size_t i = 0; i < looked.size(); ++i) {
        dequantize_row(w, row_of(looked[i]), row.data());
        for (std::int64_t c = 0; c < h; ++c) {
          const double d = static_cast<double>(row[static_cast<std::size_t>(c)]) - ref_rows[i * h + c];
          x += d * d;
        }
      }
      err.push_back(x);
      cost.candidates.push_back({specs[j], bytes, 0, 0});
      if (preferred ? j == *preferred : !anchor || x > err[a]) {
        a = cost.candidates.size() - 1;
        anchor = std::move(w);
      }
    }
    if (taken != nullptr && anchor) pending.push_back({kEmbeddingsPending, std::move(err), a, embed_with(*anchor)});
    s.other_bytes -= e.bytes();
    s.other_params -= cost.params;
    embeddings_cost = std::move(cost);
  }
  // An estimate's anchor whose KL is taken after the last block: the calibration sequences' states with the
  // anchor in place, carried through each block as it comes (a model whose blocks are read one at a time holds
  // these instead of its weights).
  static constexpr std::size_t kEmbeddingsPending = static_cast<std::size_t>(-1);
  struct Pending {
    std::size_t layer;        // its index in s.layers, or kEmbeddingsPending
    std::vector<double> err;  // every candidate's output error
    std::size_t anchor;       // the anchor's candidate
    std::vector<float> x;     // the states at the input of block `block`
  };
  // Carries every pending anchor's states through block `block` (before advance()).
  void carry_pending() {
    for (Pending& p : pending) run_blocks(block, block + 1, p.x, nullptr, true);
  }
  // Block `block` run on a copy of `hidden` with `slot` replaced by `w` (restored after): layers[layer]'s anchor,
  // pending.
  void pend(std::size_t layer, QuantMatrix& slot, QuantMatrix w, std::vector<double> err, std::size_t anchor) {
    std::vector<float> x = hidden;
    std::swap(slot, w);
    try {
      run_blocks(block, block + 1, x, nullptr, true);
    } catch (...) {
      std::swap(slot, w);
      throw;
    }
    std::swap(slot, w);
    pending.push_back({layer, std::move(err), anchor, std::move(x)});
  }
  // After the last block (`hidden` its float output): the reference distributions from `hidden` (what
  // write_reference gives, the same bits), then every pending anchor's KL, scaled to its layer's other candidates.
  void settle_pending() {
    const ModelConfig& c = model.config();
    if (block != c.num_hidden_layers) fail("internal: pending anchors settled at block {}", block);
    std::vector<float> logits;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::int64_t n = lengths[i], first = calib.first_scored;
      if (first >= n - 1) continue;
      model.head(hidden.data() + (offsets[i] + first) * c.hidden_size, n - 1 - first, logits);
      for (std::int64_t j = 0; j < n - 1 - first; ++j) ref.write_logits(logits.data() + j * c.vocab_size);
    }
    ref.finish();
    for (Pending& p : pending) {
      LayerCost& cost = p.layer == kEmbeddingsPending ? *embeddings_cost : s.layers[p.layer];
      scale_from_anchor(cost, p.err, p.anchor, score(p.x));
      p.x = {};
    }
    pending.clear();
  }
  // The measurement's end: the embeddings' LayerCost last, and the wall time.
  void finish(const Progress& progress) {
    if (embeddings_cost) {
      s.layers.push_back(std::move(*embeddings_cost));
      if (progress) progress(static_cast<std::int64_t>(s.layers.size()), linears());
    }
    s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }

  LlamaModel& model;
  const ScoringPlan& calib;
  RefLogprobFile ref;
  Sensitivity s;
  std::vector<std::int32_t> tokens;            // all sequences' tokens, one after another
  std::optional<LayerCost> embeddings_cost;    // measure_embeddings', until finish()
  std::vector<Pending> pending;                // the estimate's anchors, until settle_pending()
  std::vector<std::int64_t> lengths, offsets;  // per sequence: tokens, first row in `hidden`
  std::vector<std::size_t> groups;             // the first sequence of each group, then the number of sequences
  std::vector<float> hidden;                   // [all sequences' tokens, hidden]: block `block`'s input
  std::int64_t block = 0;
  const std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

 private:
  // Blocks [first, last) of the float model on x (the sequences one after another, as `hidden`), group by group
  // in order (each group's rows through all the blocks, then the next group's). With `scored_only`, the
  // model's last block computes only the rows from first_scored on (the others give keys and values).
  void run_blocks(std::int64_t first, std::int64_t last, std::vector<float>& x, const LlamaModel::LinearObserver& observe,
                  bool scored_only = false) {
    const std::int64_t h = model.config().hidden_size;
    for (std::size_t g = 0; g + 1 < groups.size(); ++g) {
      const std::span<const std::int64_t> group(lengths.data() + groups[g], groups[g + 1] - groups[g]);
      std::vector<std::int64_t> unscored;
      for (const std::int64_t n : group) unscored.push_back(std::min(calib.first_scored, n));
      for (std::int64_t l = first; l < last; ++l) {
        const bool skip = scored_only && l == model.config().num_hidden_layers - 1;
        model.forward_block(l, x.data() + offsets[groups[g]] * h, group, observe, nullptr,
                            skip ? std::span<const std::int64_t>(unscored) : std::span<const std::int64_t>());
      }
    }
  }
  // The model's KL with `x` in place of `hidden` (block `block`'s input).
  CompareStats kl_with_input(std::vector<float> x) {
    std::swap(hidden, x);
    CompareStats st;
    try {
      st = kl_from_block();
    } catch (...) {
      std::swap(hidden, x);
      throw;
    }
    std::swap(hidden, x);
    return st;
  }
  // run_plan's scoring (positions first_scored .. T - 2 of every sequence, in order) from block `block` on.
  CompareStats kl_from_block() {
    std::vector<float> x = hidden;
    run_blocks(block, model.config().num_hidden_layers, x, nullptr, true);
    return score(x);
  }
  // run_plan's scoring of the last block's output `x` against the reference.
  CompareStats score(const std::vector<float>& x) {
    const ModelConfig& c = model.config();
    CompareAccumulator acc(c.vocab_size);
    std::vector<float> logits, row(static_cast<std::size_t>(c.vocab_size));
    ref.rewind();
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::int64_t n = lengths[i], first = calib.first_scored;
      if (first >= n - 1) continue;
      model.head(x.data() + (offsets[i] + first) * c.hidden_size, n - 1 - first, logits);
      for (std::int64_t j = first; j < n - 1; ++j) {
        ref.read(row.data());
        acc.add(row.data(), logits.data() + (j - first) * c.vocab_size, calib.sequences[i][static_cast<std::size_t>(j + 1)]);
      }
    }
    ref.expect_end();
    return acc.result();
  }
};

}  // namespace

Sensitivity measure_sensitivity(LlamaModel& model, const ScoringPlan& calib, ThreadPool& pool,
                                std::uint64_t other_bytes, std::int64_t other_params,
                                const std::function<std::vector<QuantSpec>(std::int64_t k)>& candidates,
                                std::optional<Activations> activations, const Progress& progress) {
  Measuring m(model, calib, other_bytes, other_params, activations);
  m.measure_embeddings(candidates, pool, nullptr);
  for (std::int64_t l = 0; l < model.config().num_hidden_layers; ++l) {
    for (const LinearSpec& role : kBlockLinears) {
      QuantMatrix& slot = model.block_linear(l, role.role);
      require_float(slot, l, role.role);
      LayerCost cost{l, role.role, slot.rows * slot.cols, {}};
      for (const QuantSpec& spec : candidates(slot.cols)) {
        if (is_held_format(slot, spec)) {
          cost.candidates.push_back({spec, slot.bytes(), 0, 0, true});
          continue;
        }
        QuantMatrix w = candidate_matrix(slot, spec, activations, pool);
        const std::uint64_t bytes = w.bytes();
        const CompareStats st = m.kl_with(slot, std::move(w));
        cost.candidates.push_back({spec, bytes, st.mean_kl, st.kl_stderr});
      }
      m.s.layers.push_back(std::move(cost));
      if (progress) progress(static_cast<std::int64_t>(m.s.layers.size()), m.linears());
    }
    if (l + 1 < model.config().num_hidden_layers || m.plans_lm_head()) m.advance(m.run_block());
  }
  m.measure_lm_head(candidates, pool, progress);
  m.finish(progress);
  return m.s;
}

namespace {

// estimate_sensitivity's costs of block linear `role` of block m.block: every candidate's output error on the
// linear's float inputs `x` (the taken rows, [rows, k]), its anchor pending (m.pend) unless every candidate is the
// layer as held.
LayerCost estimate_linear(Measuring& m, LinearRole role, std::vector<float>& x,
                          const std::function<std::vector<QuantSpec>(std::int64_t k)>& candidates, ThreadPool& pool) {
  QuantMatrix& slot = m.model.block_linear(m.block, role);
  require_float(slot, m.block, role);
  LayerCost cost{m.block, role, slot.rows * slot.cols, {}};
  const std::int64_t rows = static_cast<std::int64_t>(x.size()) / slot.cols;
  // This linear's float output, once for all its candidates (one linear's at a time in memory).
  std::vector<float> y(static_cast<std::size_t>(rows * slot.rows)), yq(y.size());
  matmul(slot, x.data(), rows, y.data(), pool);
  const std::vector<QuantSpec> specs = candidates(slot.cols);
  const std::optional<std::size_t> preferred = preferred_anchor(specs);
  std::vector<double> err;
  std::optional<QuantMatrix> anchor;  // the anchor's matrix, kept for its KL
  std::size_t a = 0;
  for (std::size_t j = 0; j < specs.size(); ++j) {
    if (is_held_format(slot, specs[j])) {
      err.push_back(0);
      cost.candidates.push_back({specs[j], slot.bytes(), 0, 0, true});
      continue;
    }
    QuantMatrix w = candidate_matrix(slot, specs[j], m.s.activations, pool);
    matmul(w, x.data(), rows, yq.data(), pool);
    double e = 0;
    for (std::size_t i = 0; i < y.size(); ++i) e += (static_cast<double>(yq[i]) - y[i]) * (yq[i] - y[i]);
    err.push_back(e);
    cost.candidates.push_back({specs[j], w.bytes(), 0, 0});
    if (preferred ? j == *preferred : !anchor || e > err[a]) {
      a = j;
      anchor = std::move(w);
    }
  }
  x = {};
  // The anchor's KL after the last block; the others scaled from it (none to measure when every candidate is the
  // layer as held).
  if (anchor)
    m.pend(m.s.layers.size(), slot, std::move(*anchor), std::move(err), a);
  else
    scale_from_anchor(cost, err, a, CompareStats{});
  return cost;
}

}  // namespace

Sensitivity estimate_sensitivity(LlamaModel& model, const ScoringPlan& calib, ThreadPool& pool,
                                 std::uint64_t other_bytes, std::int64_t other_params,
                                 const std::function<std::vector<QuantSpec>(std::int64_t k)>& candidates,
                                 std::optional<Activations> activations, std::int64_t error_rows,
                                 const Progress& progress, const BlockSource& blocks) {
  Measuring m(model, calib, other_bytes, other_params, activations, false);
  Sensitivity& s = m.s;
  s.estimated = true;
  const ModelConfig& c = model.config();
  const std::int64_t total = static_cast<std::int64_t>(m.hidden.size()) / c.hidden_size;
  const std::vector<char> taken = error_row_sample(total, error_rows);
  s.error_rows = std::count(taken.begin(), taken.end(), 1);
  m.measure_embeddings(candidates, pool, &taken);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (blocks) blocks(l, true);
    m.carry_pending();
    // The input of each linear of block l on the taken rows.
    std::array<std::vector<float>, kBlockLinears.size()> inputs;
    std::array<std::int64_t, kBlockLinears.size()> seen{};
    std::vector<float> next = m.run_block([&](LinearRole role, const float* x, std::int64_t rows) {
      const auto i = static_cast<std::size_t>(role);
      const std::int64_t k = model.block_linear(l, role).cols;
      for (std::int64_t r = 0; r < rows; ++r)  // group after group, in order
        if (taken[static_cast<std::size_t>(seen[i] + r)]) inputs[i].insert(inputs[i].end(), x + r * k, x + (r + 1) * k);
      seen[i] += rows;
    });
    for (const LinearSpec& role : kBlockLinears) {
      s.layers.push_back(estimate_linear(m, role.role, inputs[static_cast<std::size_t>(role.role)], candidates, pool));
      if (progress) progress(static_cast<std::int64_t>(s.layers.size()), m.linears());
    }
    m.advance(std::move(next));
    if (blocks) blocks(l, false);
  }
  m.settle_pending();
  m.measure_lm_head(candidates, pool, progress);
  m.finish(progress);
  return s;
}

nlohmann::ordered_json sensitivity_json(const Sensitivity& s) {
  nlohmann::ordered_json j;
  j["woq_sensitivity"] = 1;
  j["model"] = s.model;
  if (s.activations) j["activations"] = std::string(activations_name(*s.activations));
  j["positions"] = s.positions;
  j["other_bytes"] = s.other_bytes;
  j["other_params"] = s.other_params;
  j["seconds"] = s.seconds;
  j["estimated"] = s.estimated;
  if (s.estimated) j["error_rows"] = s.error_rows;
  j["calib_digest"] = s.calib_digest;
  nlohmann::ordered_json layers = nlohmann::ordered_json::array();
  for (const LayerCost& l : s.layers) {
    nlohmann::ordered_json cs = nlohmann::ordered_json::array();
    for (const CandidateCost& c : l.candidates) {
      cs.push_back({{"format", spec_json(c.spec)}, {"bytes", c.bytes}, {"kl", c.kl}, {"kl_stderr", c.kl_stderr}});
      if (c.held) cs.back()["held"] = true;
    }
    layers.push_back({{"module", l.module()}, {"params", l.params}, {"candidates", std::move(cs)}});
  }
  j["layers"] = std::move(layers);
  return j;
}

Sensitivity parse_sensitivity(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object() || !j.contains("woq_sensitivity") || j["woq_sensitivity"] != 1)
    fail("{}: not a woq sensitivity measurement (field 'woq_sensitivity' must be 1)", source);
  const JsonFields f(j, source);
  Sensitivity s;
  s.model = f.string("model", "");
  if (f.has("activations")) {
    try {
      s.activations = parse_activations(f.string("activations", ""));
    } catch (const Error& e) {
      fail("{}: activations: {}", source, e.what());
    }
  }
  s.positions = f.integer("positions");
  s.other_params = f.integer("other_params");
  const std::int64_t other_bytes = f.integer("other_bytes");
  if (s.positions <= 0 || s.other_params < 0 || other_bytes < 0 || s.other_params > kMaxCount ||
      other_bytes > kMaxCount)
    fail("{}: positions must be positive, other_bytes and other_params in [0, 2^48]", source);
  s.other_bytes = static_cast<std::uint64_t>(other_bytes);
  s.seconds = f.number("seconds", 0.0);
  s.estimated = f.boolean("estimated", false);
  s.error_rows = f.opt_integer("error_rows").value_or(0);
  if (s.error_rows < 0 || s.error_rows > kMaxCount || (!s.estimated && s.error_rows != 0))
    fail("{}: error_rows must be in [0, 2^48], and only in an estimated measurement", source);
  s.calib_digest = f.string("calib_digest", "");
  if (!j.contains("layers") || !j["layers"].is_array() || j["layers"].size() > 65536)
    fail("{}: 'layers' must be an array of at most 65536", source);
  int last_rank = 0;  // 0: block linears, 1: lm_head, 2: the embeddings (in this order, the last two once each)
  for (std::size_t i = 0; i < j["layers"].size(); ++i) {
    const std::string what = fmt::format("{}: layers[{}]", source, i);
    const JsonFields lf(j["layers"][i], what);
    const std::string module = lf.string("module", "");
    const auto parsed = parse_module(module);
    const bool head = module == kLmHeadModule, embeddings = module == kEmbeddingsModule;
    if (!parsed && !head && !embeddings)
      fail("{}.module: '{}' is not a block linear, lm_head or model.embed_tokens", what, module);
    const int rank = embeddings ? 2 : head ? 1 : 0;
    if (rank < last_rank || (rank > 0 && rank == last_rank))
      fail("{}.module: {}: lm_head and then model.embed_tokens come after the block linears, each once", what, module);
    last_rank = rank;
    LayerCost l{head ? kLmHeadLayer : embeddings ? kEmbeddingsLayer : parsed->first,
                parsed ? parsed->second : LinearRole::kQ, lf.integer("params"), {}};
    if (l.params <= 0 || l.params > kMaxCount) fail("{}.params: must be in [1, 2^48]", what);
    if (!lf.json().contains("candidates") || !lf.json()["candidates"].is_array() || lf.json()["candidates"].empty())
      fail("{}.candidates: must be a non-empty array", what);
    for (std::size_t k = 0; k < lf.json()["candidates"].size(); ++k) {
      const std::string cw = fmt::format("{}.candidates[{}]", what, k);
      const JsonFields cf(lf.json()["candidates"][k], cw);
      CandidateCost c;
      if (!cf.has("format")) fail("{}: 'format' is missing", cw);
      c.spec = parse_spec(cf.json()["format"], cw + ".format");
      const std::int64_t bytes = cf.integer("bytes");
      c.kl = cf.number("kl");
      c.kl_stderr = cf.number("kl_stderr", 0.0);
      c.held = cf.boolean("held", false);
      if (c.held && (c.kl != 0 || c.kl_stderr != 0)) fail("{}: a held candidate (the layer as stored) has kl 0", cw);
      if (bytes <= 0 || bytes > kMaxCount || !std::isfinite(c.kl) || c.kl < 0 || !std::isfinite(c.kl_stderr) ||
          c.kl_stderr < 0)
        fail("{}: bytes must be in [1, 2^48] and kl, kl_stderr finite and >= 0", cw);
      c.bytes = static_cast<std::uint64_t>(bytes);
      l.candidates.push_back(c);
    }
    const auto held = std::count_if(l.candidates.begin(), l.candidates.end(), [](const CandidateCost& c) { return c.held; });
    if (l.kept_unless_named() ? held != 1 || !l.candidates.front().held : held > 1)
      fail("{}.candidates: {}", what,
           l.kept_unless_named()
               ? fmt::format("{}'s first candidate, and no other, is the held one ({} as stored)", module, module)
               : std::string("at most one candidate is the held one (the layer as stored)"));
    s.layers.push_back(std::move(l));
  }
  require_measured(s);
  return s;
}

SolvedPlan solve_for_kl(const Sensitivity& s, double target_kl) {
  require_measured(s);
  if (!(target_kl > 0) || !std::isfinite(target_kl)) fail("--target-kl must be positive and finite, got {}", target_kl);
  const Knapsack k(s);
  const std::optional<std::uint64_t> units = k.units_for_kl(target_kl);
  if (!units) {
    double least = 0;
    for (const LayerCost& l : s.layers) {
      double m = std::numeric_limits<double>::infinity();
      for (const CandidateCost& c : l.candidates) m = std::min(m, c.kl);
      least += m;
    }
    fail("--target-kl {}: even the most accurate candidates predict a KL of {:.4g}", target_kl, least);
  }
  return make_plan(s, k.choice(*units));
}

double smallest_bpw(const Sensitivity& s) {
  require_measured(s);
  std::uint64_t smallest = s.other_bytes;
  for (const LayerCost& l : s.layers) {
    std::uint64_t m = std::numeric_limits<std::uint64_t>::max();
    for (const CandidateCost& c : l.candidates) m = std::min(m, c.bytes);
    smallest += m;
  }
  return 8.0 * static_cast<double>(smallest) / static_cast<double>(s.total_params());
}

SolvedPlan solve_for_bpw(const Sensitivity& s, double target_bpw) {
  require_measured(s);
  if (!(target_bpw > 0) || !std::isfinite(target_bpw)) fail("--target-bpw must be positive and finite, got {}", target_bpw);
  // Bytes the budget allows (a hair over, so that a bits-per-weight printed from a plan's bytes buys that plan).
  const double budget = target_bpw * static_cast<double>(s.total_params()) / 8.0 * (1 + 1e-12) -
                        static_cast<double>(s.other_bytes);
  const auto too_small = [&] {
    fail("--target-bpw {}: even the smallest candidates need {:.3f} bits per weight", target_bpw, smallest_bpw(s));
  };
  if (budget < 0) too_small();
  const std::optional<Choice> choice = Knapsack(s).within(budget);
  if (!choice) too_small();
  return make_plan(s, *choice);
}

SolvedPlan predict(const Sensitivity& s, const QuantPlan& plan) {
  require_measured(s);
  Choice choice(s.layers.size());
  for (std::size_t i = 0; i < s.layers.size(); ++i) {
    const LayerCost& l = s.layers[i];
    // lm_head or the embeddings left out of the plan are as held.
    const std::optional<QuantSpec> spec = l.format_in(plan);
    const auto it = std::find_if(l.candidates.begin(), l.candidates.end(), [&](const CandidateCost& c) {
      return spec ? spec_json(c.spec) == spec_json(*spec) : c.held;
    });
    if (it == l.candidates.end())
      fail("{}: the plan gives {} {}, which the measurement did not try", plan.source, l.module(),
           spec ? spec_name(*spec) : std::string("as stored"));
    choice[i] = static_cast<std::size_t>(it - l.candidates.begin());
  }
  SolvedPlan out = make_plan(s, choice);
  out.plan = plan;
  return out;
}

}  // namespace woq
