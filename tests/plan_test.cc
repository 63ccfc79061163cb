// Quantization plans (model/quant_plan.h) and the plan search
// (quantize/plan_search.h): the file format and its errors, the loader
// applying a plan per layer, the solver against brute force, and the
// measurement's prediction against the KL measured on held-out text.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>

#include "core/error.h"
#include "eval/compare.h"
#include "eval/reports.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "model/llama.h"
#include "model/load_request.h"
#include "model/quant_plan.h"
#include "model/random_checkpoint.h"
#include "io/quantized_checkpoint.h"
#include "kernels/matmul.h"
#include "quantize/gguf_export.h"
#include "quantize/plan_request.h"
#include "quantize/plan_search.h"
#include "quantize/quantize_checkpoint.h"
#include "quantize/quantize_request.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

using test::error_of;

// The make-random "tiny" preset (2 blocks of hidden 128, vocab 512, lm_head untied) with N(0, 0.08) weights
// seeded `seed`, written under `tmp`.
std::string write_tiny(const test::TempDir& tmp, std::uint64_t seed, ThreadPool& pool) {
  RandomCheckpointOptions r;
  r.preset = "tiny";
  r.seed = seed;
  r.weight_std = 0.08;
  const std::string dir = tmp.file("tiny");
  write_random_checkpoint(dir, r, pool);
  return dir;
}

TEST(QuantPlan, FileRoundTripsAndNamesEachLayersFormat) {
  const nlohmann::json j = nlohmann::json::parse(R"({"woq_plan": 1,
    "base": {"low_bit": "sym_int4", "group_size": 32},
    "tensors": {"model.layers.2.mlp.down_proj": {"low_bit": "sym_int8", "group_size": -1},
                "model.layers.0.self_attn.v_proj": {"low_bit": "q4_k"},
                "lm_head": {"low_bit": "asym_int4", "group_size": 64}},
    "verify": {"mean_kl": 0.01}})");
  const QuantPlan p = parse_plan(j, "p.json");
  EXPECT_EQ(p.linear(2, LinearRole::kDown).type, LowBit::kSymInt8);
  EXPECT_EQ(p.linear(2, LinearRole::kDown).group_size, -1);
  EXPECT_EQ(p.linear(0, LinearRole::kV).type, LowBit::kQ4_K);
  EXPECT_EQ(p.linear(1, LinearRole::kDown).type, LowBit::kSymInt4);  // the base
  ASSERT_TRUE(p.lm_head());
  EXPECT_EQ(p.lm_head()->group_size, 64);
  EXPECT_EQ(parse_plan(nlohmann::json::parse(plan_json(p).dump()), "again").tensors.size(), 3u);
  EXPECT_EQ(plan_json(p)["verify"]["mean_kl"], 0.01);
  EXPECT_NO_THROW(p.check_layers(3));
  EXPECT_NE(error_of([&] { p.check_layers(2); }).find("names layer 2, but the model has 2 layers"), std::string::npos);
}

TEST(QuantPlan, BadFilesAreRefusedNamingTheField) {
  const auto err = [](const char* text) { return error_of([&] { parse_plan(nlohmann::json::parse(text), "p.json"); }); };
  EXPECT_NE(err(R"({"woq_plan": 2, "base": {"low_bit": "fp16"}})").find("not a woq plan"), std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1})").find("'base' is missing"), std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "fp16"}, "extra": 1})").find("unknown field 'extra'"),
            std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "sym_int4"}})").find("p.json: base: 'group_size' is missing"),
            std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "sym_int5", "group_size": 32}})").find("p.json: base:"),
            std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "sym_int4", "group_size": 3}})").find("group_size 3"),
            std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "q4_k", "group_size": 32}})").find("fixed (256"),
            std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "fp16"},
                    "tensors": {"model.layers.01.mlp.up_proj": {"low_bit": "fp16"}}})")
                .find("tensors.model.layers.01.mlp.up_proj: not a block linear"),
            std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "fp16"},
                    "tensors": {"model.layers.-1.mlp.up_proj": {"low_bit": "fp16"}}})")
                .find("not a block linear"),
            std::string::npos);
  EXPECT_NE(err(R"({"woq_plan": 1, "base": {"low_bit": "fp16"},
                    "tensors": {"model.layers.0.mlp.up_proj": {"low_bit": "fp16", "bits": 4}}})")
                .find("unknown field 'bits'"),
            std::string::npos);
}

TEST(QuantPlan, TheLoaderGivesEachLayerItsPlannedFormat) {
  ThreadPool pool(2);
  auto plan = std::make_shared<QuantPlan>();
  plan->base = {LowBit::kSymInt4, 32};
  plan->tensors[plan_module(1, LinearRole::kDown)] = {LowBit::kSymInt8, -1};
  plan->tensors[plan_module(4, LinearRole::kQ)] = {LowBit::kAsymInt4, 64};
  plan->source = "test plan";
  LoadOptions o;
  o.linear = plan->base;
  o.plan = plan;
  LoadReport rep;
  auto m = LlamaModel::load(WOQ_MODEL_DIR, o, pool, &rep);
  EXPECT_EQ(m->block_linear(1, LinearRole::kDown).type, LowBit::kSymInt8);
  EXPECT_EQ(m->block_linear(1, LinearRole::kDown).group_size, m->block_linear(1, LinearRole::kDown).cols);
  EXPECT_EQ(m->block_linear(4, LinearRole::kQ).type, LowBit::kAsymInt4);
  EXPECT_EQ(m->block_linear(4, LinearRole::kQ).group_size, 64);
  EXPECT_EQ(m->block_linear(0, LinearRole::kDown).type, LowBit::kSymInt4);
  EXPECT_NE(rep.conversion.find("plan test plan (sym_int4 g32 x33"), std::string::npos) << rep.conversion;
  plan->tensors[plan_module(5, LinearRole::kQ)] = {LowBit::kFp16};
  EXPECT_NE(error_of([&] { LlamaModel::load(WOQ_MODEL_DIR, o, pool); }).find("the model has 5 layers"),
            std::string::npos);
}

// Every assignment of a small problem, for the least bytes within `target`.
std::uint64_t brute_force_bytes(const Sensitivity& s, double target) {
  std::uint64_t best = std::numeric_limits<std::uint64_t>::max();
  std::vector<std::size_t> pick(s.layers.size(), 0);
  for (;;) {
    std::uint64_t bytes = s.other_bytes;
    double kl = 0;
    for (std::size_t i = 0; i < pick.size(); ++i) {
      bytes += s.layers[i].candidates[pick[i]].bytes;
      kl += s.layers[i].candidates[pick[i]].kl;
    }
    if (kl <= target) best = std::min(best, bytes);
    std::size_t i = 0;
    while (i < pick.size() && ++pick[i] == s.layers[i].candidates.size()) pick[i++] = 0;
    if (i == pick.size()) return best;
  }
}

TEST(PlanSearch, SolvesEqualBruteForce) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> u(0, 1);
  const int trials = 200;
  for (int trial = 0; trial < trials; ++trial) {
    Sensitivity s;
    s.other_bytes = 1000;
    s.other_params = 100;
    s.positions = 10;
    for (int l = 0; l < 5; ++l) {
      LayerCost layer{l, LinearRole::kQ, 4096, {}};
      double kl = u(rng) * 0.001;
      std::uint64_t bytes = 8192;
      for (const std::int64_t g : {-1, 32, 64, 128}) {  // more bytes, less KL, with random sizes of step
        layer.candidates.push_back({QuantSpec{LowBit::kSymInt4, g}, bytes, kl, 0});
        bytes -= static_cast<std::uint64_t>(500 + 2000 * u(rng));
        kl += u(rng) * 0.01;
      }
      s.layers.push_back(layer);
    }
    const double target = 0.005 + 0.03 * u(rng);
    const SolvedPlan p = solve_for_kl(s, target);
    ASSERT_LE(p.predicted_kl, target);
    const std::uint64_t best = brute_force_bytes(s, target);
    EXPECT_EQ(p.bytes, best) << "trial " << trial;
    // The budget the other way round: within the same bytes, no more KL.
    const SolvedPlan q = solve_for_bpw(s, 8.0 * static_cast<double>(p.bytes) / static_cast<double>(s.total_params()));
    EXPECT_LE(q.bytes, p.bytes);
    EXPECT_LE(q.predicted_kl, p.predicted_kl + 1e-12);
    EXPECT_EQ(predict(s, p.plan).bytes, p.bytes);
  }
}

