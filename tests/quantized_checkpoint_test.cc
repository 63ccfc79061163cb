// woq quantize -> GPTQ checkpoint -> load: bit-identical integers and
// identical logits to in-memory quantization; act-order and
// compressed-tensors checkpoints; bad quantized checkpoints; safe writing.
#include <gtest/gtest.h>

#include <optional>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <optional>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/hash.h"
#include "core/half.h"
#include "io/quantized_checkpoint.h"
#include "model/llama.h"
#include "model/random_checkpoint.h"
#include "quantize/quantize_checkpoint.h"
#include "quantize/resume.h"
#include "test_files.h"

namespace woq {
namespace {

namespace fs = std::filesystem;
using test::RawTensor;
using test::TempDir;

std::vector<float> logits_of(const std::string& dir, const QuantSpec& spec, ThreadPool& pool,
                             std::optional<Activations> activations = std::nullopt) {
  auto model = LlamaModel::load(dir, LoadOptions{spec, std::nullopt, activations, {}}, pool);
  KVCache cache = model->make_cache(16);
  std::vector<float> logits;
  const std::vector<std::int32_t> tokens = {1, 403, 407, 261, 378, 9, 300};
  model->forward(tokens, cache, true, logits);
  std::vector<float> step;
  model->forward(std::vector<std::int32_t>{42}, cache, false, step);  // a decode step too
  logits.insert(logits.end(), step.begin(), step.end());
  return logits;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Case {
  QuantSpec spec;
  GptqZeros zeros;
};

std::vector<Case> cases() {
  return {{{LowBit::kSymInt4, 32, Int4Range::kFull}, GptqZeros::kV1},
          {{LowBit::kSymInt4, 64, Int4Range::kClip}, GptqZeros::kV1},
          {{LowBit::kSymInt4, 128, Int4Range::kFull}, GptqZeros::kV2},
          {{LowBit::kSymInt4, -1, Int4Range::kFull}, GptqZeros::kV1},
          {{LowBit::kAsymInt4, 32, Int4Range::kFull}, GptqZeros::kV2},
          {{LowBit::kAsymInt4, -1, Int4Range::kFull}, GptqZeros::kV2},
          {{LowBit::kSymInt8, 32, Int4Range::kFull}, GptqZeros::kV1},
          {{LowBit::kSymInt8, -1, Int4Range::kFull}, GptqZeros::kV1}};
}

// Every linear of `out` equals quantize_matrix of the same tensor of `in`.
void expect_identical_linears(const std::string& in, const std::string& out, const QuantSpec& spec) {
  const ModelConfig config = read_model_config(in);
  const TensorStore src = TensorStore::open(in);
  const TensorStore dst = TensorStore::open(out);
  const auto qc = read_quantization_config(out);
  ASSERT_TRUE(qc.has_value());
  std::vector<std::string> warnings;
  for (std::int64_t l = 0; l < config.num_hidden_layers; ++l)
    for (const LinearSpec& linear : kBlockLinears) {
      const std::string prefix = fmt::format("model.layers.{}.{}", l, linear.module);
      const TensorView& t = src.get(prefix + ".weight");
      std::vector<float> w(static_cast<std::size_t>(t.numel()));
      tensor_to_f32(t, w.data());
      const QuantMatrix want = quantize_matrix(w.data(), t.shape[0], t.shape[1], spec);
      const auto got = load_quantized_linear(dst, *qc, prefix, t.shape[0], t.shape[1], warnings);
      ASSERT_TRUE(got.has_value()) << prefix;
      EXPECT_EQ(got->type, want.type) << prefix;
      EXPECT_EQ(got->data, want.data) << prefix;
      EXPECT_EQ(got->scales, want.scales) << prefix;
      EXPECT_EQ(got->zeros, want.zeros) << prefix;
    }
  EXPECT_TRUE(warnings.empty());
}

void round_trip(const std::string& in, std::uint64_t max_shard_bytes) {
  ThreadPool pool(2);
  for (const Case& c : cases()) {
    SCOPED_TRACE(fmt::format("{} group_size {} {}", low_bit_name(c.spec.type), c.spec.group_size,
                             int4_range_name(c.spec.int4_range)));
    TempDir tmp;
    const std::string out = tmp.file("q");
    QuantizeOptions options;
    options.spec = c.spec;
    options.zeros = c.zeros;
    options.max_shard_bytes = max_shard_bytes;
    quantize_checkpoint(in, out, options, pool);
    expect_identical_linears(in, out, c.spec);
    EXPECT_EQ(logits_of(out, c.spec, pool), logits_of(in, c.spec, pool));
  }
}

TEST(QuantizedCheckpoint, BundledModelRoundTripsEveryFormat) { round_trip(WOQ_MODEL_DIR, 5'000'000'000); }

TEST(QuantizedCheckpoint, OddShapedRandomModelRoundTripsSharded) {
  TempDir tmp;
  ThreadPool pool(2);
  RandomCheckpointOptions r;
  r.preset = "tiny";  // hidden 128, intermediate 344 (not a multiple of 32 or 64)
  r.seed = 5;
  write_random_checkpoint(tmp.file("random"), r, pool);
  round_trip(tmp.file("random"), 200'000);  // several shards and the index
}

TEST(QuantizedCheckpoint, ConfigDescribesTheFormat) {
  TempDir tmp;
  ThreadPool pool(1);
  QuantizeOptions options;
  options.spec = {LowBit::kAsymInt4, 32, Int4Range::kFull};
  options.zeros = GptqZeros::kV2;
  quantize_checkpoint(WOQ_MODEL_DIR, tmp.file("q"), options, pool);
  const auto config = nlohmann::json::parse(test::read_file(tmp.file("q/config.json")));
  const auto& q = config.at("quantization_config");
  EXPECT_EQ(q.at("quant_method"), "gptq");
  EXPECT_EQ(q.at("bits"), 4);
  EXPECT_EQ(q.at("group_size"), 32);
  EXPECT_EQ(q.at("sym"), false);
  EXPECT_EQ(q.at("desc_act"), false);
  EXPECT_EQ(q.at("checkpoint_format"), "gptq_v2");
  EXPECT_NE(q.at("meta").at("woq_notes").dump().find("K = 172"), std::string::npos);
  EXPECT_EQ(config.at("hidden_size"), 64);  // the rest of config.json is kept
  EXPECT_TRUE(fs::exists(tmp.file("q/tokenizer.model")));
  EXPECT_TRUE(fs::exists(tmp.file("q/generation_config.json")));
}

// Rewrites tensors of a checkpoint's single model.safetensors.
void edit_tensors(const std::string& dir, const std::function<void(std::vector<RawTensor>&)>& edit) {
  auto tensors = test::read_safetensors(dir + "/model.safetensors");
  edit(tensors);
  test::write_safetensors(dir + "/model.safetensors", tensors);
}

RawTensor& find(std::vector<RawTensor>& tensors, const std::string& name) {
  for (auto& t : tensors)
    if (t.name == name) return t;
  throw std::runtime_error("no tensor " + name);
}

template <typename T>
std::vector<T> as(const RawTensor& t) {
  std::vector<T> v(t.bytes.size() / sizeof(T));
  std::memcpy(v.data(), t.bytes.data(), t.bytes.size());
  return v;
}

template <typename T>
void store(RawTensor& t, const std::vector<T>& v) {
  const auto* bytes = reinterpret_cast<const std::uint8_t*>(v.data());
  t.bytes.assign(bytes, bytes + v.size() * sizeof(T));
}

void edit_config(const std::string& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto config = nlohmann::json::parse(test::read_file(dir + "/config.json"));
  edit(config);
  test::write_file(dir + "/config.json", config.dump(1));
}

// An act-order checkpoint whose groups are relabelled by a permutation:
// g_idx[k] = perm[k / g], with the scales and zeros rows moved along. It
// stores the same W, so it must give the same logits (up to the order of
// the float sums over groups).
TEST(QuantizedCheckpoint, ActOrderCheckpointMatchesUnpermutedEquivalent) {
  ThreadPool pool(2);
  for (const Case& c : {Case{{LowBit::kSymInt4, 32, Int4Range::kFull}, GptqZeros::kV1},
                        Case{{LowBit::kAsymInt4, 32, Int4Range::kFull}, GptqZeros::kV2},
                        Case{{LowBit::kSymInt8, 32, Int4Range::kFull}, GptqZeros::kV1}}) {
    SCOPED_TRACE(low_bit_name(c.spec.type));
    TempDir tmp;
    QuantizeOptions options;
    options.spec = c.spec;
    options.zeros = c.zeros;
    quantize_checkpoint(WOQ_MODEL_DIR, tmp.file("plain"), options, pool);
    test::copy_model(tmp.file("plain"), tmp.file("act"));
    edit_tensors(tmp.file("act"), [&](std::vector<RawTensor>& tensors) {
      for (const char* linear : {"self_attn.q_proj", "mlp.down_proj"}) {
        const std::string p = std::string("model.layers.1.") + linear;
        RawTensor& g_idx_t = find(tensors, p + ".g_idx");
        auto g_idx = as<std::int32_t>(g_idx_t);
        const std::int64_t groups = find(tensors, p + ".scales").shape[0];
        const std::int64_t n = find(tensors, p + ".scales").shape[1];
        std::vector<std::int32_t> perm(static_cast<std::size_t>(groups));
        // Reversed labels; a short last group (K = 172) keeps the last label,
        // as in GPTQ's desc_act maps.
        std::iota(perm.begin(), perm.end(), 0);
        std::reverse(perm.begin(), perm.end() - (g_idx.size() % 32 != 0 ? 1 : 0));
        for (auto& g : g_idx) g = perm[static_cast<std::size_t>(g)];
        store(g_idx_t, g_idx);
        RawTensor& scales_t = find(tensors, p + ".scales");
        RawTensor& zeros_t = find(tensors, p + ".qzeros");
        auto scales = as<std::uint16_t>(scales_t);
        auto zeros = as<std::int32_t>(zeros_t);
        auto new_scales = scales;
        auto new_zeros = zeros;
        const std::int64_t zcols = zeros_t.shape[1];
        for (std::int64_t g = 0; g < groups; ++g) {
          const std::int64_t to = perm[static_cast<std::size_t>(g)];
          std::copy_n(scales.begin() + g * n, n, new_scales.begin() + to * n);
          std::copy_n(zeros.begin() + g * zcols, zcols, new_zeros.begin() + to * zcols);
        }
        store(scales_t, new_scales);
        store(zeros_t, new_zeros);
      }
    });
    edit_config(tmp.file("act"), [](nlohmann::json& cfg) { cfg["quantization_config"]["desc_act"] = true; });
    // Activations rounded per element or per block of 32 (a group here), so that relabelling groups only
    // reorders float sums: sym_int8's default int16 activations share a scale per 128 inputs, which the
    // relabelling regroups (a rounding difference of ~2e-4 in these logits).
    const std::optional<Activations> act =
        c.spec.type == LowBit::kSymInt8 ? std::optional(Activations::kBf16) : std::nullopt;
    const auto want = logits_of(tmp.file("plain"), c.spec, pool, act);
    const auto got = logits_of(tmp.file("act"), c.spec, pool, act);
    ASSERT_EQ(got.size(), want.size());
    for (std::size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4f * (1 + std::fabs(want[i]))) << i;
    EXPECT_NE(got, std::vector<float>(got.size(), 0.0f));
  }
}

// compressed-tensors pack-quantized tensors of `w`, packed as the format
// description says (signed value + 2^(bits-1), LSB first along K).
void add_pack_quantized(std::vector<RawTensor>& out, const std::string& prefix, const QuantMatrix& w) {
  const int bits = w.type == LowBit::kSymInt8 ? 8 : 4;
  const std::int64_t n = w.rows, k = w.cols, g = w.groups_per_row;
  std::vector<float> row(static_cast<std::size_t>(k));
  std::vector<std::uint32_t> packed(static_cast<std::size_t>(n * ((k * bits + 31) / 32)), 0);
  std::vector<std::uint32_t> zp(static_cast<std::size_t>((n * bits + 31) / 32 * g), 0);
  for (std::int64_t r = 0; r < n; ++r) {
    for (std::int64_t c = 0; c < k; ++c) {
      // Stored integer of woq's layout, as unsigned (value + 2^(bits-1)).
      const std::uint8_t* p = w.data.data() + r * w.row_bytes;
      const std::uint32_t u = bits == 8 ? static_cast<std::uint32_t>(static_cast<std::int8_t>(p[c]) + 128)
                                        : (c % 2 == 0 ? p[c / 2] & 0xfu : p[c / 2] >> 4u);
      packed[static_cast<std::size_t>(r * ((k * bits + 31) / 32) + c * bits / 32)] |= u << (c * bits % 32);
    }
    if (w.type == LowBit::kAsymInt4)
      for (std::int64_t j = 0; j < g; ++j)
        zp[static_cast<std::size_t>(r * bits / 32 * g + j)] |= std::uint32_t{w.zeros[static_cast<std::size_t>(r * g + j)]}
                                                               << (r * bits % 32);
  }
  RawTensor t{prefix + ".weight_packed", "I32", {n, (k * bits + 31) / 32}, {}};
  store(t, packed);
  out.push_back(t);
  RawTensor s{prefix + ".weight_scale", "F16", {n, g}, {}};
  store(s, w.scales);
  out.push_back(s);
  RawTensor shape{prefix + ".weight_shape", "I64", {2}, {}};
  store(shape, std::vector<std::int64_t>{n, k});
  out.push_back(shape);
  if (w.type == LowBit::kAsymInt4) {
    RawTensor z{prefix + ".weight_zero_point", "I32", {(n * bits + 31) / 32, g}, {}};
    store(z, zp);
    out.push_back(z);
  }
}

TEST(QuantizedCheckpoint, CompressedTensorsPackQuantizedMatchesInMemoryQuantization) {
  ThreadPool pool(2);
  for (const QuantSpec spec : {QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kAsymInt4, 64, Int4Range::kFull},
                               QuantSpec{LowBit::kSymInt8, -1, Int4Range::kFull}}) {
    SCOPED_TRACE(low_bit_name(spec.type));
    TempDir tmp;
    const std::string dir = tmp.file("ct");
    test::copy_model(WOQ_MODEL_DIR, dir);
    edit_tensors(dir, [&](std::vector<RawTensor>& tensors) {
      std::vector<RawTensor> out;
      for (const auto& t : tensors) {
        const bool linear = t.name.find("_proj.weight") != std::string::npos;
        if (!linear) {
          out.push_back(t);
          continue;
        }
        const auto w = as<float>(t);
        add_pack_quantized(out, t.name.substr(0, t.name.size() - 7), quantize_matrix(w.data(), t.shape[0], t.shape[1], spec));
      }
      tensors = out;
    });
    edit_config(dir, [&](nlohmann::json& c) {
      nlohmann::json weights = {{"num_bits", spec.type == LowBit::kSymInt8 ? 8 : 4},
                                {"type", "int"},
                                {"symmetric", spec.type != LowBit::kAsymInt4},
                                {"strategy", spec.group_size == -1 ? "channel" : "group"},
                                {"group_size", spec.group_size == -1 ? nlohmann::json() : nlohmann::json(spec.group_size)}};
      c["quantization_config"] = {{"quant_method", "compressed-tensors"},
                                  {"format", "pack-quantized"},
                                  {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}}}}},
                                  {"ignore", {"lm_head"}}};
    });
    EXPECT_EQ(logits_of(dir, spec, pool), logits_of(WOQ_MODEL_DIR, spec, pool));
  }
}

class BadQuantizedCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    ThreadPool pool(1);
    QuantizeOptions options;
    options.spec = {LowBit::kSymInt4, 32, Int4Range::kFull};
    quantize_checkpoint(WOQ_MODEL_DIR, tmp_.file("q"), options, pool);
  }
  std::string dir() const { return tmp_.file("q"); }
  std::string load_error() {
    ThreadPool pool(1);
    return error_of([&] { LlamaModel::load(dir(), LoadOptions{}, pool); });
  }
  TempDir tmp_;
};

