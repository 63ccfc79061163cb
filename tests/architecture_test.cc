// The four architectures (Llama 3, Mistral, Qwen2, Qwen3) against an
// independent float64 NumPy forward pass (tests/reference/llama_reference.py),
// on random checkpoints whose weights are large enough that every feature
// (biases, q/k norms, llama3 and linear RoPE scaling, sliding windows)
// changes the greedy output: the reference without the feature is shown to
// disagree. Then every quantized format and `woq quantize` (RTN and GPTQ) on
// each architecture.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/perplexity.h"
#include "io/quantized_checkpoint.h"
#include "model/llama.h"
#include "model/random_checkpoint.h"
#include "quantize/gguf_export.h"
#include "quantize/gptq_calibration.h"
#include "quantize/quantize_checkpoint.h"
#include "quantize/quantize_request.h"
#include "test_files.h"

namespace woq {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

struct ArchCase {
  const char* preset;
  std::vector<std::string> features;  ///< what the reference can switch off, each of which must matter
};

void PrintTo(const ArchCase& c, std::ostream* os) { *os << c.preset; }

const QuantSpec kFp32{LowBit::kFp32, 32, Int4Range::kFull};
constexpr double kWeightStd = 0.3;  // logits of std ~2.4: clear argmax margins, features that matter

std::string write_model(const test::TempDir& tmp, const std::string& preset, DType dtype = DType::kF32) {
  ThreadPool pool(2);
  RandomCheckpointOptions o;
  o.preset = preset;
  o.dtype = dtype;
  o.seed = 17;
  o.weight_std = kWeightStd;
  const std::string dir = tmp.file(preset);
  write_random_checkpoint(dir, o, pool);
  return dir;
}

// Runs the reference; nullopt when python3 with NumPy is missing.
std::optional<json> reference(const std::string& dir, const json& plan) {
  test::TempDir tmp;
  test::write_file(tmp.file("plan.json"), plan.dump());
  const std::string python = test::python();
  const std::string cmd = python + " " WOQ_TEST_SOURCE "/reference/llama_reference.py " + dir + " " +
                          tmp.file("plan.json") + " > " + tmp.file("out.json") + " 2> " + tmp.file("err");
  const int status = std::system(cmd.c_str());
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  if (code == 77 || code == 127) return std::nullopt;
  EXPECT_EQ(code, 0) << test::read_file(tmp.file("err"));
  return json::parse(test::read_file(tmp.file("out.json")));
}

std::vector<std::int32_t> random_ids(std::mt19937& rng, std::size_t n, std::int32_t vocab) {
  std::vector<std::int32_t> ids(n);
  for (auto& id : ids) id = static_cast<std::int32_t>(rng() % static_cast<std::uint32_t>(vocab));
  return ids;
}

std::vector<std::int32_t> greedy(LlamaModel& model, const std::vector<std::int32_t>& prompt, std::int64_t n) {
  KVCache cache = model.make_cache(static_cast<std::int64_t>(prompt.size()) + n);
  std::vector<float> logits;
  model.forward(prompt, cache, false, logits);
  std::vector<std::int32_t> out;
  for (std::int64_t i = 0; i < n; ++i) {
    const auto next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    model.forward(std::span(&next, 1), cache, false, logits);
  }
  return out;
}

std::vector<double> nll_of(LlamaModel& model, const std::vector<std::vector<std::int32_t>>& sequences) {
  std::vector<double> nll;
  const std::int64_t vocab = model.config().vocab_size;
  for (const auto& seq : sequences) {
    KVCache cache = model.make_cache(static_cast<std::int64_t>(seq.size()));
    std::vector<float> logits;
    model.forward(seq, cache, true, logits);
    for (std::size_t j = 0; j + 1 < seq.size(); ++j)
      nll.push_back(token_nll(logits.data() + static_cast<std::int64_t>(j) * vocab, vocab, seq[j + 1]));
  }
  return nll;
}

class Architecture : public ::testing::TestWithParam<ArchCase> {};

TEST_P(Architecture, MatchesF64ReferenceAndEveryFeatureMatters) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, GetParam().preset);
  ThreadPool pool(2);
  auto model = LlamaModel::load(dir, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  const ModelConfig& c = model->config();
  std::mt19937 rng(3);
  const std::vector<std::vector<std::int32_t>> sequences = {random_ids(rng, 64, 512), random_ids(rng, 48, 512)};
  const std::vector<std::int32_t> prompt = random_ids(rng, 8, 512);
  constexpr std::int64_t kGenerate = 40;  // positions up to 48: past the windows and rope's original context
  json plan = {{"sequences", sequences}, {"first_scored", 0}, {"greedy", {{"prompt", prompt}, {"n", kGenerate}}}};
  const auto ref = reference(dir, plan);
  if (!ref) WOQ_SKIP_WITHOUT_REFERENCE(test::python() << " lacks NumPy (bash tools/install-deps.sh)");

  const std::vector<double> nll = nll_of(*model, sequences);
  const auto ref_nll = (*ref)["nll"].get<std::vector<double>>();
  ASSERT_EQ(nll.size(), ref_nll.size());
  const double ppl = perplexity(nll).ppl, ref_ppl = perplexity(ref_nll).ppl;
  EXPECT_NEAR(ppl, ref_ppl, 1e-4 * ref_ppl);
  const auto want = (*ref)["greedy"].get<std::vector<std::int32_t>>();
  EXPECT_EQ(greedy(*model, prompt, kGenerate), want);
  std::printf("%s: perplexity %.6f (reference %.6f), %lld greedy tokens equal\n", GetParam().preset, ppl, ref_ppl,
              static_cast<long long>(kGenerate));

  // Each feature changes the reference's output: without it, the greedy tokens differ.
  for (const std::string& feature : GetParam().features) {
    plan["disable"] = {feature};
    plan.erase("sequences");
    const auto without = reference(dir, plan);
    ASSERT_TRUE(without.has_value());
    EXPECT_NE((*without)["greedy"].get<std::vector<std::int32_t>>(), want)
        << GetParam().preset << ": the reference without " << feature << " gives the same tokens";
  }

  // Prefill and token-by-token decode give the same logits (the window too).
  KVCache whole = model->make_cache(64), steps = model->make_cache(64);
  std::vector<float> all, one, stepped;
  model->forward(sequences[0], whole, true, all);
  for (const std::int32_t id : sequences[0]) {
    model->forward(std::span(&id, 1), steps, false, one);
    stepped.insert(stepped.end(), one.begin(), one.end());
  }
  EXPECT_EQ(all, stepped);
  EXPECT_EQ(c.context_limit(), 256);  // a sliding window is not the context
}