// Models whose bytes need coarser units than their gcd (each layer's bytes
// rounded up): a budget is never exceeded, the smallest plan stays reachable,
// and the KL is no worse than brute force's within a unit per layer less.
TEST(PlanSearch, CoarseUnitsKeepTheBudgetAndTheSmallestPlan) {
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::uint64_t> bytes(3'000'000, 90'000'000);
  std::uniform_real_distribution<double> u(0, 1);
  for (int trial = 0; trial < 30; ++trial) {
    Sensitivity s;
    s.other_bytes = 12345;
    s.other_params = 1000;
    s.positions = 10;
    for (int l = 0; l < 5; ++l) {
      LayerCost layer{l, LinearRole::kQ, 50'000'000, {}};
      for (const std::int64_t g : {-1, 32, 64, 128}) layer.candidates.push_back({QuantSpec{LowBit::kSymInt4, g}, bytes(rng), u(rng), 0});
      s.layers.push_back(layer);
    }
    const double total = static_cast<double>(s.total_params());
    const SolvedPlan smallest = solve_for_bpw(s, smallest_bpw(s));
    EXPECT_NEAR(smallest.bits_per_weight, smallest_bpw(s), 1e-9);
    for (int k = 0; k < 5; ++k) {
      const double bpw = smallest_bpw(s) + 2.0 * u(rng);
      const SolvedPlan p = solve_for_bpw(s, bpw);
      EXPECT_LE(static_cast<double>(p.bytes), bpw * total / 8 * (1 + 1e-12));
    }
  }
}

TEST(PlanSearch, ImpossibleBudgetsSaySo) {
  Sensitivity s;
  s.other_params = 10;
  s.positions = 1;
  s.layers.push_back({0, LinearRole::kQ, 100, {{QuantSpec{LowBit::kFp16}, 200, 0.01, 0}}});
  EXPECT_NE(error_of([&] { solve_for_kl(s, 0.001); }).find("even the most accurate candidates predict"),
            std::string::npos);
  EXPECT_NE(error_of([&] { solve_for_bpw(s, 1.0); }).find("even the smallest candidates need"), std::string::npos);
  EXPECT_NE(error_of([&] { solve_for_kl(s, std::numeric_limits<double>::infinity()); }).find("positive and finite"),
            std::string::npos);
  // A budget beyond every plan buys the most accurate one.
  s.layers[0].candidates.push_back({QuantSpec{LowBit::kSymInt4, 32}, 60, 0.5, 0});
  EXPECT_EQ(solve_for_bpw(s, 1e30).plan.base.type, LowBit::kFp16);
  EXPECT_EQ(solve_for_bpw(s, 1e30).predicted_kl, 0.01);
}

// The bundled model with fp32 linears, and `chunks` chunks of 64 tokens of the calibration text.
std::unique_ptr<LlamaModel> float_model(ThreadPool& pool) {
  LoadOptions fp32;
  fp32.linear = QuantSpec{LowBit::kFp32};
  return LlamaModel::load(WOQ_MODEL_DIR, fp32, pool);
}
ScoringPlan calibration_chunks(const Tokenizer& tok, std::int64_t chunks) {
  return chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_calibration.txt")), 64, chunks, 1);
}

// The acceptance's honesty check: the KL a solved plan is predicted to have
// (sum of the one-at-a-time measurements on calibration text) against what it
// has on held-out text. Fails when the measurements are replaced by zeros (the
// predictions would be 0) or do not measure what the plan loads.
TEST(PlanSearch, PredictedKlTracksTheMeasuredKlOnHeldOutText) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  LoadOptions fp32;
  fp32.linear = QuantSpec{LowBit::kFp32};
  LoadReport rep;
  auto model = LlamaModel::load(WOQ_MODEL_DIR, fp32, pool, &rep);
  const ScoringPlan calib = chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_calibration.txt")), 64,
                                       6, 1);
  const auto candidates = [](std::int64_t) {
    return std::vector<QuantSpec>{{LowBit::kSymInt8, -1}, {LowBit::kSymInt4, 32}, {LowBit::kAsymInt4, -1}};
  };
  const Sensitivity s = measure_sensitivity(*model, calib, pool, rep.other_bytes, 40000, candidates, std::nullopt);
  ASSERT_EQ(s.layers.size(), 35u);
  // Measuring restored every layer: the model is still its float self.
  EXPECT_EQ(model->block_linear(3, LinearRole::kUp).type, LowBit::kFp32);
  const Sensitivity again = parse_sensitivity(nlohmann::json::parse(sensitivity_json(s).dump()), "again");
  EXPECT_EQ(again.layers[7].candidates[1].kl, s.layers[7].candidates[1].kl);

  const ScoringPlan held = chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt")), 128, 8, 1);
  RefLogprobFile ref = RefLogprobFile::create("", held, model->config().vocab_size);
  write_reference(*model, held, 0, ref);
  model.reset();
  std::vector<double> ratios;
  for (const double target : {0.01, 0.03, 0.08}) {
    const SolvedPlan p = solve_for_kl(s, target);
    LoadOptions o;
    o.linear = p.plan.base;
    o.plan = std::make_shared<QuantPlan>(p.plan);
    auto m = LlamaModel::load(WOQ_MODEL_DIR, o, pool);
    const CompareStats st = compare_with_reference(*m, held, 0, ref);
    ASSERT_GT(p.predicted_kl, 0);
    ratios.push_back(st.mean_kl / p.predicted_kl);
    std::printf("target %.3f: predicted %.5f, measured %.5f +/- %.5f\n", target, p.predicted_kl, st.mean_kl,
                st.kl_stderr);
  }
  for (const double r : ratios) {
    EXPECT_GT(r, 0.5);
    EXPECT_LT(r, 2.0);
  }
}