TEST_F(BadQuantizedCheckpoint, QuantizedCheckpointLoads) { EXPECT_EQ(load_error(), ""); }

TEST_F(BadQuantizedCheckpoint, QweightWithWrongShape) {
  edit_tensors(dir(), [](std::vector<RawTensor>& t) {
    RawTensor& q = find(t, "model.layers.0.self_attn.q_proj.qweight");
    q.shape = {q.shape[1], q.shape[0]};  // 8x64 -> 64x8
  });
  const std::string e = load_error();
  EXPECT_NE(e.find("'model.layers.0.self_attn.q_proj.qweight' has shape [64, 8], expected [8, 64]"), std::string::npos) << e;
}

TEST_F(BadQuantizedCheckpoint, GIdxOutOfRange) {
  edit_tensors(dir(), [](std::vector<RawTensor>& t) {
    RawTensor& g = find(t, "model.layers.2.mlp.up_proj.g_idx");
    auto v = as<std::int32_t>(g);
    v[5] = 99;
    store(g, v);
  });
  const std::string e = load_error();
  EXPECT_NE(e.find("model.layers.2.mlp.up_proj.qweight': g_idx[5] = 99 is outside [0, 2)"), std::string::npos) << e;
}

TEST_F(BadQuantizedCheckpoint, UnsupportedBits) {
  for (const int bits : {3, 5}) {
    edit_config(dir(), [bits](nlohmann::json& c) { c["quantization_config"]["bits"] = bits; });
    const std::string e = load_error();
    EXPECT_NE(e.find(fmt::format("field 'bits' is {}: woq supports 4- and 8-bit weights only", bits)), std::string::npos)
        << e;
  }
}