INSTANTIATE_TEST_SUITE_P(
    Reference, Architecture,
    ::testing::Values(ArchCase{"tiny-llama3", {"rope_scaling", "bias"}}, ArchCase{"tiny-mistral", {"sliding_window"}},
                      ArchCase{"tiny-qwen2", {"bias", "rope_scaling", "sliding_window"}},
                      ArchCase{"tiny-qwen3", {"qk_norm"}}, ArchCase{"tiny-phi3", {"sliding_window"}}),
    [](const auto& param_info) {
      std::string n = param_info.param.preset;
      std::replace(n.begin(), n.end(), '-', '_');
      return n;
    });

TEST(Architecture, Bf16CheckpointMatchesReference) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny-qwen3", DType::kBF16);
  std::mt19937 rng(5);
  const std::vector<std::vector<std::int32_t>> sequences = {random_ids(rng, 40, 512)};
  const auto ref = reference(dir, {{"sequences", sequences}, {"first_scored", 0}});
  if (!ref) WOQ_SKIP_WITHOUT_REFERENCE(test::python() << " lacks NumPy (bash tools/install-deps.sh)");
  ThreadPool pool(2);
  auto model = LlamaModel::load(dir, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  const double ppl = perplexity(nll_of(*model, sequences)).ppl;
  const double ref_ppl = perplexity((*ref)["nll"].get<std::vector<double>>()).ppl;
  EXPECT_NEAR(ppl, ref_ppl, 1e-4 * ref_ppl);
}