// Each measured KL is computed from the float model's hidden states at the
// layer's block, not from the tokens: it must be the KL of the whole model with
// that one layer swapped, bit for bit (first, middle and last block; a shortcut
// that started from the wrong block or scored other rows fails).
TEST(PlanSearch, EachMeasuredKlIsTheWholeModelsKlWithThatLayerSwapped) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  auto model = float_model(pool);
  const ScoringPlan calib = calibration_chunks(tok, 4);
  const std::vector<QuantSpec> specs{{LowBit::kSymInt4, 32}, {LowBit::kAsymInt4, -1}};
  const Sensitivity s =
      measure_sensitivity(*model, calib, pool, 0, 1000, [&](std::int64_t) { return specs; }, std::nullopt);
  const Sensitivity est =
      estimate_sensitivity(*model, calib, pool, 0, 1000, [&](std::int64_t) { return specs; }, std::nullopt);
  RefLogprobFile ref = RefLogprobFile::create("", calib, model->config().vocab_size);
  write_reference(*model, calib, 0, ref);
  const std::int64_t last = model->config().num_hidden_layers - 1;
  for (const auto& [layer, role] : std::vector<std::pair<std::int64_t, LinearRole>>{
           {0, LinearRole::kQ}, {2, LinearRole::kDown}, {last, LinearRole::kO}, {last, LinearRole::kUp}}) {
    const std::size_t i = static_cast<std::size_t>(layer) * kBlockLinears.size() + static_cast<std::size_t>(role);
    ASSERT_EQ(s.layers[i].layer, layer);
    ASSERT_EQ(s.layers[i].role, role);
    QuantMatrix& slot = model->block_linear(layer, role);
    for (std::size_t j = 0; j < specs.size(); ++j) {
      QuantMatrix w = quantize_matrix([&](std::int64_t r, float* out) { dequantize_row(slot, r, out); }, slot.rows,
                                      slot.cols, specs[j], &pool);
      ready_for_kernels(w, std::nullopt, false, pool);
      std::swap(slot, w);
      const CompareStats whole = compare_with_reference(*model, calib, 0, ref);
      std::swap(slot, w);
      EXPECT_EQ(s.layers[i].candidates[j].kl, whole.mean_kl) << plan_module(layer, role) << " " << spec_name(specs[j]);
      EXPECT_EQ(s.layers[i].candidates[j].kl_stderr, whole.kl_stderr);
      if (j == 0) {
        EXPECT_EQ(est.layers[i].candidates[j].kl, whole.mean_kl);  // the estimate's anchor
      }
    }
  }
}

// The rows error_row_sample takes: n of them, one in each of n equal strata,
// not lined up with the chunks (16 chunks of 128 tokens, 256 rows: a plain
// stride of 8 would take all 16 first tokens; here about 256 / 128 of them).
TEST(PlanSearch, TheErrorRowSampleTakesOneRowPerStratumNotAlignedWithTheChunks) {
  for (const auto& [total, n] : std::vector<std::pair<std::int64_t, std::int64_t>>{
           {2048, 256}, {1000, 7}, {10, 10}, {10, 1}, {384, 256}, {5, 9}, {6, 0}}) {
    const std::vector<char> taken = error_row_sample(total, n);
    ASSERT_EQ(static_cast<std::int64_t>(taken.size()), total);
    const std::int64_t want = n <= 0 || n >= total ? total : n;
    EXPECT_EQ(std::count(taken.begin(), taken.end(), 1), want) << total << " " << n;
    for (std::int64_t i = 0; i < want && want < total; ++i)
      EXPECT_EQ(std::count(taken.begin() + i * total / n, taken.begin() + (i + 1) * total / n, 1), 1);
  }
  const std::vector<char> taken = error_row_sample(16 * 128, 256);
  std::int64_t first_tokens = 0;
  for (std::int64_t chunk = 0; chunk < 16; ++chunk) first_tokens += taken[static_cast<std::size_t>(chunk * 128)];
  EXPECT_LE(first_tokens, 4);
}

// The estimate's output errors on `error_rows` calibration rows
// (error_row_sample's, of all chunks' tokens one after another): each candidate's
// KL is the anchor's scaled by the errors on exactly those rows, recomputed here
// from the float model's own inputs of the linear; the anchor's KL stays
// measured on every scored position; the JSON keeps the row count.
TEST(PlanSearch, TheEstimatesOutputErrorsAreTakenOnTheSampledRows) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  auto model = float_model(pool);
  const ModelConfig& c = model->config();
  const ScoringPlan calib = calibration_chunks(tok, 4);
  const std::vector<QuantSpec> specs{{LowBit::kSymInt4, 32}, {LowBit::kAsymInt4, -1}, {LowBit::kSymInt8, -1}};
  const auto candidates = [&](std::int64_t) { return specs; };
  constexpr std::int64_t kRows = 37;
  const Sensitivity all = estimate_sensitivity(*model, calib, pool, 0, 1000, candidates, std::nullopt);
  const Sensitivity few = estimate_sensitivity(*model, calib, pool, 0, 1000, candidates, std::nullopt, kRows);
  std::int64_t total = 0;
  for (const auto& seq : calib.sequences) total += static_cast<std::int64_t>(seq.size());
  EXPECT_EQ(all.error_rows, total);
  EXPECT_EQ(few.error_rows, kRows);
  EXPECT_EQ(parse_sensitivity(sensitivity_json(few), "few").error_rows, kRows);
  const std::vector<char> taken = error_row_sample(total, kRows);
  const std::int64_t last = c.num_hidden_layers - 1;
  for (const auto& [layer, role] :
       std::vector<std::pair<std::int64_t, LinearRole>>{{1, LinearRole::kV}, {last, LinearRole::kDown}}) {
    const std::size_t i = static_cast<std::size_t>(layer) * kBlockLinears.size() + static_cast<std::size_t>(role);
    QuantMatrix& slot = model->block_linear(layer, role);
    std::vector<float> x;  // the linear's float inputs on the taken rows
    std::int64_t row = 0;
    const LlamaModel::LinearObserver observe = [&](LinearRole r, const float* in, std::int64_t rows) {
      if (r != role) return;
      for (std::int64_t t = 0; t < rows; ++t, ++row)
        if (taken[static_cast<std::size_t>(row)]) x.insert(x.end(), in + t * slot.cols, in + (t + 1) * slot.cols);
    };
    for (const auto& seq : calib.sequences) {
      std::vector<float> h(seq.size() * static_cast<std::size_t>(c.hidden_size));
      model->embed(seq, h.data());
      for (std::int64_t l = 0; l <= layer; ++l)
        model->forward_block(l, h.data(), static_cast<std::int64_t>(seq.size()), l == layer ? observe : nullptr);
    }
    ASSERT_EQ(static_cast<std::int64_t>(x.size()), kRows * slot.cols);
    std::vector<float> y(static_cast<std::size_t>(kRows * slot.rows)), yq(y.size());
    matmul(slot, x.data(), kRows, y.data(), pool);
    std::vector<double> err;
    for (const QuantSpec& spec : specs) {
      QuantMatrix w = quantize_matrix([&](std::int64_t r, float* out) { dequantize_row(slot, r, out); }, slot.rows,
                                      slot.cols, spec, &pool);
      ready_for_kernels(w, std::nullopt, false, pool);
      matmul(w, x.data(), kRows, yq.data(), pool);
      double e = 0;
      for (std::size_t k = 0; k < y.size(); ++k) e += (static_cast<double>(yq[k]) - y[k]) * (yq[k] - y[k]);
      err.push_back(e);
    }
    const std::vector<CandidateCost>& got = few.layers[i].candidates;
    EXPECT_EQ(got[0].kl, all.layers[i].candidates[0].kl);  // the anchor (sym_int4 g32): every scored position
    for (std::size_t j = 1; j < specs.size(); ++j) {
      EXPECT_EQ(got[j].kl, got[0].kl * (err[j] / err[0])) << plan_module(layer, role) << " " << spec_name(specs[j]);
      EXPECT_NE(got[j].kl, all.layers[i].candidates[j].kl);
    }
  }
}