TEST_F(BadQuantizedCheckpoint, ConfigDisagreesWithTensors) {
  edit_config(dir(), [](nlohmann::json& c) { c["quantization_config"]["bits"] = 8; });
  std::string e = load_error();
  EXPECT_NE(e.find("qweight' has shape [8, 64], expected [16, 64] (K = 64, N = 64, bits = 8, group_size = 32)"),
            std::string::npos)
      << e;
  edit_config(dir(), [](nlohmann::json& c) {
    c["quantization_config"]["bits"] = 4;
    c["quantization_config"]["group_size"] = 64;
  });
  e = load_error();
  EXPECT_NE(e.find("qzeros' has shape [2, 8], expected [1, 8]"), std::string::npos) << e;
  edit_config(dir(), [](nlohmann::json& c) {
    c["quantization_config"]["group_size"] = 32;
    c["quantization_config"]["sym"] = false;
    c["quantization_config"]["checkpoint_format"] = "gptq_v2";
  });
  EXPECT_EQ(load_error(), "");  // asymmetric reading of zeros 7: a valid, different model
  edit_config(dir(), [](nlohmann::json& c) { c["quantization_config"]["quant_method"] = "awq"; });
  e = load_error();
  EXPECT_NE(e.find("has shape [8, 64], expected [64, 8] (AWQ GEMM 4-bit asym group_size 32"), std::string::npos) << e;
}

