#include "io/hf_config_writer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "core/error.h"
#include "arch/architecture.h"

namespace woq {

namespace {

// A value a GGUF stored as float32 (1e-5 read back as 9.99999974e-06) written as the shortest decimal
// that float32 reads the same, as config.json files have it; other values unchanged.
double shortest(double x) {
  const auto f = static_cast<float>(x);
  return static_cast<double>(f) == x ? std::stod(fmt::format("{}", f)) : x;
}

nlohmann::ordered_json rope_scaling_json(const RopeScaling& rs) {
  switch (rs.type) {
    case RopeScaling::Type::kNone: return nullptr;
    case RopeScaling::Type::kLinear: return {{"rope_type", "linear"}, {"factor", shortest(rs.factor)}};
    case RopeScaling::Type::kLlama3:
      return {{"rope_type", "llama3"},
              {"factor", shortest(rs.factor)},
              {"low_freq_factor", shortest(rs.low_freq_factor)},
              {"high_freq_factor", shortest(rs.high_freq_factor)},
              {"original_max_position_embeddings", rs.original_max_position_embeddings}};
    case RopeScaling::Type::kFactors: break;
  }
  fail("internal: per-frequency RoPE factors reach rope_scaling_json");
}

// The rope_scaling whose factors are a GGUF's rope_freqs (within 1e-5, as llama.cpp's converter computes them
// in float32): none, linear, or transformers' llama3 rule with the factor, low/high frequency factors and
// original context among the values Llama 3.x and the like use. nullopt when none fits.
std::optional<RopeScaling> scaling_of_factors(const ModelConfig& c) {
  const std::vector<float>& want = c.rope_scaling.freq_factors;
  if (want.empty() || static_cast<std::int64_t>(want.size()) != c.head_dim / 2) return std::nullopt;
  const auto fits = [&](const RopeScaling& rs) {
    ModelConfig trial = c;
    trial.rope_scaling = rs;
    const std::vector<float> got = rope_freq_factors(trial);
    for (std::size_t i = 0; i < want.size(); ++i)
      if (!(std::fabs(got[i] - want[i]) <= 1e-5f * std::fabs(want[i]))) return false;
    return true;
  };
  const float top = *std::max_element(want.begin(), want.end());
  RopeScaling rs;
  rs.factor = shortest(top);
  if (!(rs.factor >= 1 && rs.factor <= 1024)) return std::nullopt;  // the factors read_model_config accepts
  if (rs.factor == 1.0 && fits(RopeScaling{})) return RopeScaling{};
  rs.type = RopeScaling::Type::kLinear;
  if (fits(rs)) return rs;
  rs.type = RopeScaling::Type::kLlama3;
  for (const double low : {1.0, 2.0, 0.5, 4.0})
    for (const double high : {4.0, 2.0, 8.0, 16.0, 32.0})
      for (int log2 = 4; log2 <= 24 && high > low; ++log2) {
        rs.low_freq_factor = low;
        rs.high_freq_factor = high;
        rs.original_max_position_embeddings = std::int64_t{1} << log2;
        if (fits(rs)) return rs;
      }
  return std::nullopt;
}

// One id, a list, or null for none.
nlohmann::ordered_json token_id_json(const std::vector<std::int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

nlohmann::ordered_json token_id_json(std::int64_t id) { return id < 0 ? nlohmann::ordered_json() : nlohmann::ordered_json(id); }

}  // namespace

nlohmann::ordered_json hf_config_json(const ModelConfig& c, std::string_view torch_dtype) {
  const ArchitectureSpec* found = find_architecture(c.architecture);
  if (found == nullptr) fail("config.json: architecture '{}' is not one woq writes ({})", c.architecture, supported_architectures());
  const ArchitectureSpec& spec = *found;
  nlohmann::ordered_json j;
  j["architectures"] = {c.architecture};
  j["model_type"] = spec.model_type;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["hidden_act"] = "silu";
  j["rms_norm_eps"] = shortest(c.rms_norm_eps);
  j["rope_theta"] = shortest(c.rope_theta);
  if (c.rope_scaling.type == RopeScaling::Type::kFactors) {
    const std::optional<RopeScaling> rs = scaling_of_factors(c);
    if (!rs)
      fail("its RoPE frequency factors (a GGUF's rope_freqs) follow no rope_scaling config.json can express (none, "
           "linear, llama3)");
    j["rope_scaling"] = rope_scaling_json(*rs);
  } else {
    j["rope_scaling"] = rope_scaling_json(c.rope_scaling);
  }
  // config.json has one switch for the biases: q/k/v always (Qwen2) or q/k/v/o together (attention_bias).
  const bool expressible = spec.qkv_bias ? c.attention_bias && !c.o_bias
                           : spec.attention_bias_field ? c.attention_bias == c.o_bias
                                                       : !c.attention_bias && !c.o_bias;
  if (!expressible)
    fail("its attention biases (q/k/v {}, o {}) are a combination {} config.json cannot express", c.attention_bias ? "yes" : "no",
         c.o_bias ? "yes" : "no", c.architecture);
  if (spec.attention_bias_field) j["attention_bias"] = c.o_bias;
  switch (spec.sliding_window) {
    case SlidingWindowRule::kNone: break;
    case SlidingWindowRule::kAllLayers:
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
      break;
    case SlidingWindowRule::kFromMaxWindow: {
      // The presets' windows cover layers [first, num_hidden_layers): max_window_layers = first.
      std::int64_t first = 0;
      while (first < c.num_hidden_layers && !c.window(first)) ++first;
      j["use_sliding_window"] = c.sliding_window > 0;
      j["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window) : nullptr;
      j["max_window_layers"] = first;
      break;
    }
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  j["bos_token_id"] = token_id_json(c.bos_token_id);
  j["eos_token_id"] = token_id_json(c.eos_token_ids);
  return j;
}

nlohmann::ordered_json hf_generation_config_json(const ModelConfig& c) {
  return {{"bos_token_id", token_id_json(c.bos_token_id)}, {"eos_token_id", token_id_json(c.eos_token_ids)}};
}


}  // namespace woq
