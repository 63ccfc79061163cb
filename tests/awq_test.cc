// AWQ (quantize/awq.h) on the bundled model, calibrated on TinyStories and
// measured on held-out stories against fp32: it beats round to nearest, and
// AWQ + GPTQ beats GPTQ; its folding is exact (an 8-bit AWQ model is the float
// model within the 8-bit error); the search picks the grid's least loss.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <map>
#include <random>

#include "eval/compare.h"
#include "eval/reports.h"
#include "io/json_file.h"
#include "model/llama.h"
#include "quantize/awq.h"
#include "quantize/gguf_export.h"
#include "quantize/quantize_request.h"
#include "test_files.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

using test::error_of;

// Mean KL (and its standard error) against fp32 on held-out text, per quantize method.
class AwqAccuracy : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pool_ = new ThreadPool(2);
    tmp_ = new test::TempDir();
    const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
    held_ = new ScoringPlan(
        chunk_plan(tok.encode(read_text_file(WOQ_TEST_DATA "/tinystories_heldout.txt")), 128, 32, 1));
    LoadOptions fp32;
    fp32.linear = QuantSpec{LowBit::kFp32};
    auto model = LlamaModel::load(WOQ_MODEL_DIR, fp32, *pool_);
    ref_ = new RefLogprobFile(RefLogprobFile::create("", *held_, model->config().vocab_size));
    write_reference(*model, *held_, 0, *ref_);
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete held_;
    delete tmp_;
    delete pool_;
  }

  // `woq quantize --method METHOD --low-bit LOW_BIT --group-size G` calibrated on `calib` x `length` tokens of
  // TinyStories, then measured.
  static CompareStats measure(const std::string& method, const std::string& low_bit, std::int64_t group,
                              std::int64_t calib = 16, std::int64_t length = 128,
                              const std::string& input = WOQ_MODEL_DIR) {
    QuantizeRequest r;
    r.input = input;
    r.output = tmp_->file(method + "-" + low_bit + "-" + std::to_string(group) + (input == WOQ_MODEL_DIR ? "" : "-gguf"));
    r.method = method;
    r.low_bit = low_bit;
    r.group_size = group;
    if (method != "rtn") {
      r.calib_file = WOQ_TEST_DATA "/tinystories_calibration.txt";
      r.nsamples = calib;
      r.seqlen = length;
    }
    run_quantize_request(r, *pool_, {});
    LoadOptions as_stored;
    as_stored.linear_is_default = true;
    as_stored.activations = Activations::kF32;  // the weights alone
    auto m = LlamaModel::load(r.output, as_stored, *pool_);
    const CompareStats st = compare_with_reference(*m, *held_, 0, *ref_);
    std::printf("%s %s g%lld: mean KL %.5f +/- %.5f\n", method.c_str(), low_bit.c_str(), static_cast<long long>(group),
                st.mean_kl, st.kl_stderr);
    return st;
  }

  static ThreadPool* pool_;
  static test::TempDir* tmp_;
  static ScoringPlan* held_;
  static RefLogprobFile* ref_;
};
ThreadPool* AwqAccuracy::pool_ = nullptr;
test::TempDir* AwqAccuracy::tmp_ = nullptr;
ScoringPlan* AwqAccuracy::held_ = nullptr;
RefLogprobFile* AwqAccuracy::ref_ = nullptr;

// Calibrated as the README's GPTQ table is (64 x 256 tokens). AWQ beats round to nearest by more than the
// standard errors; AWQ + GPTQ is no worse than GPTQ beyond its standard error (on this 5-layer model the two are
// within a standard error of each other, AWQ + GPTQ slightly ahead here: the README's table).
TEST_F(AwqAccuracy, BeatsRoundToNearestAndHelpsGptq) {
  for (const char* low_bit : {"asym_int4", "sym_int4"}) {
    const CompareStats rtn = measure("rtn", low_bit, 32), awq = measure("awq", low_bit, 32, 64, 256);
    const CompareStats gptq = measure("gptq", low_bit, 32, 64, 256), both = measure("awq+gptq", low_bit, 32, 64, 256);
    EXPECT_LT(awq.mean_kl + awq.kl_stderr, rtn.mean_kl - rtn.kl_stderr) << low_bit;
    EXPECT_LT(both.mean_kl, gptq.mean_kl + gptq.kl_stderr) << low_bit;
  }
}