// An untied model's lm_head and input embeddings are planned as two more layers (in that order, last): first as
// held (KL 0, left out of a plan), then each candidate, whose measured KL is the KL of the model loaded with a plan
// giving it that format, bit for bit (lm_head in both measures; the embeddings' estimate is the anchor's KL scaled
// by their rows' error on the sampled tokens); their weights leave the unplanned ones; a plan names them only
// when quantized.
TEST(PlanSearch, AnUntiedModelsLmHeadAndEmbeddingsArePlannedAndMeasuredAsLoaded) {
  ThreadPool pool(2);
  test::TempDir tmp;
  const std::string dir = write_tiny(tmp, 5, pool);
  LoadOptions as_stored;
  as_stored.linear = QuantSpec{LowBit::kFp16};
  auto model = LlamaModel::load(dir, as_stored, pool);
  const ModelConfig& c = model->config();
  ASSERT_FALSE(c.tie_word_embeddings);
  const std::uint64_t head_bytes = model->untied_lm_head()->bytes(), embed_bytes = model->embeddings().bytes();
  const std::int64_t head_params = c.vocab_size * c.hidden_size;
  const Tokenizer tok = Tokenizer::load(dir);
  const ScoringPlan calib =
      chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_calibration.txt")), 64, 3, 1);
  const std::vector<QuantSpec> specs{{LowBit::kSymInt4, 32}, {LowBit::kSymInt8, -1}, {LowBit::kFp16},
                                     {LowBit::kAsymInt4, -1}};
  const auto candidates = [&](std::int64_t) { return specs; };
  const std::uint64_t other_bytes = head_bytes + embed_bytes + 1000;
  const std::int64_t other_params = 2 * head_params + 77;
  const std::int64_t error_rows = 50;
  const Sensitivity s = measure_sensitivity(*model, calib, pool, other_bytes, other_params, candidates, std::nullopt);
  const Sensitivity est =
      estimate_sensitivity(*model, calib, pool, other_bytes, other_params, candidates, std::nullopt, error_rows);
  const std::size_t linears = static_cast<std::size_t>(c.num_hidden_layers) * kBlockLinears.size();
  ASSERT_EQ(s.layers.size(), linears + 2);
  ASSERT_EQ(est.layers.size(), linears + 2);
  EXPECT_EQ(s.other_bytes, 1000u);
  EXPECT_EQ(s.other_params, 77);
  EXPECT_EQ(est.other_bytes, 1000u);
  EXPECT_EQ(s.total_params(), est.total_params());
  ASSERT_EQ(s.planned_lm_head(), &s.layers[linears]);
  ASSERT_EQ(s.planned_embeddings(), &s.layers[linears + 1]);
  EXPECT_EQ(s.layers[linears].module(), "lm_head");
  EXPECT_EQ(s.layers[linears + 1].module(), "model.embed_tokens");
  RefLogprobFile ref = RefLogprobFile::create("", calib, c.vocab_size);
  write_reference(*model, calib, 0, ref);
  // The embeddings' rows of the tokens the estimate took (all sequences' tokens one after another).
  std::vector<std::int32_t> all, taken_tokens;
  for (const auto& seq : calib.sequences) all.insert(all.end(), seq.begin(), seq.end());
  const std::vector<char> taken = error_row_sample(static_cast<std::int64_t>(all.size()), error_rows);
  for (std::size_t i = 0; i < all.size(); ++i)
    if (taken[i]) taken_tokens.push_back(all[i]);
  const auto row_error = [&](LlamaModel& m) {
    std::vector<float> a(static_cast<std::size_t>(c.hidden_size)), b(a.size());
    double e = 0;
    for (const std::int32_t t : taken_tokens) {
      model->embed(std::span(&t, 1), a.data());
      m.embed(std::span(&t, 1), b.data());
      for (std::size_t k = 0; k < a.size(); ++k) e += (static_cast<double>(b[k]) - a[k]) * (b[k] - a[k]);
    }
    return e;
  };
  for (const std::size_t i : {linears, linears + 1}) {
    const LayerCost& end = s.layers[i];
    const bool embeddings = end.is_embeddings();
    SCOPED_TRACE(end.module());
    EXPECT_EQ(end.params, head_params);
    ASSERT_EQ(end.candidates.size(), specs.size());  // as held (fp16), then the others (fp16 is the held one)
    EXPECT_TRUE(end.candidates[0].held);
    EXPECT_EQ(end.candidates[0].kl, 0);
    EXPECT_EQ(end.candidates[0].bytes, embeddings ? embed_bytes : head_bytes);
    double anchor_kl = 0, anchor_error = 0;
    for (std::size_t j = 1; j < end.candidates.size(); ++j) {
      const CandidateCost& cc = end.candidates[j];
      EXPECT_FALSE(cc.held);
      QuantPlan plan;
      plan.base = {LowBit::kFp16};
      plan.tensors[end.module()] = cc.spec;
      auto m = LlamaModel::load(dir, load_options_of(plan), pool);
      const CompareStats whole = compare_with_reference(*m, calib, 0, ref);
      EXPECT_GT(whole.mean_kl, 0);
      EXPECT_EQ(cc.kl, whole.mean_kl) << spec_name(cc.spec);
      EXPECT_EQ(cc.bytes, embeddings ? m->embeddings().bytes() : m->untied_lm_head()->bytes());
      const CandidateCost& e = est.layers[i].candidates[j];
      EXPECT_EQ(e.bytes, cc.bytes);
      if (!embeddings) {
        EXPECT_EQ(e.kl, cc.kl);  // exact in the estimate too
      } else if (spec_name(cc.spec) == "sym_int4 g32") {
        anchor_kl = e.kl;
        anchor_error = row_error(*m);
        EXPECT_EQ(e.kl, cc.kl);  // the anchor: measured
      }
    }
    if (!embeddings) continue;
    ASSERT_GT(anchor_error, 0);
    for (std::size_t j = 1; j < end.candidates.size(); ++j) {  // the others: scaled by their rows' error
      QuantPlan plan;
      plan.base = {LowBit::kFp16};
      plan.tensors[end.module()] = end.candidates[j].spec;
      auto m = LlamaModel::load(dir, load_options_of(plan), pool);
      EXPECT_NEAR(est.layers[i].candidates[j].kl, anchor_kl * row_error(*m) / anchor_error, 1e-12 * anchor_kl)
          << spec_name(end.candidates[j].spec);
    }
  }
  // The most accurate plan keeps both as held (unnamed); the smallest quantizes them (named).
  const SolvedPlan best = solve_for_bpw(s, 1e30), least = solve_for_bpw(s, smallest_bpw(s));
  EXPECT_FALSE(best.plan.lm_head().has_value());
  EXPECT_FALSE(best.plan.embeddings().has_value());
  ASSERT_TRUE(least.plan.lm_head().has_value());
  ASSERT_TRUE(least.plan.embeddings().has_value());
  EXPECT_EQ(spec_name(least.plan.base), "asym_int4 per channel");  // the block linears' smallest
  EXPECT_EQ(predict(s, least.plan).predicted_kl, least.predicted_kl);
  EXPECT_EQ(predict(s, best.plan).bytes, best.bytes);
  const Sensitivity back = parse_sensitivity(sensitivity_json(s), "s");
  EXPECT_TRUE(back.plans_lm_head());
  ASSERT_NE(back.planned_embeddings(), nullptr);
  EXPECT_TRUE(back.layers.back().candidates[0].held);
  EXPECT_EQ(sensitivity_json(back), sensitivity_json(s));
  // A file whose held candidates or order lie is refused, naming the field.
  const auto refused = [&](const std::function<void(nlohmann::ordered_json&)>& edit, const std::string& says) {
    nlohmann::ordered_json j = sensitivity_json(s);
    edit(j);
    try {
      parse_sensitivity(nlohmann::json::parse(j.dump()), "m.json");
      ADD_FAILURE() << "accepted: " << says;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  const auto head_json = [&](nlohmann::ordered_json& j) -> nlohmann::ordered_json& { return j["layers"][linears]; };
  refused([&](auto& j) { head_json(j)["candidates"][0].erase("held"); }, "lm_head's first candidate, and no other");
  refused([&](auto& j) { j["layers"].back()["candidates"][0].erase("held"); },
          "model.embed_tokens's first candidate, and no other");
  const auto hold = [](nlohmann::ordered_json& cand) {
    cand["held"] = true;
    cand["kl"] = cand["kl_stderr"] = 0.0;
  };
  refused([&](auto& j) { hold(head_json(j)["candidates"][1]); }, "lm_head's first candidate, and no other");
  refused([&](auto& j) { head_json(j)["candidates"][0]["kl"] = 0.5; }, "a held candidate (the layer as stored) has kl 0");
  refused([&](auto& j) { hold(j["layers"][0]["candidates"][0]), hold(j["layers"][0]["candidates"][1]); },
          "at most one candidate is the held one");
  refused([&](auto& j) { j["error_rows"] = 5; }, "only in an estimated measurement");
  const std::string order = "lm_head and then model.embed_tokens come after the block linears, each once";
  refused([&](auto& j) { std::swap(j["layers"][0], head_json(j)); }, order);
  refused([&](auto& j) { std::swap(j["layers"][linears], j["layers"][linears + 1]); }, order);
  refused([&](auto& j) { j["layers"].push_back(j["layers"].back()); }, order);
}

void expect_same_logits(LlamaModel& a, LlamaModel& b);

// A plan's embeddings load in memory and write as GGUF (token_embd in the planned type), the same logits; a tied
// model's embeddings (also lm_head) and a GPTQ checkpoint's are refused.
// A plan names the format each layer is converted to: a layer or lm_head stored quantized (GGUF blocks) runs as
// stored, so the plan cannot apply to it; --lm-head-low-bit beside a plan's lm_head would override it. Each is
// refused, naming what.
TEST(PlanLoad, WhatAPlanCannotSetIsRefused) {
  ThreadPool pool(2);
  test::TempDir tmp;
  const std::string dir = write_tiny(tmp, 6, pool);
  auto plan = std::make_shared<QuantPlan>();
  plan->base = {LowBit::kFp16};
  plan->source = "stored plan";
  plan->tensors[plan_module(0, LinearRole::kQ)] = {LowBit::kSymInt4, 32};
  plan->tensors["lm_head"] = {LowBit::kSymInt8, 32};
  GgufExportOptions o;
  o.plan = plan;
  const std::string file = tmp.file("q.gguf");
  export_gguf(dir, file, o, pool);  // a q4_0 q_proj in block 0, a q8_0 output, the rest f16
  auto other = std::make_shared<QuantPlan>();
  other->base = {LowBit::kSymInt8, 32};
  other->source = "p.json";
  EXPECT_NE(error_of([&] { LlamaModel::load(file, load_options_of(*other), pool); })
                .find("'blk.0.attn_q.weight' is stored quantized (GGUF q4_0); the plan p.json sets the formats"),
            std::string::npos);
  LoadOptions head;
  head.linear_is_default = true;
  head.lm_head = QuantSpec{LowBit::kSymInt4, 32};
  EXPECT_NE(error_of([&] { LlamaModel::load(file, head, pool); })
                .find("'output.weight' (lm_head) is stored as GGUF q8_0; woq runs it as stored"),
            std::string::npos);
  head.lm_head.reset();
  EXPECT_NO_THROW(LlamaModel::load(file, head, pool));  // as stored
  write_json_file(tmp.file("plan.json"), nlohmann::json::parse(R"({"woq_plan": 1, "base": {"low_bit": "sym_int4",
      "group_size": 32}, "tensors": {"lm_head": {"low_bit": "sym_int8", "group_size": 32}}})"));
  LoadRequest request;
  request.plan = tmp.file("plan.json");
  request.lm_head_low_bit = "sym_int4";
  EXPECT_NE(error_of([&] { parse_load_request(request); })
                .find("--lm-head-low-bit sym_int4 and the plan " + request.plan + " (lm_head: sym_int8"),
            std::string::npos);
  write_json_file(tmp.file("plan.json"), nlohmann::json::parse(R"({"woq_plan": 1, "base": {"low_bit": "sym_int4",
      "group_size": 32}})"));
  EXPECT_EQ(parse_load_request(request).lm_head->type, LowBit::kSymInt4);  // a plan that leaves lm_head as stored
}

