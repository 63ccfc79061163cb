#include "model/random_checkpoint.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numbers>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "arch/architecture.h"
#include "io/hf_config_writer.h"
#include "io/json_file.h"
#include "io/safetensors_writer.h"

namespace woq {

extern const unsigned char kStoriesTokenizerModel[];
extern const std::size_t kStoriesTokenizerModel_size;

namespace {

ModelPreset preset(std::string name, std::string arch, std::string tokenizer,
                   std::int64_t hidden, std::int64_t inter, std::int64_t layers, std::int64_t heads,
                   std::int64_t kv_heads, std::int64_t vocab, std::int64_t max_pos, double theta, double eps,
                   std::int64_t bos, std::vector<std::int64_t> eos) {
  ModelPreset p;
  p.name = std::move(name);
  p.tokenizer = std::move(tokenizer);
  ModelConfig& c = p.config;
  c.architecture = std::move(arch);
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = hidden / heads;
  c.vocab_size = vocab;
  c.max_position_embeddings = max_pos;
  c.rope_theta = theta;
  c.rms_norm_eps = eps;
  c.bos_token_id = bos;
  c.eos_token_ids = std::move(eos);
  const ArchitectureSpec* spec = find_architecture(c.architecture);
  c.attention_bias = spec->qkv_bias;
  c.qk_norm = spec->qk_norm;
  return p;
}

// splitmix64: seeds independent streams from (seed, tensor, chunk).
std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// xoshiro256** (Blackman & Vigna), a small fast generator.
struct Xoshiro {
  std::uint64_t s[4];
  explicit Xoshiro(std::uint64_t seed) {
    for (auto& v : s) v = seed = splitmix(seed);
  }
  std::uint64_t next() {
    const std::uint64_t r = std::rotl(s[1] * 5, 7) * 9;
    const std::uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = std::rotl(s[3], 45);
    return r;
  }
  // Uniform in (0, 1].
  double uniform() { return (static_cast<double>(next() >> 11) + 1.0) * 0x1.0p-53; }
};

// Values mean + std * N(0, 1).
struct Fill {
  double mean = 0, std = 0;
};

void fill_tensor(std::span<std::uint8_t> out, DType dtype, Fill how, std::uint64_t seed, ThreadPool& pool) {
  const std::size_t esize = dtype_size(dtype);
  const auto n = static_cast<std::int64_t>(out.size() / esize);
  constexpr std::int64_t kChunk = 1 << 16;  // values per independent random stream
  auto store = [&](std::int64_t i, double x) {
    const auto v = static_cast<float>(how.mean + how.std * x);
    if (dtype == DType::kF32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      const std::uint16_t h = dtype == DType::kF16 ? fp32_to_fp16(v) : fp32_to_bf16(v);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  };
  pool.parallel_for((n + kChunk - 1) / kChunk, [&](std::int64_t c0, std::int64_t c1) {
    for (std::int64_t c = c0; c < c1; ++c) {
      Xoshiro rng(splitmix(seed ^ splitmix(static_cast<std::uint64_t>(c))));
      const std::int64_t end = std::min(n, (c + 1) * kChunk);
      for (std::int64_t i = c * kChunk; i < end; i += 2) {
        if (how.std == 0) {
          store(i, 0);
          if (i + 1 < end) store(i + 1, 0);
          continue;
        }
        // Box-Muller: two N(0, 1) values from two uniforms.
        const double r = std::sqrt(-2.0 * std::log(rng.uniform()));
        const double theta = 2.0 * std::numbers::pi * rng.uniform();
        store(i, r * std::cos(theta));
        if (i + 1 < end) store(i + 1, r * std::sin(theta));
      }
    }
  });
}

nlohmann::ordered_json hf_random_config_json(const ModelConfig& c, DType dtype) {
  nlohmann::ordered_json j =
      hf_config_json(c, dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16");
  j["initializer_range"] = 0.02;
  j["woq_random_weights"] = true;
  return j;
}

nlohmann::ordered_json llama_tokenizer_config() {
  return {{"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", true}, {"add_eos_token", false},
          {"bos_token", "<s>"},                  {"eos_token", "</s>"},   {"unk_token", "<unk>"}};
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = [] {
    const std::string llama = "LlamaForCausalLM", mistral = "MistralForCausalLM", qwen2 = "Qwen2ForCausalLM",
                      qwen3 = "Qwen3ForCausalLM", phi3 = "Phi3ForCausalLM";
    std::vector<ModelPreset> v;
    v.push_back(preset("llama-2-7b", llama, "llama2", 4096, 11008, 32, 32, 32, 32000, 4096, 1e4, 1e-5, 1, {2}));
    v.back().chat_template = "llama2_chat_template.jinja";
    v.push_back(preset("llama-3-8b", llama, "llama3", 4096, 14336, 32, 32, 8, 128256, 8192, 5e5, 1e-5, 128000,
                       {128001, 128009}));
    v.push_back(preset("mistral-7b", mistral, "llama2", 4096, 14336, 32, 32, 8, 32000, 32768, 1e4, 1e-5, 1, {2}));
    v.back().config.sliding_window = 4096;
    v.back().chat_template = "mistral_v0.1_chat_template.jinja";
    v.push_back(preset("qwen2-7b", qwen2, "qwen3", 3584, 18944, 28, 28, 4, 152064, 32768, 1e6, 1e-6, 151643,
                       {151645, 151643}));
    v.push_back(preset("qwen3-8b", qwen3, "qwen3", 4096, 12288, 36, 32, 8, 151936, 40960, 1e6, 1e-6, 151643,
                       {151645, 151643}));
    v.push_back(preset("tiny", llama, "stories", 128, 344, 2, 4, 2, 512, 1024, 1e4, 1e-5, 1, {2}));
    // Blocks of TinyLlama's widths (hidden 1024 here, 25 MB f16 each) with the bundled tokenizer: memory tests.
    v.push_back(preset("small", llama, "stories", 1024, 2816, 8, 16, 4, 512, 2048, 1e4, 1e-5, 1, {2}));
    // Small models whose every architecture feature is on, for the reference tests.
    v.push_back(preset("tiny-llama3", llama, "llama3", 64, 160, 2, 4, 2, 128256, 256, 5e5, 1e-5, 128000,
                       {128001, 128009}));
    v.back().config.rope_scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 64, {}};
    v.back().config.tie_word_embeddings = true;
    v.back().config.attention_bias = v.back().config.o_bias = true;  // LlamaConfig attention_bias: q/k/v/o
    v.push_back(preset("tiny-mistral", mistral, "llama2", 64, 160, 2, 4, 2, 32000, 256, 1e4, 1e-5, 1, {2}));
    v.back().config.sliding_window = 16;
    v.back().chat_template = "mistral_v0.1_chat_template.jinja";
    v.push_back(preset("tiny-qwen2", qwen2, "qwen3", 64, 160, 2, 4, 2, 151936, 256, 1e6, 1e-6, 151643,
                       {151645, 151643}));
    v.back().config.rope_scaling = {RopeScaling::Type::kLinear, 4.0, 1.0, 4.0, 8192, {}};
    v.back().config.sliding_window = 12;
    v.back().config.sliding_layers = {false, true};  // from layer 1 (max_window_layers 1)
    v.push_back(preset("tiny-qwen3", qwen3, "qwen3", 64, 160, 2, 4, 2, 151936, 256, 1e6, 1e-6, 151643,
                       {151645, 151643}));
    v.back().config.head_dim = 32;
    v.back().config.tie_word_embeddings = true;
    // Phi-3-mini-4k's block (fused qkv_proj and gate_up_proj, a sliding window on every layer) with GQA (as
    // Phi-3-medium) and the Llama 2 tokenizer Phi-3 extends.
    v.push_back(preset("tiny-phi3", phi3, "llama2", 64, 160, 2, 4, 2, 32000, 256, 1e4, 1e-5, 1, {2}));
    v.back().config.sliding_window = 16;
    return v;
  }();
  return presets;
}

const ModelPreset& find_preset(const std::string& name) {
  std::string names;
  for (const auto& p : model_presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  fail("unknown preset '{}' (expected one of: {})", name, names);
}

void write_preset_tokenizer(const ModelPreset& preset, const std::string& dir, const std::string& tokenizer_root) {
  namespace fs = std::filesystem;
  const auto out = [&](const char* name) { return (fs::path(dir) / name).string(); };
  if (preset.tokenizer == "stories") {
    write_text_file(out("tokenizer.model"),
                    std::string(reinterpret_cast<const char*>(kStoriesTokenizerModel), kStoriesTokenizerModel_size));
    write_json_file(out("tokenizer_config.json"), llama_tokenizer_config());
    return;
  }
  const fs::path src = fs::path(tokenizer_root.empty() ? std::string(WOQ_ASSETS_DIR "/tokenizers") : tokenizer_root) /
                       preset.tokenizer;
  const auto in = [&](const char* name) {
    const std::string p = (src / name).string();
    std::error_code ec;
    if (!fs::exists(p, ec))
      fail("{}: not found: the {} preset takes its tokenizer from there (pass the folder holding '{}/' with "
           "--tokenizer-root)",
           p, preset.name, preset.tokenizer);
    return p;
  };
  if (preset.tokenizer == "llama2") {
    write_text_file(out("tokenizer.model"), read_text_file(in("tokenizer.model"), 64ull << 20));
    nlohmann::ordered_json config = llama_tokenizer_config();
    if (!preset.chat_template.empty()) config["chat_template"] = read_text_file(in(preset.chat_template.c_str()));
    write_json_file(out("tokenizer_config.json"), config);
    return;
  }
  std::string tokenizer = read_text_file(in("tokenizer.json"), 64ull << 20);
  if (preset.tokenizer == "llama3") {
    // Meta's current Llama 3 tokenizer.json adds <|begin_of_text|> through its post-processor.
    // (nlohmann::json, not ordered_json: the latter inserts keys in linear time, 128000 of them.)
    nlohmann::json tok = nlohmann::json::parse(tokenizer);
    const nlohmann::json bos = {{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}};
    const nlohmann::json seq = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
    tok["post_processor"] = {
        {"type", "Sequence"},
        {"processors",
         {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
          {{"type", "TemplateProcessing"},
           {"single", {bos, seq}},
           {"pair", {bos, seq, bos, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
           {"special_tokens",
            {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {128000}}, {"tokens", {"<|begin_of_text|>"}}}}}}}}}};
    tokenizer = tok.dump();
  }
  write_text_file(out("tokenizer.json"), tokenizer);
  write_text_file(out("tokenizer_config.json"), read_text_file(in("tokenizer_config.json")));
}

std::uint64_t write_random_checkpoint(const std::string& dir, const RandomCheckpointOptions& options,
                                      ThreadPool& pool) {
  namespace fs = std::filesystem;
  const ModelPreset& p = find_preset(options.preset);
  ModelConfig c = p.config;
  if (options.layers < 0) fail("the layer count must be positive, got {}", options.layers);
  if (options.layers > 0) c.num_hidden_layers = options.layers;
  if (!c.sliding_layers.empty()) c.sliding_layers.resize(static_cast<std::size_t>(c.num_hidden_layers), true);
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 && options.dtype != DType::kF32)
    fail("random checkpoints are written as F16, BF16 or F32, not {}", dtype_name(options.dtype));
  if (!(options.weight_std > 0 && options.weight_std <= 10))
    fail("the weight standard deviation must be in (0, 10], got {}", options.weight_std);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create directory: {}", dir, ec.message());
  write_preset_tokenizer(p, dir, options.tokenizer_root);  // first: a missing tokenizer fails before gigabytes are written

  std::vector<TensorSpec> specs;
  std::vector<Fill> fills;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, Fill how) {
    specs.push_back({std::move(name), options.dtype, std::move(shape)});
    fills.push_back(how);
  };
  const Fill weight{0, options.weight_std}, ones{1, 0}, bias{0, 0.5}, head_norm{1, 0.3};
  const std::int64_t h = c.hidden_size;
  auto matrix = [&](std::string name, Dim rows, Dim cols) {
    add(std::move(name), {c.size(rows), c.size(cols)}, weight);
  };
  matrix(std::string(kEmbedTokens.hf), kEmbedTokens.rows, kEmbedTokens.cols);
  const bool fused_projections = find_architecture(c.architecture)->fused_projections;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    auto linear = [&](LinearRole role) {
      matrix(linear_tensor(l, role), linear_spec(role).rows, linear_spec(role).cols);
    };
    auto vector = [&](std::string name, Dim size, Fill how) { add(std::move(name), {c.size(size)}, how); };
    auto biases = [&](std::initializer_list<LinearRole> roles) {
      for (const LinearRole role : roles)
        if (c.has_bias(linear_spec(role).bias))
          vector(linear_tensor(l, role, "bias"), linear_spec(role).rows, bias);
    };
    vector(layer_tensor(l, kAttnNorm.hf), kAttnNorm.rows, ones);
    auto fused = [&](const FusedSpec& f) { add(layer_tensor(l, f.module) + ".weight", {c.rows(f), h}, weight); };
    if (fused_projections)
      fused(kFusedProjections[0]);  // qkv_proj
    else
      for (const LinearRole role : {LinearRole::kQ, LinearRole::kK, LinearRole::kV}) linear(role);
    biases({LinearRole::kQ, LinearRole::kK, LinearRole::kV});
    if (c.qk_norm) {
      vector(layer_tensor(l, kQNorm.hf), kQNorm.rows, head_norm);
      vector(layer_tensor(l, kKNorm.hf), kKNorm.rows, head_norm);
    }
    linear(LinearRole::kO);
    biases({LinearRole::kO});
    vector(layer_tensor(l, kMlpNorm.hf), kMlpNorm.rows, ones);
    if (fused_projections)
      fused(kFusedProjections[1]);  // gate_up_proj
    else
      for (const LinearRole role : {LinearRole::kGate, LinearRole::kUp}) linear(role);
    linear(LinearRole::kDown);
  }
  add(std::string(kFinalNorm.hf), {c.size(kFinalNorm.rows)}, ones);
  if (!c.tie_word_embeddings) matrix(std::string(kLmHead.hf), kLmHead.rows, kLmHead.cols);

  write_checkpoint_tensors(dir, specs, [&](std::size_t i, std::span<std::uint8_t> out) {
    fill_tensor(out, specs[i].dtype, fills[i], splitmix(options.seed ^ splitmix(i + 1)), pool);
    if (options.progress) options.progress(static_cast<std::int64_t>(i) + 1, static_cast<std::int64_t>(specs.size()));
  }, options.max_shard_bytes);

  write_json_file((fs::path(dir) / "config.json").string(), hf_random_config_json(c, options.dtype));
  write_json_file((fs::path(dir) / "generation_config.json").string(),
                  hf_generation_config_json(c));
  std::uint64_t total = 0;
  for (const auto& s : specs) total += s.bytes();
  return total;
}

}  // namespace woq