TEST_F(BadQuantizedCheckpoint, NonFiniteScale) {
  edit_tensors(dir(), [](std::vector<RawTensor>& t) {
    RawTensor& s = find(t, "model.layers.1.self_attn.o_proj.scales");
    auto v = as<std::uint16_t>(s);
    v[7] = 0x7e00;  // NaN
    store(s, v);
  });
  const std::string e = load_error();
  EXPECT_NE(e.find("'model.layers.1.self_attn.o_proj.scales' holds nan at index 7"), std::string::npos) << e;
}

TEST_F(BadQuantizedCheckpoint, MissingQzeros) {
  edit_tensors(dir(), [](std::vector<RawTensor>& t) {
    t.erase(std::remove_if(t.begin(), t.end(), [](const RawTensor& r) { return r.name == "model.layers.4.mlp.down_proj.qzeros"; }),
            t.end());
  });
  const std::string e = load_error();
  EXPECT_NE(e.find("model.layers.4.mlp.down_proj.qzeros"), std::string::npos) << e;
}

TEST_F(BadQuantizedCheckpoint, TruncatedShardAndMissingShard) {
  TempDir tmp;
  ThreadPool pool(1);
  QuantizeOptions options;
  options.spec = {LowBit::kSymInt4, 32, Int4Range::kFull};
  options.max_shard_bytes = 100'000;
  const std::string sharded = tmp.file("s");
  quantize_checkpoint(WOQ_MODEL_DIR, sharded, options, pool);
  ASSERT_TRUE(fs::exists(sharded + "/model.safetensors.index.json"));
  const std::string shard = sharded + "/model-00002-of-00003.safetensors";
  ASSERT_TRUE(fs::exists(shard));
  fs::resize_file(shard, fs::file_size(shard) - 100);
  std::string e = error_of([&] { LlamaModel::load(sharded, LoadOptions{}, pool); });
  EXPECT_NE(e.find("model-00002-of-00003.safetensors"), std::string::npos) << e;
  fs::remove(shard);
  e = error_of([&] { LlamaModel::load(sharded, LoadOptions{}, pool); });
  EXPECT_NE(e.find("model-00002-of-00003.safetensors"), std::string::npos) << e;
}

