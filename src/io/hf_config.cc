#include "io/hf_config.h"

#include <cmath>
#include <filesystem>
#include <numbers>

#include "core/error.h"
#include "arch/architecture.h"
#include "io/gguf_model.h"
#include "io/json_file.h"

namespace woq {

namespace {

using namespace config_limits;

// Field must be an integer in [1, max].
std::int64_t positive(const JsonFields& f, const std::string& key, std::int64_t max = kMaxDim) {
  const std::int64_t v = f.integer(key);
  if (v <= 0) f.field_error(key, fmt::format("must be positive, got {}", v));
  if (v > max) f.field_error(key, fmt::format("is {}, more than the {} woq accepts", v, max));
  return v;
}

// `v`, element `at` ("" or "[i] ") of field `key`, as a token id in [0, vocab).
std::int64_t vocab_id(const JsonFields& f, const std::string& key, const std::string& at, const nlohmann::json& v,
                      std::int64_t vocab) {
  if (!v.is_number_integer())
    f.field_error(key, fmt::format("{}must be an integer token id, got {}", at, describe_json(v)));
  const bool inside = v.is_number_unsigned() ? v.get<std::uint64_t>() < static_cast<std::uint64_t>(vocab)
                                             : v.get<std::int64_t>() >= 0 && v.get<std::int64_t>() < vocab;
  if (!inside)
    f.field_error(key, fmt::format("{}is {}, outside the vocabulary [0, {}) (config.json vocab_size)", at,
                                   describe_json(v), vocab));
  return v.get<std::int64_t>();
}

// Field `key` (bos_token_id) as one token id; -1 when absent or null.
std::int64_t token_id(const JsonFields& f, const std::string& key, std::int64_t vocab) {
  return f.has(key) ? vocab_id(f, key, "", f.json().at(key), vocab) : -1;
}

// Field `key` (eos_token_id) as a token id or a non-empty list of them, as
// transformers allows; empty when absent or null.
std::vector<std::int64_t> token_ids(const JsonFields& f, const std::string& key, std::int64_t vocab) {
  if (!f.has(key)) return {};
  const auto& v = f.json().at(key);
  if (v.is_number_integer()) return {vocab_id(f, key, "", v, vocab)};
  if (!v.is_array() || v.empty())
    f.field_error(key,
                  fmt::format("must be an integer token id or a non-empty list of them, got {}", describe_json(v)));
  if (v.size() > kMaxStopIds)
    f.field_error(key, fmt::format("lists {} token ids; woq accepts at most {}", v.size(), kMaxStopIds));
  std::vector<std::int64_t> ids;
  for (std::size_t i = 0; i < v.size(); ++i) ids.push_back(vocab_id(f, key, fmt::format("[{}] ", i), v[i], vocab));
  return ids;
}

RopeScaling rope_scaling(const JsonFields& f, const std::string& key) {
  RopeScaling rs;
  if (!f.has(key)) return rs;
  if (!f.json().at(key).is_object()) f.field_error(key, fmt::format("must be an object or null, got {}", describe_json(f.json().at(key))));
  const JsonFields s(f.json().at(key), f.path() + " " + key);
  const std::string type = s.has("rope_type") ? s.string("rope_type", "") : s.string("type", "");
  // The type first: longrope / su (Phi-3-128k), yarn and dynamic have no single factor to miss.
  if (type != "linear" && type != "llama3" && type != "default" && !type.empty())
    f.field_error(key, fmt::format("has type '{}'; supported: linear, llama3 (and none)", printable(type)));
  const bool scaled = !(type == "default" || type.empty());
  rs.factor = scaled ? s.number("factor") : s.number("factor", 1.0);
  if (!(rs.factor >= 1.0 && rs.factor <= 1024.0)) f.field_error(key, "needs a factor in [1, 1024]");
  if (type == "linear") {
    rs.type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
    rs.low_freq_factor = s.number("low_freq_factor", 1.0);
    rs.high_freq_factor = s.number("high_freq_factor", 4.0);
    rs.original_max_position_embeddings = s.integer("original_max_position_embeddings");
    if (!(rs.low_freq_factor > 0) || rs.high_freq_factor <= rs.low_freq_factor || rs.high_freq_factor > 1024 ||
        rs.original_max_position_embeddings <= 0 || rs.original_max_position_embeddings > kMaxPositions)
      f.field_error(key, fmt::format("needs 0 < low_freq_factor < high_freq_factor <= 1024 and "
                                     "original_max_position_embeddings in [1, {}]", kMaxPositions));
  } else {
    rs.type = RopeScaling::Type::kNone;
  }
  return rs;
}

}  // namespace

std::vector<float> rope_freq_factors(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  if (rs.type == RopeScaling::Type::kFactors) return rs.freq_factors;
  std::vector<float> factors;
  const double old_ctx = static_cast<double>(rs.original_max_position_embeddings);
  const double low_wavelen = old_ctx / rs.low_freq_factor, high_wavelen = old_ctx / rs.high_freq_factor;
  for (std::int64_t i = 0; i < c.head_dim / 2; ++i) {
    const double freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
    const double wavelen = 2.0 * std::numbers::pi / freq;
    double f = 1.0;
    if (rs.type == RopeScaling::Type::kLinear || (rs.type == RopeScaling::Type::kLlama3 && wavelen > low_wavelen)) {
      f = rs.factor;
    } else if (rs.type == RopeScaling::Type::kLlama3 && wavelen >= high_wavelen) {
      const double smooth = (old_ctx / wavelen - rs.low_freq_factor) / (rs.high_freq_factor - rs.low_freq_factor);
      f = 1.0 / ((1.0 - smooth) / rs.factor + smooth);
    }
    factors.push_back(static_cast<float>(f));
  }
  return factors;
}

namespace {

// config.json's sliding window: which layers slide, as transformers' configs derive layer_types (or read them when
// given), under `spec`'s rule.
void read_sliding_window(const JsonFields& f, const ArchitectureSpec& spec, ModelConfig& c) {
  switch (spec.sliding_window) {
    case SlidingWindowRule::kNone: break;
    case SlidingWindowRule::kAllLayers:
      if (f.has("sliding_window")) c.sliding_window = positive(f, "sliding_window", kMaxPositions);
      c.sliding_layers.assign(static_cast<std::size_t>(c.num_hidden_layers), c.sliding_window > 0);
      break;
    case SlidingWindowRule::kFromMaxWindow:
      if (f.boolean("use_sliding_window", false)) {
        // Qwen2Config / Qwen3Config: sliding_window defaults to 4096 (null: none), max_window_layers to 28.
        const bool absent = !f.json().contains("sliding_window");
        if (absent || f.has("sliding_window"))
          c.sliding_window = absent ? 4096 : positive(f, "sliding_window", kMaxPositions);
        const std::int64_t first = f.has("max_window_layers") ? f.integer("max_window_layers") : 28;
        if (first < 0) f.field_error("max_window_layers", "must be >= 0");
        for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) c.sliding_layers.push_back(c.sliding_window > 0 && l >= first);
      } else {
        c.sliding_layers.assign(static_cast<std::size_t>(c.num_hidden_layers), false);
      }
      break;
  }
  if (spec.sliding_window != SlidingWindowRule::kNone && f.has("layer_types")) {
    const auto& types = f.json().at("layer_types");
    if (!types.is_array() || static_cast<std::int64_t>(types.size()) != c.num_hidden_layers)
      f.field_error("layer_types", fmt::format("must be a list of num_hidden_layers ({}) strings", c.num_hidden_layers));
    for (std::size_t l = 0; l < types.size(); ++l) {
      const std::string t = types[l].is_string() ? types[l].get<std::string>() : std::string();
      if (t != "full_attention" && t != "sliding_attention")
        f.field_error("layer_types", fmt::format("[{}] is {}; expected \"full_attention\" or \"sliding_attention\"", l,
                                                 describe_json(types[l])));
      if (t == "sliding_attention" && c.sliding_window == 0)
        f.field_error("layer_types", fmt::format("[{}] is sliding_attention but there is no sliding_window", l));
      c.sliding_layers[l] = t == "sliding_attention";
    }
  }
}

}  // namespace