TEST(PlanGguf, PlannedEmbeddingsWriteAsTokenEmbd) {
  ThreadPool pool(2);
  test::TempDir tmp;
  const std::string dir = write_tiny(tmp, 6, pool);
  auto plan = std::make_shared<QuantPlan>();
  plan->base = {LowBit::kFp16};
  plan->source = "embeddings plan";
  plan->tensors[plan_module(0, LinearRole::kQ)] = {LowBit::kSymInt8, 32};
  plan->tensors["model.embed_tokens"] = {LowBit::kSymInt4, 32};
  GgufExportOptions o;
  o.plan = plan;
  const std::string file = tmp.file("e.gguf");
  export_gguf(dir, file, o, pool);
  const GgufFile gguf(file);
  ASSERT_NE(gguf.find_tensor("token_embd.weight"), nullptr);
  EXPECT_EQ(gguf.find_tensor("token_embd.weight")->type, &ggml_type_traits(GgmlType::kQ4_0));
  LoadOptions in_memory = load_options_of(*plan);
  in_memory.activations = Activations::kInt8;
  in_memory.numerics = Numerics::kWoq;
  LoadReport rep;
  auto m = LlamaModel::load(dir, in_memory, pool, &rep);
  EXPECT_EQ(m->embeddings().type, LowBit::kSymInt4);
  EXPECT_EQ(rep.embeddings_bytes, m->embeddings().bytes());
  const std::vector<std::string> summary = load_summary(rep, in_memory);
  EXPECT_NE(summary.back().find("; embeddings -> sym_int4"), std::string::npos) << summary.back();
  LoadOptions stored;
  stored.linear_is_default = true;
  stored.activations = Activations::kInt8;
  stored.numerics = Numerics::kWoq;
  auto g = LlamaModel::load(file, stored, pool);
  EXPECT_EQ(g->embeddings().type, LowBit::kSymInt4);
  expect_same_logits(*m, *g);

  EXPECT_NE(error_of([&] { gptq_plan_config(*plan, read_model_config(dir), GptqZeros::kV1, false); })
                .find("model.embed_tokens: a GPTQ checkpoint keeps the embeddings in float"),
            std::string::npos);
  EXPECT_NE(error_of([&] { LlamaModel::load(WOQ_MODEL_DIR, load_options_of(*plan), pool); })
                .find("model.embed_tokens: " WOQ_MODEL_DIR " ties lm_head to the embeddings"),
            std::string::npos);
  o.force = true;
  EXPECT_NE(error_of([&] { export_gguf(WOQ_MODEL_DIR, tmp.file("t.gguf"), o, pool); })
                .find("model.embed_tokens: LlamaForCausalLM ties its output projection to the embeddings"),
            std::string::npos);
}