// Hashable snapshot of a directory's files.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) files[e.path().filename().string()] = test::read_file(e.path().string());
  return files;
}

TEST(QuantizeWriting, RefusesExistingOutputUnlessForcedAndNeverTouchesInput) {
  TempDir tmp;
  ThreadPool pool(1);
  const auto before = snapshot(WOQ_MODEL_DIR);
  QuantizeOptions options;
  options.spec = {LowBit::kSymInt8, -1, Int4Range::kFull};
  const std::string out = tmp.file("q");
  fs::create_directory(out);
  test::write_file(out + "/keep.txt", "x");
  EXPECT_NE(error_of([&] { quantize_checkpoint(WOQ_MODEL_DIR, out, options, pool); }).find("already exists (pass --force"),
            std::string::npos);
  EXPECT_TRUE(fs::exists(out + "/keep.txt"));
  options.force = true;
  quantize_checkpoint(WOQ_MODEL_DIR, out, options, pool);
  EXPECT_FALSE(fs::exists(out + "/keep.txt"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_EQ(snapshot(WOQ_MODEL_DIR), before);
  // Already quantized input.
  const std::string e = error_of([&] { quantize_checkpoint(out, tmp.file("qq"), options, pool); });
  EXPECT_NE(e.find("already quantized (GPTQ v1 8-bit sym per channel (woq "), std::string::npos) << e;
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);
}

TEST(QuantizeWriting, RefusesOutputContainingOrInsideInput) {
  TempDir tmp;
  ThreadPool pool(1);
  const std::string inner = tmp.file("outer/inner");
  test::copy_model(WOQ_MODEL_DIR, inner);
  QuantizeOptions options;
  options.spec = {LowBit::kSymInt4, 32, Int4Range::kFull};
  options.force = true;
  std::string e = error_of([&] { quantize_checkpoint(inner, tmp.file("outer"), options, pool); });
  EXPECT_NE(e.find("is or contains the input directory"), std::string::npos) << e;
  e = error_of([&] { quantize_checkpoint(inner, inner + "/../inner", options, pool); });
  EXPECT_NE(e.find("is or contains the input directory"), std::string::npos) << e;
  e = error_of([&] { quantize_checkpoint(inner, inner + "/q", options, pool); });
  EXPECT_NE(e.find("is inside the input directory"), std::string::npos) << e;
  EXPECT_TRUE(fs::exists(inner + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(inner + "/q"));
}

TEST(QuantizeWriting, FailureLeavesNoOutputAndNoTemporaryFiles) {
  TempDir tmp;
  ThreadPool pool(1);
  const std::string in = tmp.file("in");
  test::copy_model(WOQ_MODEL_DIR, in);
  // A group of only positive weights: asymmetric zero point 0, which GPTQ v1 cannot store.
  edit_tensors(in, [](std::vector<RawTensor>& t) {
    RawTensor& w = find(t, "model.layers.3.mlp.up_proj.weight");
    auto v = as<float>(w);
    for (int i = 0; i < 32; ++i) v[static_cast<std::size_t>(i)] = 0.01f + 0.001f * static_cast<float>(i);
    store(w, v);
  });
  QuantizeOptions options;
  options.spec = {LowBit::kAsymInt4, 32, Int4Range::kFull};
  const std::string e = error_of([&] { quantize_checkpoint(in, tmp.file("out"), options, pool); });
  EXPECT_NE(e.find("model.layers.3.mlp.up_proj: row 0 group 0 has zero point 0"), std::string::npos) << e;
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);  // only "in"
  options.zeros = GptqZeros::kV2;
  quantize_checkpoint(in, tmp.file("out"), options, pool);
  EXPECT_EQ(logits_of(tmp.file("out"), options.spec, pool), logits_of(in, options.spec, pool));
}

// A quantize killed part way (SIGKILL, power loss) leaves its .OUT.tmp-PID-RANDOM directory behind. The
// next quantize to OUT removes those whose process is gone and whose lock is free, says so, and leaves
// alone those of live processes, of other outputs, and names it does not write.
TEST(QuantizeWriting, RemovesTemporaryDirectoriesOfKilledRuns) {
  const pid_t dead = fork();  // a PID that no longer runs: a child that exited and was reaped
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);
  TempDir tmp;
  ThreadPool pool(1);
  const auto partial = [&](const std::string& name) {
    fs::create_directory(tmp.file(name));
    test::write_file(tmp.file(name + "/model-00001-of-00002.safetensors"), "partial");
    return tmp.file(name);
  };
  const std::string stale = partial(fmt::format(".q.tmp-{}-0123abcd", dead));
  const std::string live = partial(fmt::format(".q.tmp-{}-0123abcd", getpid()));
  const std::string locked = partial(fmt::format(".q.tmp-{}-89abcdef", dead));  // as from another PID namespace
  const std::string old = partial(fmt::format(".q.tmp-{}-0123abcd.old", dead));
  const std::string other_output = partial(fmt::format(".r.tmp-{}-0123abcd", dead));
  const std::string not_ours = partial(fmt::format(".q.tmp-{}-0123abcd-notes", dead));
  const int lock = open(locked.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(lock, 0);
  ASSERT_EQ(flock(lock, LOCK_EX | LOCK_NB), 0);

  QuantizeOptions options;
  options.spec = {LowBit::kSymInt8, -1, Int4Range::kFull};
  std::vector<std::string> lines;
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  const std::string out = tmp.file("q");
  const TensorStore store = TensorStore::open(WOQ_MODEL_DIR);
  const ModelConfig config = read_model_config(WOQ_MODEL_DIR);
  const BlockQuantizer rtn = rtn_quantizer(store, config, options.spec, pool);
  std::vector<std::string> own;  // this run's temporary directory, seen while it runs
  quantize_checkpoint(WOQ_MODEL_DIR, out, options, pool, [&](std::int64_t layer) {
    if (layer == 0)
      for (const auto& e : fs::directory_iterator(tmp.path()))
        if (const std::string name = e.path().filename().string();
            name.starts_with(fmt::format(".q.tmp-{}-", getpid())) && e.path().string() != live) {
          own.push_back(name);
          const int fd = open(e.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
          EXPECT_NE(flock(fd, LOCK_EX | LOCK_NB), 0) << name << " is not locked while in use";
          close(fd);
        }
    return rtn(layer);
  });
  EXPECT_EQ(own.size(), 1u);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(stale));
  for (const std::string& kept : {live, locked, old, other_output, not_ours}) EXPECT_TRUE(fs::exists(kept)) << kept;
  const auto said = [&](const std::string& text) {
    return std::count_if(lines.begin(), lines.end(), [&](const std::string& l) { return l.find(text) != std::string::npos; });
  };
  EXPECT_EQ(said("removed "), 1);
  EXPECT_EQ(said(fmt::format("removed {}, left by woq quantize process {}, which is no longer running", stale, dead)), 1);
  // The .old copy was the only one of the previous output while q was missing; now q exists, it goes.
  EXPECT_EQ(said(fmt::format("kept {}: it holds the previous {}", old, out)), 1);
  lines.clear();
  options.force = true;
  quantize_checkpoint(WOQ_MODEL_DIR, out, options, pool);
  EXPECT_FALSE(fs::exists(old));
  EXPECT_EQ(said("removed "), 1);
  EXPECT_EQ(said(fmt::format("removed {}, left by woq quantize process {}", old, dead)), 1);
  // Once its lock is released, the directory of the dead PID goes too; the live PID's stays.
  close(lock);
  lines.clear();
  quantize_checkpoint(WOQ_MODEL_DIR, out, options, pool);
  EXPECT_FALSE(fs::exists(locked));
  EXPECT_EQ(said("removed "), 1);
  for (const std::string& kept : {live, other_output, not_ours}) EXPECT_TRUE(fs::exists(kept)) << kept;
}

// The real thing: a quantize SIGKILLed in its third layer leaves a partial temporary directory, which the
// next quantize to the same output removes.
TEST(QuantizeWriting, NextRunRemovesWhatASigkilledRunLeft) {
  TempDir tmp;
  const std::string out = tmp.file("q");
  QuantizeOptions options;
  options.spec = {LowBit::kSymInt4, 32, Int4Range::kFull};
  options.max_shard_bytes = 20'000;  // shards are written as layers finish
  const pid_t child = fork();
  if (child == 0) {
    ThreadPool pool(1);
    const TensorStore store = TensorStore::open(WOQ_MODEL_DIR);
    const BlockQuantizer rtn = rtn_quantizer(store, read_model_config(WOQ_MODEL_DIR), options.spec, pool);
    quantize_checkpoint(WOQ_MODEL_DIR, out, options, pool, [&](std::int64_t layer) {
      if (layer == 2) raise(SIGKILL);
      return rtn(layer);
    });
    _exit(0);
  }
  ASSERT_GT(child, 0);
  // Dead but not reaped (WNOWAIT): a zombie, as a killed process is until its parent waits; still "dead".
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PID, static_cast<id_t>(child), &info, WEXITED | WNOWAIT), 0);
  ASSERT_EQ(info.si_code, CLD_KILLED);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(tmp.path())) left.push_back(e.path().string());
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(fs::path(left[0]).filename().string().rfind(fmt::format(".q.tmp-{}-", child), 0), 0u) << left[0];
  EXPECT_FALSE(fs::is_empty(left[0]));  // the shards of the first layers

  ThreadPool pool(1);
  std::vector<std::string> lines;
  options.progress = [&](const std::string& line) { lines.push_back(line); };
  quantize_checkpoint(WOQ_MODEL_DIR, out, options, pool);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0], fmt::format("removed {}, left by woq quantize process {}, which is no longer running", left[0], child));
  EXPECT_FALSE(fs::exists(left[0]));
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  EXPECT_EQ(std::distance(fs::directory_iterator(tmp.path()), fs::directory_iterator()), 1);  // only q
  EXPECT_EQ(logits_of(out, options.spec, pool), logits_of(WOQ_MODEL_DIR, options.spec, pool));
}