ModelConfig read_model_config(const std::string& dir) {
  namespace fs = std::filesystem;
  if (is_gguf_path(dir)) return gguf_model_config(*shared_gguf(dir));
  const std::string path = (fs::path(dir) / "config.json").string();
  std::error_code exists_ec;
  if (!fs::exists(dir, exists_ec)) fail("{}: no such file or directory", dir);
  if (!fs::is_directory(dir, exists_ec))
    fail("{}: not a model directory (config.json, *.safetensors, tokenizer files) nor a .gguf file", dir);
  if (!fs::exists(path, exists_ec)) {
    std::string hint;
    if (fs::is_directory(dir, exists_ec))
      for (const auto& e : fs::directory_iterator(dir, exists_ec))
        if (is_gguf_path(e.path().string())) {
          hint = fmt::format("; it holds {}: pass that file as the model", e.path().string());
          break;
        }
    fail("{}: not found (is '{}' a Hugging Face model directory?){}", path, dir, hint);
  }
  const JsonFields f(read_json_file(path), path);

  ModelConfig c;
  const ArchitectureSpec* spec = nullptr;
  if (f.has("architectures")) {
    const auto& a = f.json().at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      f.field_error("architectures", "must be a non-empty list of strings");
    c.architecture = a[0].get<std::string>();
    spec = find_architecture(c.architecture);
    if (spec == nullptr)
      f.field_error("architectures", fmt::format("is '{}'; supported: {}", printable(c.architecture),
                                                 supported_architectures()));
  } else {
    // Without "architectures", model_type names it (and a bare config is a Llama).
    const std::string type = f.string("model_type", "llama");
    for (const ArchitectureSpec& a : architectures())
      if (a.model_type == type) spec = &a;
    if (spec == nullptr)
      f.field_error("model_type", fmt::format("is '{}' and there is no \"architectures\"; supported: {}",
                                              printable(type), supported_architectures()));
    c.architecture = std::string(spec->architecture);
  }
  for (const char* moe : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    if (!f.has(moe)) continue;
    const auto& v = f.json().at(moe);
    const bool dense = v.is_number_integer() && !v.is_number_float() &&
                       (v.is_number_unsigned() ? v.get<std::uint64_t>() <= 1 : (v.get<std::int64_t>() == 0 || v.get<std::int64_t>() == 1));
    if (!dense) f.field_error(moe, fmt::format("is {}: mixture-of-experts models are not supported", describe_json(v)));
  }

  c.hidden_size = positive(f, "hidden_size");
  c.intermediate_size = positive(f, "intermediate_size");
  c.num_hidden_layers = positive(f, "num_hidden_layers", kMaxLayers);
  c.num_attention_heads = positive(f, "num_attention_heads");
  c.num_key_value_heads =
      f.has("num_key_value_heads") ? positive(f, "num_key_value_heads") : c.num_attention_heads;
  c.vocab_size = positive(f, "vocab_size", kMaxVocab);
  if (f.has("max_position_embeddings"))
    c.max_position_embeddings = positive(f, "max_position_embeddings", kMaxPositions);
  read_sliding_window(f, *spec, c);
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.field_error("hidden_act", fmt::format("is '{}'; Llama-family models use silu", act));
  // Phi-3.5 / Phi-4-mini rotate part of each head (Phi3Config partial_rotary_factor); woq rotates all of it.
  if (f.has("partial_rotary_factor") && f.number("partial_rotary_factor") != 1.0)
    f.field_error("partial_rotary_factor", fmt::format("is {}; woq applies RoPE to the whole head (1.0)",
                                                       f.number("partial_rotary_factor")));

  if (!f.has("head_dim") && c.hidden_size % c.num_attention_heads != 0)
    f.field_error("num_attention_heads", fmt::format("({}) does not divide hidden_size ({}) and there is no head_dim",
                                                     c.num_attention_heads, c.hidden_size));
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.field_error("num_key_value_heads", fmt::format("({}) does not divide num_attention_heads ({})",
                                                     c.num_key_value_heads, c.num_attention_heads));
  c.head_dim = f.has("head_dim") ? positive(f, "head_dim") : c.hidden_size / c.num_attention_heads;
  if (c.head_dim % 2 != 0) f.field_error("head_dim", fmt::format("({}) must be even for RoPE", c.head_dim));

  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps <= 0.1))
    f.field_error("rms_norm_eps", fmt::format("must be in (0, 0.1], got {}", c.rms_norm_eps));
  // transformers >= 4.56 may write "rope_parameters" (rope_theta and the scaling together).
  const std::string rope_key = f.has("rope_parameters") ? "rope_parameters" : "rope_scaling";
  if (rope_key == "rope_parameters" && f.json().at(rope_key).is_object() && f.json().at(rope_key).contains("rope_theta")) {
    const JsonFields p(f.json().at(rope_key), path + " rope_parameters");
    c.rope_theta = p.number("rope_theta");
  } else {
    c.rope_theta = f.number("rope_theta", 10000.0);
  }
  if (!(c.rope_theta > 1 && c.rope_theta < 1e12))
    f.field_error("rope_theta", fmt::format("must be in (1, 1e12), got {}", c.rope_theta));
  c.rope_scaling = rope_scaling(f, rope_key);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  if (spec->qkv_bias) {
    c.attention_bias = true;
  } else if (spec->attention_bias_field) {
    c.attention_bias = c.o_bias = f.boolean("attention_bias", false);
  }
  c.qk_norm = spec->qk_norm;
  if (f.boolean("mlp_bias", false)) f.field_error("mlp_bias", "is true; MLP biases are not supported");

  c.bos_token_id = token_id(f, "bos_token_id", c.vocab_size);
  c.eos_token_ids = token_ids(f, "eos_token_id", c.vocab_size);

  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  std::error_code ec;
  if (fs::exists(gen_path, ec)) {
    const JsonFields g(read_json_file(gen_path), gen_path);
    if (g.has("bos_token_id")) c.bos_token_id = token_id(g, "bos_token_id", c.vocab_size);
    if (g.has("eos_token_id")) c.eos_token_ids = token_ids(g, "eos_token_id", c.vocab_size);
  }
  return c;
}

}  // namespace woq
