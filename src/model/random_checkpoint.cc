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
#include "io/json_file.h"
#include "io/safetensors_writer.h"

namespace woq {

extern const unsigned char kStoriesTokenizerModel[];
extern const std::size_t kStoriesTokenizerModel_size;

namespace {

ModelPreset preset(std::string name, std::string arch, std::string model_type, std::int64_t hidden,
                   std::int64_t inter, std::int64_t layers, std::int64_t heads, std::int64_t kv_heads,
                   std::int64_t vocab, std::int64_t max_pos, double theta, double eps) {
  ModelPreset p;
  p.name = std::move(name);
  p.model_type = std::move(model_type);
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
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  c.attention_bias = c.architecture == "Qwen2ForCausalLM";
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

enum class Fill { kNormal, kOnes, kZeros };

void fill_tensor(std::span<std::uint8_t> out, DType dtype, Fill how, std::uint64_t seed, ThreadPool& pool) {
  const std::size_t esize = dtype_size(dtype);
  const auto n = static_cast<std::int64_t>(out.size() / esize);
  constexpr std::int64_t kChunk = 1 << 16;  // values per independent random stream
  auto store = [&](std::int64_t i, float v) {
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
        if (how != Fill::kNormal) {
          store(i, how == Fill::kOnes ? 1.0f : 0.0f);
          if (i + 1 < end) store(i + 1, how == Fill::kOnes ? 1.0f : 0.0f);
          continue;
        }
        // Box-Muller: two N(0, 0.02) values from two uniforms.
        const double r = 0.02 * std::sqrt(-2.0 * std::log(rng.uniform()));
        const double theta = 2.0 * std::numbers::pi * rng.uniform();
        store(i, static_cast<float>(r * std::cos(theta)));
        if (i + 1 < end) store(i + 1, static_cast<float>(r * std::sin(theta)));
      }
    }
  });
}

nlohmann::ordered_json config_json(const ModelPreset& p, const ModelConfig& c, DType dtype) {
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = p.model_type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["rope_scaling"] = nullptr;
  j["attention_bias"] = c.attention_bias;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = dtype == DType::kF32 ? "float32" : dtype == DType::kF16 ? "float16" : "bfloat16";
  j["bos_token_id"] = c.bos_token_id;
  j["eos_token_id"] = c.eos_token_ids[0];
  j["initializer_range"] = 0.02;
  j["woq_random_weights"] = true;
  return j;
}

}  // namespace

const std::vector<ModelPreset>& model_presets() {
  static const std::vector<ModelPreset> presets = {
      preset("llama-2-7b", "LlamaForCausalLM", "llama", 4096, 11008, 32, 32, 32, 32000, 4096, 1e4, 1e-5),
      preset("llama-3-8b", "LlamaForCausalLM", "llama", 4096, 14336, 32, 32, 8, 128256, 8192, 5e5, 1e-5),
      preset("mistral-7b", "MistralForCausalLM", "mistral", 4096, 14336, 32, 32, 8, 32000, 32768, 1e6, 1e-5),
      preset("qwen2-7b", "Qwen2ForCausalLM", "qwen2", 3584, 18944, 28, 28, 4, 152064, 32768, 1e6, 1e-6),
      preset("tiny", "LlamaForCausalLM", "llama", 128, 344, 2, 4, 2, 512, 1024, 1e4, 1e-5),
  };
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

std::uint64_t write_random_checkpoint(const std::string& dir, const RandomCheckpointOptions& options,
                                      ThreadPool& pool) {
  namespace fs = std::filesystem;
  const ModelPreset& p = find_preset(options.preset);
  ModelConfig c = p.config;
  if (options.layers < 0) fail("the layer count must be positive, got {}", options.layers);
  if (options.layers > 0) c.num_hidden_layers = options.layers;
  if (options.dtype != DType::kF16 && options.dtype != DType::kBF16 && options.dtype != DType::kF32)
    fail("random checkpoints are written as F16, BF16 or F32, not {}", dtype_name(options.dtype));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("{}: cannot create directory: {}", dir, ec.message());

  std::vector<TensorSpec> specs;
  std::vector<Fill> fills;
  auto add = [&](std::string name, std::vector<std::int64_t> shape, Fill how, DType dtype) {
    specs.push_back({std::move(name), dtype, std::move(shape)});
    fills.push_back(how);
  };
  const DType dt = options.dtype;
  const std::int64_t h = c.hidden_size;
  add("model.embed_tokens.weight", {c.vocab_size, h}, Fill::kNormal, dt);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string pre = fmt::format("model.layers.{}.", l);
    add(pre + "input_layernorm.weight", {h}, Fill::kOnes, dt);
    add(pre + "self_attn.q_proj.weight", {c.q_dim(), h}, Fill::kNormal, dt);
    add(pre + "self_attn.k_proj.weight", {c.kv_dim(), h}, Fill::kNormal, dt);
    add(pre + "self_attn.v_proj.weight", {c.kv_dim(), h}, Fill::kNormal, dt);
    if (c.attention_bias) {
      add(pre + "self_attn.q_proj.bias", {c.q_dim()}, Fill::kZeros, dt);
      add(pre + "self_attn.k_proj.bias", {c.kv_dim()}, Fill::kZeros, dt);
      add(pre + "self_attn.v_proj.bias", {c.kv_dim()}, Fill::kZeros, dt);
    }
    add(pre + "self_attn.o_proj.weight", {h, c.q_dim()}, Fill::kNormal, dt);
    add(pre + "post_attention_layernorm.weight", {h}, Fill::kOnes, dt);
    add(pre + "mlp.gate_proj.weight", {c.intermediate_size, h}, Fill::kNormal, dt);
    add(pre + "mlp.up_proj.weight", {c.intermediate_size, h}, Fill::kNormal, dt);
    add(pre + "mlp.down_proj.weight", {h, c.intermediate_size}, Fill::kNormal, dt);
  }
  add("model.norm.weight", {h}, Fill::kOnes, dt);
  add("lm_head.weight", {c.vocab_size, h}, Fill::kNormal, dt);

  write_checkpoint_tensors(dir, specs, [&](std::size_t i, std::span<std::uint8_t> out) {
    fill_tensor(out, specs[i].dtype, fills[i], splitmix(options.seed ^ splitmix(i + 1)), pool);
  }, options.max_shard_bytes);

  write_json_file((fs::path(dir) / "config.json").string(), config_json(p, c, dt));
  write_json_file((fs::path(dir) / "generation_config.json").string(),
                  {{"bos_token_id", c.bos_token_id}, {"eos_token_id", c.eos_token_ids[0]}});
  write_json_file((fs::path(dir) / "tokenizer_config.json").string(),
                  {{"tokenizer_class", "LlamaTokenizer"}, {"add_bos_token", true}, {"add_eos_token", false},
                   {"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"}});
  const std::string tok = (fs::path(dir) / "tokenizer.model").string();
  {
    std::ofstream out(tok + ".tmp", std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(kStoriesTokenizerModel),
              static_cast<std::streamsize>(kStoriesTokenizerModel_size));
    if (!out.flush()) fail("{}: cannot write", tok);
  }
  fs::rename(tok + ".tmp", tok);
  std::uint64_t total = 0;
  for (const auto& s : specs) total += s.bytes();
  return total;
}

}  // namespace woq