// --resume's manifest (.OUT.partial/manifest.json) as read back: every field of the wrong type is an error naming
// the manifest file and the field, not nlohmann's "type_error.304 ... cannot use at() with number" (issue 29 C);
// a manifest of the previous version says so.
TEST(ResumeManifest, EveryFieldIsTypeChecked) {
  TempDir tmp;
  const fs::path out = tmp.file("q");
  const nlohmann::ordered_json fingerprint = {{"input", "x"}, {"low_bit", "sym_int4"}};
  { ResumeDir started(out, fingerprint, 2, false, false, nullptr); }  // writes an empty manifest
  const std::string manifest = tmp.file(".q.partial/manifest.json");
  const nlohmann::json good = nlohmann::json::parse(test::read_file(manifest));
  const auto resume_error = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json m = good;
    edit(m);
    test::write_file(manifest, m.dump());
    return error_of([&] { ResumeDir again(out, fingerprint, 2, true, false, nullptr); });
  };
  EXPECT_EQ(resume_error([](nlohmann::json&) {}), "");
  const std::vector<std::pair<std::function<void(nlohmann::json&)>, std::string>> cases = {
      {[](nlohmann::json& m) { m["blocks"] = {{"a", 1}}; }, "field 'blocks' must be an array"},
      {[](nlohmann::json& m) { m["blocks"] = {1}; }, "field 'blocks[0]' must be an object"},
      {[](nlohmann::json& m) { m["blocks"] = {{{"file", "block-00000.bin"}, {"fnv1a64", 7}}}; },
       "field 'blocks[0].fnv1a64' must be a string of 16 hex digits, got 7"},
      {[](nlohmann::json& m) { m["blocks"] = {{{"file", 3}, {"fnv1a64", "0123456789abcdef"}}}; },
       "field 'blocks[0].file' must be \"block-00000.bin\""},
      {[](nlohmann::json& m) { m["layers"] = "2"; }, "field 'layers' must be an integer, got \"2\""},
      {[](nlohmann::json& m) { m["version"] = 2.5; }, "field 'version' must be an integer"},
      {[](nlohmann::json& m) { m.erase("version"); }, "field 'version' is missing"},
      {[](nlohmann::json& m) { m["fingerprint"] = nlohmann::json::array(); }, "field 'fingerprint' must be an object"},
      {[](nlohmann::json& m) { m = nlohmann::json::array(); }, "not a JSON object"},
  };
  for (const auto& [edit, message] : cases) {
    const std::string e = resume_error(edit);
    EXPECT_NE(e.find(manifest), std::string::npos) << e;
    EXPECT_NE(e.find(message), std::string::npos) << e;
  }
  const std::string old = resume_error([](nlohmann::json& m) { m["version"] = 1; });
  EXPECT_NE(old.find(manifest + " was written by a woq with manifest version 1"), std::string::npos) << old;
  // A later run without --resume that finds such a manifest treats it as holding no blocks (no crash either).
  const std::string bad = resume_error([](nlohmann::json& m) { m["blocks"] = {{"a", 1}}; });
  EXPECT_NE(bad.find("no readable manifest"), std::string::npos) << bad;
  EXPECT_EQ(error_of([&] { ResumeDir fresh(out, fingerprint, 2, false, false, nullptr); }), "");
}