// Folding is exact: scales moved into the norms and the following rows change nothing but the rounding, so an
// 8-bit AWQ model is as close to fp32 as an 8-bit round-to-nearest one (a wrong fold costs orders of magnitude more).
TEST_F(AwqAccuracy, FoldingIsExact) {
  const CompareStats rtn = measure("rtn", "sym_int8", -1), awq = measure("awq", "sym_int8", -1);
  EXPECT_LT(awq.mean_kl, 2 * rtn.mean_kl + 1e-4);
  EXPECT_LT(awq.mean_kl, 0.005);
  // From a GGUF file of the same model, whose tensors have llama.cpp's names: the folded norms are written too.
  const std::string gguf = tmp_->file("model-f32.gguf");
  GgufExportOptions o;
  o.type = LowBit::kFp32;
  export_gguf(WOQ_MODEL_DIR, gguf, o, *pool_);
  EXPECT_LT(measure("awq", "sym_int8", -1, 16, 128, gguf).mean_kl, 0.005);
}

// The search returns the grid point of least loss and its scales, normalised so that sqrt(max * min) = 1.
TEST(AwqSearch, PicksTheLeastLossAndNormalisesTheScales) {
  const std::vector<double> x_mean = {0.5, 2.0, 1.0, 4.0}, w_mean = {0.3, 0.6, 0.9, 0.2};
  std::map<int, double> losses;
  const AwqScale best = awq_search_scale(x_mean, w_mean, 10, [&](const std::vector<float>& s) {
    const double l = std::abs(s[3] - 2.2);  // a loss with one best exponent
    losses[static_cast<int>(losses.size())] = l;
    return l;
  });
  ASSERT_EQ(losses.size(), 10u);
  int argmin = 0;
  for (const auto& [i, l] : losses)
    if (l < losses[argmin]) argmin = i;
  EXPECT_DOUBLE_EQ(best.ratio, argmin / 10.0);
  EXPECT_DOUBLE_EQ(best.loss, losses[argmin]);
  double mx = 0, mn = 1e30;
  for (std::size_t c = 0; c < x_mean.size(); ++c) {
    const double raw = std::max(std::pow(x_mean[c], best.ratio) / (std::pow(w_mean[c], 1 - best.ratio) + 1e-4), 1e-4);
    mx = std::max(mx, raw);
    mn = std::min(mn, raw);
  }
  for (std::size_t c = 0; c < x_mean.size(); ++c) {
    const double raw = std::max(std::pow(x_mean[c], best.ratio) / (std::pow(w_mean[c], 1 - best.ratio) + 1e-4), 1e-4);
    EXPECT_NEAR(best.scales[c], raw / std::sqrt(mx * mn), 1e-6);
  }
  // w_mean: |W| / max|W| of its group, averaged over rows.
  const std::vector<float> w = {1, -2, 4, 0, -1, 1, 1, 2};  // 2 rows x 4, groups of 2
  const std::vector<double> m = awq_weight_mean({{w.data(), 2}}, 4, 2);
  EXPECT_NEAR(m[0], (0.5 + 1.0) / 2, 1e-5);
  EXPECT_NEAR(m[1], (1.0 + 1.0) / 2, 1e-5);
  EXPECT_NEAR(m[2], (1.0 + 0.5) / 2, 1e-5);
  EXPECT_NEAR(m[3], (0.0 + 1.0) / 2, 1e-5);
}

// w_mean over a pool (groups split between threads) is the serial one bit for bit: two matrices, a ragged last
// group, per-channel (-1) groups, more threads than groups.
TEST(AwqSearch, WeightMeanOnAPoolIsTheSerialOne) {
  std::mt19937 rng(5);
  std::student_t_distribution<float> heavy(2.0f);
  std::vector<float> a(37 * 100), b(11 * 100);
  for (float& v : a) v = heavy(rng);
  for (float& v : b) v = heavy(rng);
  for (const int threads : {2, 3, 8})
    for (const std::int64_t g : {std::int64_t{32}, std::int64_t{7}, std::int64_t{-1}, std::int64_t{100}}) {
      ThreadPool pool(threads);
      const std::vector<double> serial = awq_weight_mean({{a.data(), 37}, {b.data(), 11}}, 100, g);
      const std::vector<double> split = awq_weight_mean({{a.data(), 37}, {b.data(), 11}}, 100, g, &pool);
      ASSERT_EQ(serial.size(), split.size());
      EXPECT_EQ(std::memcmp(serial.data(), split.data(), serial.size() * sizeof(double)), 0) << threads << " " << g;
    }
}