// The estimate with the blocks read one at a time (a BlockSource, the model loaded without its block linears) is
// the estimate of the resident model, to the last bit; the model never holds two blocks.
TEST(PlanSearch, TheStreamedEstimateIsTheResidentOne) {
  ThreadPool pool(2);
  test::TempDir tmp;
  const std::string dir = write_tiny(tmp, 7, pool);
  LoadOptions as_stored;
  as_stored.linear = QuantSpec{LowBit::kFp16};
  auto resident = LlamaModel::load(dir, as_stored, pool);
  as_stored.block_linears = false;
  auto streamed = LlamaModel::load(dir, as_stored, pool);
  const ModelConfig& c = resident->config();
  const Tokenizer tok = Tokenizer::load(dir);
  const ScoringPlan calib =
      chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_calibration.txt")), 64, 3, 1);
  const auto other_bytes = resident->untied_lm_head()->bytes() + resident->embeddings().bytes() + 10;
  const std::int64_t other_params = 2 * c.vocab_size * c.hidden_size + 10;
  const Sensitivity a = estimate_sensitivity(*resident, calib, pool, other_bytes, other_params, default_candidates,
                                             std::nullopt, 40);
  const TensorStore store = TensorStore::open(dir);
  std::vector<std::int64_t> loaded;  // the blocks held now
  std::int64_t next = 0;
  const BlockSource source = float_block_source(store, *streamed, QuantSpec{LowBit::kFp16}, pool);
  const BlockSource blocks = [&](std::int64_t layer, bool load) {
    if (load) {
      EXPECT_TRUE(loaded.empty()) << "block " << layer << " loaded beside " << loaded.front();
      EXPECT_EQ(layer, next++);
      loaded.push_back(layer);
    } else {
      loaded.erase(std::remove(loaded.begin(), loaded.end(), layer), loaded.end());
    }
    source(layer, load);
  };
  const Sensitivity b = estimate_sensitivity(*streamed, calib, pool, other_bytes, other_params, default_candidates,
                                             std::nullopt, 40, nullptr, blocks);
  EXPECT_EQ(next, c.num_hidden_layers);
  EXPECT_TRUE(loaded.empty());
  EXPECT_EQ(streamed->block_linear(0, LinearRole::kQ).rows, 0);
  nlohmann::ordered_json ja = sensitivity_json(a), jb = sensitivity_json(b);
  ja.erase("seconds");
  jb.erase("seconds");
  EXPECT_EQ(ja, jb);
  ASSERT_EQ(a.layers.size(), static_cast<std::size_t>(c.num_hidden_layers) * kBlockLinears.size() + 2);
  EXPECT_GT(a.layers.front().candidates.back().kl, 0);
}

// The cheaper estimate (one candidate's KL per layer, the others scaled by
// their output error) against the one-at-a-time measure it stands in for.
TEST(PlanSearch, TheEstimateAgreesWithTheOneAtATimeMeasure) {
  ThreadPool pool(2);
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  auto model = float_model(pool);
  const ScoringPlan calib = calibration_chunks(tok, 6);
  const auto candidates = [](std::int64_t) {
    return std::vector<QuantSpec>{{LowBit::kFp16}, {LowBit::kSymInt8, -1}, {LowBit::kSymInt4, 32},
                                  {LowBit::kAsymInt4, 32}, {LowBit::kSymInt4, -1}};
  };
  const Sensitivity exact = measure_sensitivity(*model, calib, pool, 0, 1000, candidates, std::nullopt);
  const Sensitivity est = estimate_sensitivity(*model, calib, pool, 0, 1000, candidates, std::nullopt, kEstimateRows);
  EXPECT_TRUE(est.estimated);
  EXPECT_EQ(est.error_rows, kEstimateRows);  // of 6 x 64 rows
  std::vector<double> ratios;
  for (std::size_t i = 0; i < exact.layers.size(); ++i)
    for (std::size_t j = 0; j < exact.layers[i].candidates.size(); ++j) {
      const CandidateCost& a = exact.layers[i].candidates[j];
      const CandidateCost& b = est.layers[i].candidates[j];
      ASSERT_EQ(a.bytes, b.bytes);
      if (j == 2) {
        EXPECT_EQ(a.kl, b.kl);  // the anchor (sym_int4 g32) is measured exactly
      }
      if (a.kl > 1e-5) ratios.push_back(b.kl / a.kl);  // sym_int8's too, 100x below the 4-bit formats'
    }
  ASSERT_GT(ratios.size(), 90u);
  std::sort(ratios.begin(), ratios.end());
  const double median = ratios[ratios.size() / 2];
  std::printf("estimate / exact over %zu candidates: min %.3f median %.3f max %.3f\n", ratios.size(), ratios.front(),
              median, ratios.back());
  EXPECT_GT(median, 0.8);
  EXPECT_LT(median, 1.25);
  EXPECT_GT(ratios.front(), 0.4);
  EXPECT_LT(ratios.back(), 2.5);
}