// A block file edited and given a matching hash in the manifest (a hash proves no accident, not a sound file): every
// header field that disagrees with the matrix's buffers or layout is refused naming the file and the matrix, and the
// matrix count is checked before anything is allocated for it.
TEST(ResumeManifest, ABlockWhoseHeaderDisagreesWithItsBuffersIsRefused) {
  TempDir tmp;
  const fs::path out = tmp.file("q");
  const nlohmann::ordered_json fingerprint = {{"input", "x"}};
  const std::vector<float> w(64 * 96, 0.25f);
  std::vector<QuantMatrix> block;
  for (std::size_t i = 0; i < kBlockLinears.size(); ++i)
    block.push_back(quantize_matrix(w.data(), 64, 96, QuantSpec{i % 2 ? LowBit::kAsymInt4 : LowBit::kSymInt8, 32}));
  { ResumeDir run(out, fingerprint, 2, false, false, nullptr); run.save_block(0, block); }
  const std::string file = tmp.file(".q.partial/block-00000.bin"), manifest = tmp.file(".q.partial/manifest.json");
  const std::string good = test::read_file(file);
  const nlohmann::json good_manifest = nlohmann::json::parse(test::read_file(manifest));
  // The first matrix's header: magic (8), count (8), type, int4_range, activations (int32), then int64 rows, cols,
  // group_size, groups_per_row, row_bytes, interleave.
  const auto resumed_with = [&](std::size_t offset, std::int64_t value, std::size_t bytes) {
    std::string edited = good;
    std::memcpy(edited.data() + offset, &value, bytes);
    test::write_file(file, edited);
    nlohmann::json m = good_manifest;
    m["blocks"][0]["fnv1a64"] = fnv1a64_hex(edited.data(), edited.size());
    test::write_file(manifest, m.dump());
    return error_of([&] { ResumeDir again(out, fingerprint, 2, true, false, nullptr); });
  };
  EXPECT_EQ(resumed_with(0, 'W', 1), "");
  const std::vector<std::tuple<std::size_t, std::int64_t, std::size_t>> edits = {
      {8, 1LL << 40, 8},            // the matrix count
      {16, 99, 4},                  // the format
      {16, 1, 4},                   // another format's layout for sym_int8's buffers
      {20, 7, 4},                   // int4_range
      {24, 9, 4},                   // activations
      {28, 0, 8},                   // rows
      {28, 65, 8},                  // rows beyond the buffers
      {28, 1LL << 40, 8},           // rows far beyond
      {36, -3, 8},                  // cols
      {36, 97, 8},                  // cols
      {44, 0, 8},                   // group_size
      {44, 1LL << 30, 8},           // group_size
      {52, 0, 8},                   // groups_per_row
      {60, 7, 8},                   // row_bytes
      {68, 8, 8},                   // interleave
  };
  for (const auto& [offset, value, bytes] : edits) {
    const std::string e = resumed_with(offset, value, bytes);
    EXPECT_NE(e.find(file), std::string::npos) << offset << ": " << e;
    EXPECT_TRUE(e.find("matrix 0 is damaged") != std::string::npos || e.find("matrices, not 7") != std::string::npos)
        << offset << ": " << e;
  }
}