// Mean KL(p || q) of next-token distributions over `sequences`.
double mean_kl(LlamaModel& p, LlamaModel& q, const std::vector<std::vector<std::int32_t>>& sequences) {
  const std::int64_t vocab = p.config().vocab_size;
  double kl = 0;
  std::int64_t n = 0;
  for (const auto& seq : sequences) {
    KVCache cp = p.make_cache(static_cast<std::int64_t>(seq.size())), cq = q.make_cache(static_cast<std::int64_t>(seq.size()));
    std::vector<float> lp, lq;
    p.forward(seq, cp, true, lp);
    q.forward(seq, cq, true, lq);
    for (std::size_t t = 0; t < seq.size(); ++t, ++n) {
      const float* a = lp.data() + static_cast<std::int64_t>(t) * vocab;
      const float* b = lq.data() + static_cast<std::int64_t>(t) * vocab;
      const double ma = *std::max_element(a, a + vocab), mb = *std::max_element(b, b + vocab);
      double za = 0, zb = 0;
      for (std::int64_t i = 0; i < vocab; ++i) za += std::exp(a[i] - ma), zb += std::exp(b[i] - mb);
      const double lza = std::log(za), lzb = std::log(zb);
      for (std::int64_t i = 0; i < vocab; ++i) {
        const double la = a[i] - ma - lza, lb = b[i] - mb - lzb;
        kl += std::exp(la) * (la - lb);
      }
    }
  }
  return kl / static_cast<double>(n);
}

class ArchitectureQuantized : public ::testing::TestWithParam<const char*> {};

// Every in-memory format runs and tracks fp32; `woq quantize` (RTN) writes a
// checkpoint that loads to the same logits with its biases and norms kept in
// float; GPTQ's checkpoint loads and is at least as close to fp32 as RTN on
// its calibration-like data.
TEST_P(ArchitectureQuantized, FormatsAndQuantizeRoundTrip) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, GetParam(), DType::kF16);
  ThreadPool pool(2);
  auto fp32 = LlamaModel::load(dir, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
  std::mt19937 rng(9);
  const std::vector<std::vector<std::int32_t>> sequences = {random_ids(rng, 32, 512), random_ids(rng, 32, 512)};
  // Bounds far below what a broken format gives (several nats) on these
  // deliberately harsh weights (std 0.3 at hidden 64), and 8 bits well ahead of 4.
  const std::vector<std::pair<QuantSpec, double>> specs = {{{LowBit::kSymInt8, -1, Int4Range::kFull}, 0.02},
                                                           {{LowBit::kSymInt4, 32, Int4Range::kFull}, 1.0},
                                                           {{LowBit::kAsymInt4, 32, Int4Range::kFull}, 1.0}};
  double int8_kl = 0;
  for (const auto& [spec, limit] : specs) {
    auto q = LlamaModel::load(dir, LoadOptions{spec, std::nullopt, std::nullopt, {}}, pool);
    const double kl = mean_kl(*fp32, *q, sequences);
    EXPECT_LT(kl, limit) << GetParam() << " " << low_bit_name(spec.type);
    EXPECT_GT(kl, 0.0) << GetParam() << " " << low_bit_name(spec.type);
    if (spec.type == LowBit::kSymInt8) int8_kl = kl;
    else EXPECT_GT(kl, 5 * int8_kl) << GetParam() << " " << low_bit_name(spec.type);
    std::printf("%s %s: mean KL to fp32 %.5f\n", GetParam(), low_bit_name(spec.type).data(), kl);
  }

  const QuantSpec int4{LowBit::kSymInt4, 32, Int4Range::kFull};
  QuantizeOptions options;
  options.spec = int4;
  quantize_checkpoint(dir, tmp.file("rtn"), options, pool);
  const TensorStore saved = TensorStore::open(tmp.file("rtn"));
  const ModelConfig& c = fp32->config();
  EXPECT_EQ(saved.find("model.layers.0.self_attn.k_proj.bias") != nullptr, c.attention_bias);
  EXPECT_EQ(saved.find("model.layers.1.self_attn.o_proj.bias") != nullptr, c.o_bias);
  EXPECT_EQ(saved.find("model.layers.1.self_attn.q_norm.weight") != nullptr, c.qk_norm);
  auto in_memory = LlamaModel::load(dir, LoadOptions{int4, std::nullopt, std::nullopt, {}}, pool);
  auto reloaded = LlamaModel::load(tmp.file("rtn"), LoadOptions{int4, std::nullopt, std::nullopt, {}}, pool);
  std::vector<float> a, b;
  KVCache ca = in_memory->make_cache(32), cb = reloaded->make_cache(32);
  in_memory->forward(sequences[0], ca, true, a);
  reloaded->forward(sequences[0], cb, true, b);
  EXPECT_EQ(a, b);
  const double rtn_kl = mean_kl(*fp32, *reloaded, sequences);

  // GPTQ calibrated on these very sequences.
  {
    auto calib_model = load_for_calibration(dir, pool);
    const TensorStore store = TensorStore::open(dir);
    GptqOptions g;
    g.spec = int4;
    options.method = "gptq";
    quantize_checkpoint(dir, tmp.file("gptq"), options, pool,
                        gptq_block_quantizer(*calib_model, store, sequences, g, false, pool));
  }
  auto gptq = LlamaModel::load(tmp.file("gptq"), LoadOptions{int4, std::nullopt, std::nullopt, {}}, pool);
  const double gptq_kl = mean_kl(*fp32, *gptq, sequences);
  std::printf("%s sym_int4 g32: RTN KL %.5f, GPTQ KL %.5f\n", GetParam(), rtn_kl, gptq_kl);
  EXPECT_LT(gptq_kl, rtn_kl);
}