// A plan measured on GGUF's formats, written as GGUF, runs in the file as it was
// measured in memory: the same logits bit for bit (int8 activations recorded in
// the plan, as llama.cpp multiplies Q8_0).
TEST(PlanSearch, AGgufPlanWrittenAsGgufIsThePlanInMemory) {
  ThreadPool pool(2);
  test::TempDir tmp;
  auto plan = std::make_shared<QuantPlan>();
  plan->base = {LowBit::kSymInt8, 32};
  plan->activations = Activations::kInt8;
  plan->source = "gguf plan";
  for (std::int64_t l = 0; l < 5; ++l) {
    plan->tensors[plan_module(l, LinearRole::kDown)] = {LowBit::kFp16};  // K = 172: no Q4_0 / Q8_0 block fits
    if (l % 2 == 0) plan->tensors[plan_module(l, LinearRole::kUp)] = {LowBit::kSymInt4, 32};
  }
  GgufExportOptions o;
  o.plan = plan;
  const std::string file = tmp.file("plan.gguf");
  const GgufExportReport rep = export_gguf(WOQ_MODEL_DIR, file, o, pool);
  ASSERT_EQ(rep.linear_types.size(), 3u);
  LoadOptions in_memory;
  in_memory.linear = plan->base;
  in_memory.activations = plan->activations;
  in_memory.plan = plan;
  auto a = LlamaModel::load(WOQ_MODEL_DIR, in_memory, pool);
  LoadRequest as_woq;  // as woq loads it by default, in the in-memory model's rounding outside the matrix products
  as_woq.numerics = "woq";
  auto b = LlamaModel::load(file, parse_load_request(as_woq), pool);
  const std::vector<std::int32_t> ids = {1, 403, 407, 261, 378, 80, 65, 11, 300};
  std::vector<float> la, lb;
  KVCache ca = a->make_cache(16), cb = b->make_cache(16);
  a->forward(ids, ca, true, la);
  b->forward(ids, cb, true, lb);
  ASSERT_EQ(la.size(), lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << "logit " << i;

  o.force = true;
  const auto refused = [&](const QuantSpec& spec, const std::string& module) {
    auto bad = std::make_shared<QuantPlan>(*plan);
    bad->tensors[module] = spec;
    o.plan = bad;
    return error_of([&] { export_gguf(WOQ_MODEL_DIR, file, o, pool); });
  };
  EXPECT_NE(refused({LowBit::kAsymInt4, 32}, plan_module(1, LinearRole::kQ))
                .find("model.layers.1.self_attn.q_proj: asym_int4 g32 has no GGUF type"),
            std::string::npos);
  EXPECT_NE(refused({LowBit::kSymInt4, 32}, plan_module(1, LinearRole::kDown)).find("multiple of 32, K = 172"),
            std::string::npos);
  EXPECT_NE(refused({LowBit::kSymInt8, 32, Int4Range::kFull, Rounding::kGgml}, plan_module(1, LinearRole::kQ))
                .find("the plan rounds sym_int8 g32 ggml as ggml, the file is written with --rounding woq"),
            std::string::npos);
  EXPECT_NE(refused({LowBit::kSymInt8, 32}, "lm_head").find("ties its output projection"), std::string::npos);
}

// The logits of `a` and `b` on one prompt are equal bit for bit.
void expect_same_logits(LlamaModel& a, LlamaModel& b) {
  const std::vector<std::int32_t> ids = {1, 403, 407, 261, 378, 80, 65, 11, 300};
  std::vector<float> la, lb;
  KVCache ca = a.make_cache(16), cb = b.make_cache(16);
  a.forward(ids, ca, true, la);
  b.forward(ids, cb, true, lb);
  ASSERT_EQ(la.size(), lb.size());
  for (std::size_t i = 0; i < la.size(); ++i) ASSERT_EQ(la[i], lb[i]) << "logit " << i;
}

// A mixed plan written as a GPTQ checkpoint: GPTQModel's `dynamic` rules name the modules whose format differs
// from the base ("-:" for the one kept float), and woq reads the checkpoint back as the plan in memory, bit for bit.
TEST(PlanGptq, AMixedGptqCheckpointIsThePlanInMemory) {
  ThreadPool pool(2);
  test::TempDir tmp;
  auto plan = std::make_shared<QuantPlan>();
  plan->base = {LowBit::kSymInt4, 32};
  plan->source = "gptq plan";
  plan->tensors[plan_module(0, LinearRole::kQ)] = {LowBit::kSymInt8, -1};
  plan->tensors[plan_module(0, LinearRole::kDown)] = {LowBit::kFp16};
  plan->tensors[plan_module(1, LinearRole::kGate)] = {LowBit::kAsymInt4, 32};
  plan->tensors[plan_module(2, LinearRole::kO)] = {LowBit::kSymInt4, 16, Int4Range::kClip};
  plan->tensors[plan_module(3, LinearRole::kDown)] = {LowBit::kSymInt8, 32};
  plan->tensors[plan_module(4, LinearRole::kV)] = {LowBit::kSymInt4, 32, Int4Range::kClip};  // = base in GPTQ terms
  for (const LinearRole role : {LinearRole::kQ, LinearRole::kK, LinearRole::kV})  // one rule, vLLM's qkv_proj too
    plan->tensors[plan_module(3, role)] = {LowBit::kSymInt8, -1};
  QuantizeOptions q;
  q.spec = plan->base;
  q.plan = plan;
  const std::string out = tmp.file("gptq");
  quantize_checkpoint(WOQ_MODEL_DIR, out, q, pool);

  const nlohmann::json config = read_json_file(out + "/config.json").at("quantization_config");
  const nlohmann::json expected = nlohmann::json::parse(R"({
    "+:model\\.layers\\.0\\.self_attn\\.q_proj$": {"bits": 8, "group_size": -1},
    "-:model\\.layers\\.0\\.mlp\\.down_proj$": {},
    "+:model\\.layers\\.1\\.mlp\\.gate_proj$": {"sym": false},
    "+:model\\.layers\\.2\\.self_attn\\.o_proj$": {"group_size": 16},
    "+:model\\.layers\\.3\\.self_attn\\.(q|k|v|qkv)_proj$": {"bits": 8, "group_size": -1},
    "+:model\\.layers\\.3\\.mlp\\.down_proj$": {"bits": 8}})");
  EXPECT_EQ(config.at("dynamic"), expected) << config.dump(1);
  EXPECT_EQ(config.at("bits"), 4);
  EXPECT_EQ(config.at("group_size"), 32);

  for (const Activations a : {Activations::kInt8, Activations::kF32}) {
    LoadOptions in_memory;
    in_memory.linear = plan->base;
    in_memory.activations = a;
    in_memory.plan = plan;
    auto m = LlamaModel::load(WOQ_MODEL_DIR, in_memory, pool);
    LoadOptions as_stored;
    as_stored.linear_is_default = true;
    as_stored.activations = a;
    LoadReport rep;
    auto g = LlamaModel::load(out, as_stored, pool, &rep);
    EXPECT_EQ(g->block_linear(0, LinearRole::kDown).type, LowBit::kFp16);
    EXPECT_EQ(g->block_linear(0, LinearRole::kQ).type, LowBit::kSymInt8);
    EXPECT_EQ(g->block_linear(1, LinearRole::kGate).type, LowBit::kAsymInt4);
    EXPECT_EQ(g->block_linear(2, LinearRole::kO).group_size, 16);
    EXPECT_EQ(rep.linear_kept_float, 1);
    EXPECT_EQ(g->block_linear(3, LinearRole::kK).type, LowBit::kSymInt8);
    EXPECT_NE(rep.imported_format.find("with 6 per-module rules"), std::string::npos) << rep.imported_format;
    expect_same_logits(*m, *g);
  }

  // What a GPTQ checkpoint cannot hold is refused, naming the module.
  const auto refused = [&](const QuantSpec& spec, const std::string& module) {
    QuantPlan bad = *plan;
    bad.tensors[module] = spec;
    return error_of([&] { gptq_plan_config(bad, read_model_config(WOQ_MODEL_DIR), GptqZeros::kV1, false); });
  };
  EXPECT_NE(refused({LowBit::kQ4_K, 256}, plan_module(1, LinearRole::kQ))
                .find("model.layers.1.self_attn.q_proj is q4_k: a GPTQ checkpoint holds"), std::string::npos);
  EXPECT_NE(refused({LowBit::kSymInt8, -1}, "lm_head").find("lm_head: this model ties lm_head to its embeddings"),
            std::string::npos);
}

// A plan's lm_head in a GPTQ checkpoint: `lm_head: true` and, when its format is not the base's, a rule for the
// module "lm_head" (GPTQModel's QuantizeConfig.lm_head and `dynamic`, as vLLM reads them); woq reads lm_head's
// integers back as stored, the plan in memory bit for bit.
TEST(PlanGptq, APlannedLmHeadIsWrittenAsGptqIntegers) {
  ThreadPool pool(2);
  test::TempDir tmp;
  const std::string dir = write_tiny(tmp, 9, pool);
  const auto write = [&](const QuantSpec& head, const std::string& name) {
    auto plan = std::make_shared<QuantPlan>();
    plan->base = {LowBit::kSymInt4, 32};
    plan->source = "head plan";
    plan->tensors[plan_module(1, LinearRole::kDown)] = {LowBit::kSymInt8, -1};
    plan->tensors["lm_head"] = head;
    QuantizeOptions q;
    q.spec = plan->base;
    q.plan = plan;
    quantize_checkpoint(dir, tmp.file(name), q, pool);
    return plan;
  };
  struct Case { QuantSpec head; const char* rule; LowBit stored; };
  const std::vector<Case> cases = {{{LowBit::kSymInt8, -1}, R"({"bits": 8, "group_size": -1})", LowBit::kSymInt8},
                                   {{LowBit::kAsymInt4, 64}, R"({"group_size": 64, "sym": false})", LowBit::kAsymInt4},
                                   {{LowBit::kSymInt4, 32, Int4Range::kClip}, nullptr, LowBit::kSymInt4},
                                   {{LowBit::kFp16}, nullptr, LowBit::kFp16}};
  for (std::size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(spec_name(cases[i].head));
    const std::string out = tmp.file("gptq" + std::to_string(i));
    const auto plan = write(cases[i].head, "gptq" + std::to_string(i));
    const nlohmann::json config = read_json_file(out + "/config.json").at("quantization_config");
    const bool integers = is_quantized(cases[i].head.type);
    EXPECT_EQ(config.value("lm_head", false), integers) << config.dump(1);
    const nlohmann::json dynamic = config.value("dynamic", nlohmann::json::object());
    if (cases[i].rule)
      EXPECT_EQ(dynamic.at("+:lm_head$"), nlohmann::json::parse(cases[i].rule)) << config.dump(1);
    else
      EXPECT_FALSE(dynamic.contains("+:lm_head$")) << config.dump(1);
    const TensorStore store = TensorStore::open(out);
    EXPECT_EQ(store.find("lm_head.qweight") != nullptr, integers);
    EXPECT_EQ(store.find("lm_head.weight") != nullptr, !integers);

    LoadOptions in_memory;
    in_memory.linear = plan->base;
    in_memory.plan = plan;
    in_memory.lm_head = plan->lm_head();
    auto m = LlamaModel::load(dir, in_memory, pool);
    LoadOptions as_stored;
    as_stored.linear_is_default = true;
    LoadReport rep;
    auto g = LlamaModel::load(out, as_stored, pool, &rep);
    ASSERT_NE(g->untied_lm_head(), nullptr);
    EXPECT_EQ(g->untied_lm_head()->type, cases[i].stored);
    EXPECT_EQ(rep.imported_format.find("lm_head quantized") != std::string::npos, integers) << rep.imported_format;
    expect_same_logits(*m, *g);
  }

  // What the config does not announce, or a conversion of the stored integers, is refused.
  const std::string out = tmp.file("gptq0");
  nlohmann::json config = read_json_file(out + "/config.json");
  config["quantization_config"]["lm_head"] = false;
  write_text_file(out + "/config.json", config.dump());
  LoadOptions as_stored;
  as_stored.linear_is_default = true;
  EXPECT_NE(error_of([&] { LlamaModel::load(out, as_stored, pool); })
                .find("'lm_head.qweight' exists, but config.json's quantization_config.lm_head is not true"),
            std::string::npos);
  config["quantization_config"]["lm_head"] = true;
  config["quantization_config"]["dynamic"] = {{"-:lm_head$", nlohmann::json::object()}};  // integers it disowns
  write_text_file(out + "/config.json", config.dump());
  EXPECT_NE(error_of([&] { LlamaModel::load(out, as_stored, pool); })
                .find("'lm_head.qweight' exists, but config.json's quantization_config (dynamic) keeps 'lm_head' "
                      "unquantized"),
            std::string::npos);
  config["quantization_config"].erase("dynamic");
  write_text_file(out + "/config.json", config.dump());
  // GGUF export of the checkpoint would lose lm_head (the file would run tied): refused.
  EXPECT_NE(error_of([&] { export_gguf(out, tmp.file("g.gguf"), GgufExportOptions{}, pool); })
                .find("lm_head is stored as GPTQ integers"),
            std::string::npos);
  LoadOptions convert = as_stored;
  convert.lm_head = QuantSpec{LowBit::kSymInt4, 32};
  EXPECT_NE(error_of([&] { LlamaModel::load(out, convert, pool); }).find("does not round them again"),
            std::string::npos);
  const std::string floats = tmp.file("gptq3");  // lm_head float, lm_head: true: its integers are missing
  config = read_json_file(floats + "/config.json");
  config["quantization_config"]["lm_head"] = true;
  write_text_file(floats + "/config.json", config.dump());
  EXPECT_NE(error_of([&] { LlamaModel::load(floats, as_stored, pool); })
                .find("quantization_config.lm_head is true, but there is no tensor 'lm_head.qweight'"),
            std::string::npos);
}