// The clipping search against a direct float64 one written from AutoAWQ's _compute_best_clip: per row and group,
// each candidate's Σ_t (x_tg · (Q(clip(w)) − w)_g)² summed over the T products, the least one taken. Heavy-tailed
// weights and inputs with loud channels, so that clipping chooses differently per group; a ragged last group.
TEST(AwqClip, TakesTheThresholdOfLeastOutputErrorAsADirectFloat64Search) {
  const std::int64_t n = 150, k = 80, t = 48;  // asym_int4 g32: groups of 32, 32, 16; panels of 64, 64, 22 rows
  const QuantSpec spec{LowBit::kAsymInt4, 32};
  std::mt19937 rng(7);
  std::student_t_distribution<float> heavy(2.5f);
  std::vector<float> w(static_cast<std::size_t>(n * k)), x(static_cast<std::size_t>(t * k));
  for (float& v : w) v = 0.02f * heavy(rng);
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = heavy(rng) * (i % 7 == 0 ? 8.0f : 1.0f);
  ThreadPool pool(2), one(1);
  std::vector<float> clipped = w, clipped_one = w;
  const std::vector<float> limits = awq_clip(clipped, n, k, x, spec, 20, pool);
  EXPECT_EQ(awq_clip(clipped_one, n, k, x, spec, 20, one), limits);  // the same at any pool size
  const std::int64_t groups = 3;
  int shrunk = 0;
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t g = 0; g < groups; ++g) {
      const std::int64_t c0 = g * 32, len = std::min<std::int64_t>(32, k - c0);
      float amax = 0;
      for (std::int64_t c = c0; c < c0 + len; ++c) amax = std::max(amax, std::abs(w[static_cast<std::size_t>(r * k + c)]));
      std::vector<double> errors;
      for (int i = 0; i < 10; ++i) {
        const float m = amax * (1.0f - static_cast<float>(i) / 20.0f);
        std::vector<float> row(w.begin() + r * k, w.begin() + (r + 1) * k), q(static_cast<std::size_t>(k));
        for (float& v : row) v = std::clamp(v, -m, m);
        dequantize_row(quantize_matrix(row.data(), 1, k, spec), 0, q.data());
        double err = 0;
        for (std::int64_t s = 0; s < t; ++s) {
          double out = 0;
          for (std::int64_t c = c0; c < c0 + len; ++c)
            out += static_cast<double>(x[static_cast<std::size_t>(s * k + c)]) *
                   (static_cast<double>(q[static_cast<std::size_t>(c)]) - w[static_cast<std::size_t>(r * k + c)]);
          err += out * out;
        }
        errors.push_back(err);
      }
      const float limit = limits[static_cast<std::size_t>(r * groups + g)];
      const int chosen = static_cast<int>(std::lround((1.0 - limit / amax) * 20.0));
      ASSERT_EQ(limit, amax * (1.0f - static_cast<float>(chosen) / 20.0f)) << r << "," << g;
      const double least = *std::min_element(errors.begin(), errors.end());
      EXPECT_LE(errors[static_cast<std::size_t>(chosen)], least * (1 + 1e-5) + 1e-12) << r << "," << g;
      shrunk += chosen > 0;
      for (std::int64_t c = c0; c < c0 + len; ++c)
        ASSERT_EQ(clipped[static_cast<std::size_t>(r * k + c)], std::clamp(w[static_cast<std::size_t>(r * k + c)], -limit, limit));
    }
  EXPECT_GT(shrunk, n * groups / 4);  // the inputs make clipping matter
  EXPECT_LT(shrunk, n * groups);
}