// The input fingerprint of --resume: an edit that keeps the size and sets the mtime back (cp -p, rsync -t,
// utimensat) still changes it, through the ctime; times are nanoseconds since the Unix epoch (issue 29 F).
TEST(ResumeManifest, FingerprintSeesSameSizeEditsWithTheMtimeRestored) {
  TempDir tmp;
  const std::string file = tmp.file("model.safetensors");
  test::write_file(file, "weights A");
  const nlohmann::ordered_json before = file_fingerprint(file);
  struct stat st {};
  ASSERT_EQ(stat(file.c_str(), &st), 0);
  EXPECT_EQ(before["mtime_ns"].get<std::int64_t>(), st.st_mtim.tv_sec * 1000000000ll + st.st_mtim.tv_nsec);
  EXPECT_GT(before["mtime_ns"].get<std::int64_t>(), 1500000000ll * 1000000000ll);  // after 2017: the Unix epoch
  EXPECT_EQ(before["bytes"], 9);
  usleep(20000);  // past the file system's timestamp granularity
  test::write_file(file, "weights B");
  const timespec times[2] = {st.st_atim, st.st_mtim};
  ASSERT_EQ(utimensat(AT_FDCWD, file.c_str(), times, 0), 0);
  const nlohmann::ordered_json after = file_fingerprint(file);
  EXPECT_EQ(after["bytes"], before["bytes"]);
  EXPECT_EQ(after["mtime_ns"], before["mtime_ns"]);
  EXPECT_NE(after, before);
  EXPECT_NE(after["ctime_ns"], before["ctime_ns"]);
  const nlohmann::ordered_json input = input_fingerprint(tmp.path());
  ASSERT_EQ(input["files"].size(), 1u);
  EXPECT_EQ(input["files"][0], file_fingerprint(file));
}

}  // namespace
}  // namespace woq