INSTANTIATE_TEST_SUITE_P(Quantized, ArchitectureQuantized,
                         ::testing::Values("tiny-llama3", "tiny-mistral", "tiny-qwen2", "tiny-qwen3"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

}  // namespace
}  // namespace woq

namespace woq {
namespace {

// Tensors the configured architecture would ignore are refused (a Qwen
// checkpoint labelled Llama would otherwise load and give other tokens).
TEST(Architecture, TensorsTheArchitectureDoesNotUseAreRefused) {
  test::TempDir tmp;
  ThreadPool pool(1);
  auto relabel = [&](const std::string& dir, const std::string& from, const std::string& to) {
    std::string cfg = test::read_file(dir + "/config.json");
    cfg.replace(cfg.find(from), from.size(), to);
    test::write_file(dir + "/config.json", cfg);
  };
  auto load_error = [&](const std::string& dir) {
    try {
      LlamaModel::load(dir, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(loaded)");
  };
  const std::string qwen3 = write_model(tmp, "tiny-qwen3");
  relabel(qwen3, "Qwen3ForCausalLM", "LlamaForCausalLM");
  EXPECT_NE(load_error(qwen3).find("_norm.weight' is a q/k norm, which LlamaForCausalLM does not have"),
            std::string::npos)
      << load_error(qwen3);
  const std::string qwen2 = write_model(tmp, "tiny-qwen2");
  relabel(qwen2, "Qwen2ForCausalLM", "MistralForCausalLM");
  EXPECT_NE(load_error(qwen2).find("_proj.bias' is a bias that MistralForCausalLM"), std::string::npos)
      << load_error(qwen2);
  const std::string llama3 = write_model(tmp, "tiny-llama3");
  relabel(llama3, "\"attention_bias\": true", "\"attention_bias\": false");
  EXPECT_NE(load_error(llama3).find("(attention_bias false)"), std::string::npos) << load_error(llama3);
}

// Phi-3 runs from its float checkpoints; what woq cannot do with it is refused by name: a quantized checkpoint of
// it, writing one (GPTQ or GGUF would need the fused layout), partial rotary (Phi-3.5 / Phi-4-mini), and a
// separate projection stored beside the fused one. A Llama checkpoint holding fused tensors stays refused.
TEST(Architecture, WhatWoqCannotDoWithPhi3IsRefusedByName) {
  test::TempDir tmp;
  ThreadPool pool(1);
  const std::string dir = write_model(tmp, "tiny-phi3");
  auto error_of = [&](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  auto load = [&](const std::string& d) { LlamaModel::load(d, LoadOptions{kFp32, std::nullopt, std::nullopt, {}}, pool); };
  auto edit_config = [](const std::string& d, const std::function<void(json&)>& edit) {
    json cfg = json::parse(test::read_file(d + "/config.json"));
    edit(cfg);
    test::write_file(d + "/config.json", cfg.dump());
  };
  for (const char* format : {"gptq", "gguf"}) {
    QuantizeRequest r;
    r.input = dir;
    r.output = tmp.file(std::string("out.") + format);
    r.format = format;
    const std::string e = error_of([&] { run_quantize_request(r, pool, {}); });
    EXPECT_NE(e.find("Phi3ForCausalLM stores q/k/v and gate/up fused"), std::string::npos) << e;
    EXPECT_FALSE(fs::exists(r.output));
  }
  // The library calls behind them refuse too (Python's save_pretrained calls quantize_checkpoint).
  QuantizeOptions rtn;
  rtn.spec = {LowBit::kSymInt4, 128, Int4Range::kFull};
  std::string e = error_of([&] { quantize_checkpoint(dir, tmp.file("rtn"), rtn, pool); });
  EXPECT_NE(e.find("writes no GPTQ or GGUF file of it"), std::string::npos) << e;
  e = error_of([&] { export_gguf(dir, tmp.file("out.gguf"), GgufExportOptions{}, pool); });
  EXPECT_NE(e.find("writes no GPTQ or GGUF file of it"), std::string::npos) << e;
  // Phi-3-128k's rope scaling is refused by its type, whatever fields it has.
  const std::string longrope = tmp.file("longrope");
  fs::copy(dir, longrope);
  edit_config(longrope, [](json& c) {
    c["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1.0, 1.0}}, {"long_factor", {2.0, 2.0}}};
  });
  e = error_of([&] { load(longrope); });
  EXPECT_NE(e.find("has type 'longrope'"), std::string::npos) << e;
  const std::string partial = tmp.file("partial");
  fs::copy(dir, partial);
  edit_config(partial, [](json& c) { c["partial_rotary_factor"] = 0.75; });
  e = error_of([&] { load(partial); });
  EXPECT_NE(e.find("partial_rotary_factor"), std::string::npos) << e;

  const std::string gptq = tmp.file("gptq");
  fs::copy(dir, gptq);
  edit_config(gptq, [](json& c) {
    c["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"desc_act", false},
                                {"sym", true}};
  });
  e = error_of([&] { load(gptq); });
  EXPECT_NE(e.find("(fused qkv_proj and gate_up_proj) is not supported"), std::string::npos) << e;

  // The same weights relabelled Llama: the fused tensors are refused, not ignored.
  const std::string llama = tmp.file("llama");
  fs::copy(dir, llama);
  edit_config(llama, [](json& c) { c["architectures"] = {"LlamaForCausalLM"}; c["model_type"] = "llama"; });
  e = error_of([&] { load(llama); });
  EXPECT_NE(e.find("is a fused projection"), std::string::npos) << e;
}

// config.json's sliding-window fields as transformers reads them: layer_types
// when given, Qwen's default window of 4096, windows only where they apply.
TEST(Architecture, SlidingWindowConfigFields) {
  test::TempDir tmp;
  const std::string dir = write_model(tmp, "tiny-qwen2");
  auto with = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json cfg = nlohmann::json::parse(test::read_file(dir + "/config.json"));
    edit(cfg);
    test::write_file(tmp.file("edited.json"), cfg.dump());
    std::filesystem::create_directories(tmp.file("e"));
    std::filesystem::copy_file(tmp.file("edited.json"), tmp.file("e/config.json"),
                               std::filesystem::copy_options::overwrite_existing);
    return read_model_config(tmp.file("e"));
  };
  ModelConfig c = with([](nlohmann::json&) {});
  EXPECT_EQ(c.window(0), 0);
  EXPECT_EQ(c.window(1), 12);
  c = with([](nlohmann::json& j) { j.erase("sliding_window"); });
  EXPECT_EQ(c.window(1), 4096);  // Qwen2Config's default
  c = with([](nlohmann::json& j) { j["use_sliding_window"] = false; });
  EXPECT_EQ(c.window(1), 0);
  c = with([](nlohmann::json& j) { j["layer_types"] = {"sliding_attention", "full_attention"}; });
  EXPECT_EQ(c.window(0), 12);
  EXPECT_EQ(c.window(1), 0);
  EXPECT_THROW(with([](nlohmann::json& j) { j["layer_types"] = {"sliding_attention"}; }), Error);
  EXPECT_THROW(with([](nlohmann::json& j) { j["layer_types"] = {"full_attention", "chunked"}; }), Error);
  EXPECT_THROW(with([](nlohmann::json& j) { j["rope_scaling"] = {{"rope_type", "linear"}}; }), Error);  // no factor
  EXPECT_THROW(with([](nlohmann::json& j) { j["num_experts"] = 18446744073709551615ull; }), Error);
  EXPECT_THROW(with([](nlohmann::json& j) { j["rope_scaling"] = {1, 2}; }), Error);
}

}  // namespace
}  // namespace woq