// A run stopped after two blocks and continued with --resume writes the files of a run that was not stopped
// (the resumed blocks' folded norms and scales are read back, and the states move on through them as they did);
// another AWQ option is another run. Each method with float inputs (the default: the resumed blocks rerun in
// float), and awq with --awq-propagate quantized (through the resumed blocks as quantized).
class AwqResume : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(AwqResume, AStoppedRunContinuesToTheUninterruptedFiles) {
  ThreadPool pool(2);
  test::TempDir tmp;
  QuantizeRequest r;
  r.input = WOQ_MODEL_DIR;
  r.method = GetParam().first;
  r.awq_propagate = GetParam().second;
  r.low_bit = "asym_int4";
  r.group_size = 32;
  r.calib_file = WOQ_TEST_DATA "/tinystories_calibration.txt";
  r.nsamples = 4;
  r.seqlen = 64;
  r.awq_search_tokens = 128;  // q/k/v on two of the four sequences
  r.output = tmp.file("whole");
  run_quantize_request(r, pool, {});
  r.output = tmp.file("cut");
  std::int64_t done = 0;
  QuantizeCallbacks stop;
  stop.layers = [&](std::int64_t d, std::int64_t) { done = d; };
  stop.stop = [&] { return done >= 2; };
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, stop); })
                .find("stopped after decoder block 2 of 5; the same command with --resume continues from there"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(r.output));
  r.resume = true;
  r.awq_grid = 10;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("belongs to a different run (awq_grid differs: 10 here, 20 in the stopped run)"),
            std::string::npos);
  r.awq_grid.reset();
  QuantizeRequest flipped = r;
  flipped.awq_propagate = *r.awq_propagate == "float" ? "quantized" : "float";
  EXPECT_NE(error_of([&] { run_quantize_request(flipped, pool, {}); })
                .find(fmt::format("belongs to a different run (awq_propagate differs: \"{}\" here, \"{}\" in the stopped run)",
                                  *flipped.awq_propagate, *r.awq_propagate)),
            std::string::npos);
  for (const char* other : {"awq", "awq+gptq", "gptq"}) {
    if (r.method == other) continue;
    QuantizeRequest o = r;
    o.method = other;
    if (o.method == "gptq") o.awq_search_tokens.reset(), o.awq_propagate.reset();
    EXPECT_NE(error_of([&] { run_quantize_request(o, pool, {}); }).find("belongs to a different run (method differs: \"" + std::string(other) + "\" here"),
              std::string::npos) << other;
  }
  std::string said;
  QuantizeCallbacks log;
  log.log = [&](const std::string& line) { said += line + "\n"; };
  run_quantize_request(r, pool, log);
  EXPECT_NE(said.find("resuming: 2 of 5 blocks"), std::string::npos) << said;
  EXPECT_EQ(said.find("layer 1/5 AWQ"), std::string::npos) << said;  // not searched again
  EXPECT_NE(said.find("layer 3/5 AWQ"), std::string::npos) << said;
  for (const char* file : {"model.safetensors", "config.json"})
    EXPECT_TRUE(test::read_file(tmp.file("cut") + "/" + file) == test::read_file(tmp.file("whole") + "/" + file)) << file;
  EXPECT_FALSE(std::filesystem::exists(tmp.file(".cut.partial")));
}

INSTANTIATE_TEST_SUITE_P(Methods, AwqResume,
                         ::testing::Values(std::pair("awq", "float"), std::pair("awq+gptq", "float"),
                                           std::pair("awq", "quantized")),
                         [](const auto& p) {
                           return std::string(p.param.first == std::string("awq") ? "Awq" : "AwqGptq") +
                                  (p.param.second == std::string("quantized") ? "QuantizedInputs" : "");
                         });

// The files are the same whatever the pool's size (the parallel steps split rows, channels or panels, never a sum):
// awq with its float inputs, awq+gptq with quantized ones.
TEST(AwqRequest, TheSameFilesAtAnyPoolSize) {
  test::TempDir tmp;
  for (const char* method : {"awq", "awq+gptq"}) {
    std::vector<std::string> files;
    for (const int threads : {1, 2, 3}) {
      ThreadPool pool(threads);
      QuantizeRequest r;
      r.input = WOQ_MODEL_DIR;
      r.method = method;
      r.awq_propagate = std::string(method) == "awq" ? "float" : "quantized";
      r.low_bit = "asym_int4";
      r.group_size = 32;
      r.calib_file = WOQ_TEST_DATA "/tinystories_calibration.txt";
      r.nsamples = 4;
      r.seqlen = 64;
      r.output = tmp.file(fmt::format("{}-{}", method, threads));
      run_quantize_request(r, pool, {});
      files.push_back(test::read_file(r.output + "/model.safetensors"));
      // The settings quantization_config has no field for are recorded in its meta.
      const auto settings = nlohmann::json::parse(test::read_file(r.output + "/config.json"))
                                .at("quantization_config").at("meta").at("woq_settings");
      EXPECT_EQ(settings, nlohmann::json::parse(fmt::format(
                              R"({{"awq_grid": 20, "awq_clip": true, "awq_search_tokens": 512, "awq_propagate": "{}"}})",
                              *r.awq_propagate)))
          << method;
    }
    EXPECT_TRUE(files[0] == files[1]) << method;
    EXPECT_TRUE(files[0] == files[2]) << method;
  }
}