// GPTQ itself under a plan: each linear is fitted in its planned format (the float one converted).
TEST(PlanGptq, GptqFitsEachLayerInItsPlannedFormat) {
  ThreadPool pool(2);
  test::TempDir tmp;
  QuantPlan plan;
  plan.base = {LowBit::kSymInt4, 32};
  plan.tensors[plan_module(1, LinearRole::kUp)] = {LowBit::kSymInt8, -1};
  plan.tensors[plan_module(2, LinearRole::kK)] = {LowBit::kBf16};
  write_plan(plan, tmp.file("plan.json"));
  QuantizeRequest r;
  r.input = WOQ_MODEL_DIR;
  r.output = tmp.file("gptq");
  r.plan = tmp.file("plan.json");
  r.method = "gptq";
  r.calib = "random:4x32";
  run_quantize_request(r, pool, {});
  LoadOptions as_stored;
  as_stored.linear_is_default = true;
  auto g = LlamaModel::load(r.output, as_stored, pool);
  EXPECT_EQ(g->block_linear(1, LinearRole::kUp).type, LowBit::kSymInt8);
  EXPECT_EQ(g->block_linear(2, LinearRole::kK).type, LowBit::kBf16);
  EXPECT_EQ(g->block_linear(3, LinearRole::kUp).type, LowBit::kSymInt4);
  EXPECT_EQ(g->block_linear(3, LinearRole::kUp).group_size, 32);
  r.group_size = 64;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--group-size does not apply with --plan"),
            std::string::npos);
}

// A config with `dynamic` rules as GPTQModel documents them (ModelCloud's TinyLlama dynamic example): the first
// rule that matches the start of the module name decides; "-:" keeps the module float.
TEST(PlanGptq, DynamicRulesMatchAsGptqModelDoes) {
  test::TempDir tmp;
  const auto config_with = [&](const std::string& dynamic) {
    write_text_file(tmp.file("config.json"), R"({"quantization_config": {"quant_method": "gptq", "bits": 4,
        "group_size": 128, "desc_act": true, "sym": true, "dynamic": )" + dynamic + "}}");
    return read_quantization_config(tmp.path());
  };
  const auto c = config_with(R"({"-:model\\.layers\\.([2-9]\\d*|[1-9]\\d+)\\..*": {},
                                 ".*\\.1\\..*": {"bits": 8, "group_size": 32, "desc_act": false},
                                 "+:model\\.layers\\.0\\.mlp": {"sym": false, "damp_percent": 0.05}})");
  ASSERT_TRUE(c);
  ASSERT_EQ(c->dynamic.size(), 3u);
  const auto l1 = c->for_module("model.layers.1.mlp.up_proj");
  ASSERT_TRUE(l1);
  EXPECT_EQ(l1->bits, 8);
  EXPECT_EQ(l1->group_size, 32);
  EXPECT_FALSE(l1->desc_act);
  EXPECT_FALSE(c->for_module("model.layers.2.self_attn.q_proj"));
  EXPECT_FALSE(c->for_module("model.layers.10.mlp.down_proj"));
  const auto l0 = c->for_module("model.layers.0.mlp.down_proj");  // the third rule: a prefix match
  ASSERT_TRUE(l0);
  EXPECT_FALSE(l0->sym);
  EXPECT_EQ(l0->bits, 4);
  const auto attn0 = c->for_module("model.layers.0.self_attn.q_proj");  // no rule: the config's own
  ASSERT_TRUE(attn0);
  EXPECT_TRUE(attn0->sym);
  EXPECT_EQ(attn0->group_size, 128);
  // The order in the file decides, not the keys' sorted order.
  const auto swapped = config_with(R"({"model\\.layers\\.1\\.": {"bits": 8}, "-:model\\.layers\\.1\\.": {}})");
  EXPECT_TRUE(swapped->for_module("model.layers.1.mlp.up_proj"));

  EXPECT_NE(error_of([&] { config_with(R"({"model\\.layers\\.(": {}})"); }).find("dynamic['model\\.layers\\.(']"),
            std::string::npos);
  EXPECT_NE(error_of([&] { config_with(R"({".*": {"bits": 3}})"); }).find("bits"), std::string::npos);
  EXPECT_NE(error_of([&] { config_with(R"({".*": {"lora_rank": 8}})"); }).find("lora_rank"), std::string::npos);
  EXPECT_NE(error_of([&] { config_with(R"({".*": 8})"); }).find("must be an object"), std::string::npos);
  EXPECT_NE(error_of([&] { config_with(R"([".*"])"); }).find("dynamic: must be an object"), std::string::npos);
  EXPECT_NE(error_of([&] { config_with(R"({".*": {"sym": null}})"); }).find("'sym' is null"), std::string::npos);
  // A rule that backtracks at every module fails at once, not after minutes.
  const auto hostile = config_with(R"({".{2}(.|..)*\\d{3}": {}})");
  EXPECT_NE(error_of([&] { hostile->for_module("model.layers.0.self_attn.q_proj"); }).find("backtracks too much"),
            std::string::npos);
}

}  // namespace
}  // namespace woq