// More search tokens than the calibration holds (up to INT64_MAX, what CLI11 makes of a larger number) means all.
TEST(AwqRequest, SearchTokensBeyondTheCalibrationMeanAll) {
  ThreadPool pool(2);
  test::TempDir tmp;
  QuantizeRequest r;
  r.input = WOQ_MODEL_DIR;
  r.method = "awq";
  r.calib_file = WOQ_TEST_DATA "/tinystories_calibration.txt";
  r.nsamples = 4;
  r.seqlen = 64;
  r.awq_clip = false;
  std::vector<std::string> files;
  for (const std::int64_t tokens : {std::int64_t{0}, std::int64_t{256}, std::numeric_limits<std::int64_t>::max()}) {
    r.awq_search_tokens = tokens;
    r.output = tmp.file(std::to_string(tokens));
    run_quantize_request(r, pool, {});
    files.push_back(test::read_file(r.output + "/model.safetensors"));
  }
  EXPECT_TRUE(files[0] == files[1]);
  EXPECT_TRUE(files[0] == files[2]);
}

// A finite weight whose group scale overflows fp16 (1e30): the error names the tensor, whichever step meets it.
TEST(AwqRequest, AWeightBeyondFp16NamesItsTensor) {
  ThreadPool pool(2);
  test::TempDir tmp;
  test::copy_model(WOQ_MODEL_DIR, tmp.file("model"));
  std::vector<test::RawTensor> tensors = test::read_safetensors(tmp.file("model/model.safetensors"));
  bool found = false;
  for (test::RawTensor& t : tensors)
    if (t.name == "model.layers.1.mlp.up_proj.weight") {
      ASSERT_EQ(t.dtype, "F32");
      const float big = 1e30f;
      std::memcpy(t.bytes.data() + 4 * 70, &big, 4);
      found = true;
    }
  ASSERT_TRUE(found);
  test::write_safetensors(tmp.file("model/model.safetensors"), tensors);
  QuantizeRequest r;
  r.input = tmp.file("model");
  r.output = tmp.file("out");
  r.method = "awq";
  r.calib_file = WOQ_TEST_DATA "/tinystories_calibration.txt";
  r.nsamples = 2;
  r.seqlen = 32;
  const std::string error = error_of([&] { run_quantize_request(r, pool, {}); });
  EXPECT_NE(error.find("model.layers.1.mlp.up_proj.weight"), std::string::npos) << error;
  EXPECT_NE(error.find("overflows fp16"), std::string::npos) << error;
}

TEST(AwqRequest, OptionsThatDoNotApplyAreRefused) {
  ThreadPool pool(2);
  test::TempDir tmp;
  QuantizeRequest r;
  r.input = WOQ_MODEL_DIR;
  r.output = tmp.file("out");
  r.method = "awq";
  r.awq_grid = 0;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--awq-grid must be in [1, 1000]"), std::string::npos);
  r.awq_grid.reset();
  r.damp_percent = 0.1;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--damp-percent is a GPTQ option"), std::string::npos);
  r.damp_percent.reset();
  r.method = "rtn";
  r.resume = true;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--resume applies to --method gptq, awq or awq+gptq only"),
            std::string::npos);
  r.resume = false;
  r.method = "awq";
  r.awq_search_tokens = -1;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--awq-search-tokens must be 0 (all) or positive"),
            std::string::npos);
  r.method = "rtn";
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--awq-search-tokens applies to --method awq"),
            std::string::npos);
  r.awq_search_tokens.reset();
  r.awq_clip = false;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--no-clip applies to --method awq"), std::string::npos);
  r.awq_clip.reset();
  r.awq_propagate = "float";
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--awq-propagate applies to --method awq"),
            std::string::npos);
  r.method = "awq";
  r.awq_propagate = "fp32";
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--awq-propagate must be quantized or float, got 'fp32'"),
            std::string::npos);
  r.awq_propagate.reset();
  r.method = "awq";  // the method's refusal first, not that of a calibration option it brought
  r.format = "gguf";
  r.nsamples = 2;
  EXPECT_NE(error_of([&] { run_quantize_request(r, pool, {}); }).find("--method awq is for --format gptq or awq"),
            std::string::npos);
}

}  // namespace
}  // namespace woq
