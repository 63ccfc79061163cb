// The Hugging Face config.json / generation_config.json of a Llama-family
// checkpoint (the architectures of arch/architecture.h: Llama 2/3, Mistral,
// Qwen2, Qwen3), with the defaults of transformers' config classes for
// absent fields.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "arch/architecture.h"
#include "core/numerics.h"

namespace woq {

/// RoPE frequency scaling (config.json "rope_scaling").
struct RopeScaling {
  /// kFactors: inv_freq[i] /= freq_factors[i], llama.cpp's form of llama3
  /// scaling (a GGUF's rope_freqs.weight tensor).
  enum class Type { kNone, kLinear, kLlama3, kFactors };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                     ///< llama3 only
  double high_freq_factor = 4.0;                    ///< llama3 only
  std::int64_t original_max_position_embeddings = 8192;  ///< llama3 only
  std::vector<float> freq_factors;                  ///< kFactors only: (head_dim / 2)
};

/// Architecture hyper-parameters and special token ids.
struct ModelConfig {
  std::string architecture;  ///< e.g. "LlamaForCausalLM"
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;  ///< GQA: < num_attention_heads
  std::int64_t head_dim = 0;             ///< hidden_size / num_attention_heads unless given
  std::int64_t vocab_size = 0;
  std::int64_t max_position_embeddings = 2048;  ///< tokens
  /// Sliding-window attention: a query at position i sees keys j with
  /// i - j < sliding_window (0 = none), in the layers marked in sliding_layers.
  std::int64_t sliding_window = 0;
  std::vector<bool> sliding_layers;  ///< (num_hidden_layers); empty = every layer
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;  ///< lm_head shares model.embed_tokens.weight
  bool attention_bias = false;       ///< q/k/v projections have biases (Qwen2; attention_bias of Llama/Qwen3)
  bool o_bias = false;               ///< o_proj has a bias (attention_bias of Llama/Qwen3)
  bool qk_norm = false;              ///< RMSNorm of each q/k head before RoPE (Qwen3)
  std::int64_t bos_token_id = -1;    ///< -1 = none
  std::vector<std::int64_t> eos_token_ids;  ///< generation stops on any of these
  /// How the operations outside the matrix products round: kGgml for a GGUF file (llama.cpp's logits).
  Numerics numerics = Numerics::kWoq;
  /// What reading the config tolerated (a GGUF's special token id outside the vocabulary).
  std::vector<std::string> warnings;

  std::int64_t q_dim() const { return num_attention_heads * head_dim; }
  /// Longest sequence woq runs: max_position_embeddings (a sliding window
  /// limits what a query sees, not the context).
  std::int64_t context_limit() const { return max_position_embeddings; }
  /// The attention window of `layer` (0 = the whole causal prefix).
  std::int64_t window(std::int64_t layer) const {
    const bool slides = sliding_layers.empty() || sliding_layers[static_cast<std::size_t>(layer)];
    return sliding_window > 0 && slides ? sliding_window : 0;
  }
  std::int64_t kv_dim() const { return num_key_value_heads * head_dim; }
  /// The size a block tensor's dimension `d` has under this config.
  std::int64_t size(Dim d) const {
    switch (d) {
      case Dim::kHidden: return hidden_size;
      case Dim::kIntermediate: return intermediate_size;
      case Dim::kQ: return q_dim();
      case Dim::kKv: return kv_dim();
      case Dim::kHeadDim: return head_dim;
      case Dim::kVocab: return vocab_size;
    }
    return 0;
  }
  /// Rows of fused projection `f`: its parts' rows added (q_dim + 2 kv_dim for qkv_proj).
  std::int64_t rows(const FusedSpec& f) const {
    std::int64_t n = 0;
    for (std::size_t i = 0; i < f.part_count; ++i) n += size(linear_spec(f.parts[i]).rows);
    return n;
  }
  /// Whether block linears with bias rule `b` carry a bias under this config.
  bool has_bias(LinearBias b) const {
    return (b == LinearBias::kQkv && attention_bias) || (b == LinearBias::kOutput && o_bias);
  }
};

/// The divisor of each RoPE inverse frequency theta^(-2i/d) (i < head_dim / 2)
/// that c.rope_scaling applies: all 1 for none, the factor for linear,
/// transformers' llama3 rule (_compute_llama3_parameters: wavelengths beyond
/// original / low_freq_factor divided by factor, below original /
/// high_freq_factor kept, a smooth blend between), the GGUF's own factors for
/// kFactors. In float32, as llama.cpp stores llama3 scaling (rope_freqs), so
/// that a model and its GGUF file compute the same frequencies.
std::vector<float> rope_freq_factors(const ModelConfig& c);

/// Upper bounds far beyond any real model, so that a lying config fails
/// when it is read instead of in a huge allocation.
namespace config_limits {
inline constexpr std::int64_t kMaxDim = 1 << 20;  ///< hidden, intermediate, head_dim, heads
inline constexpr std::int64_t kMaxVocab = 1 << 24;
inline constexpr std::int64_t kMaxLayers = 4096;
inline constexpr std::int64_t kMaxPositions = 1 << 24;
inline constexpr std::size_t kMaxStopIds = 1024;  ///< eos_token_id list
}  // namespace config_limits

/// Reads DIR/config.json and, if present, DIR/generation_config.json (whose
/// bos/eos ids take precedence; bos_token_id is one id, eos_token_id one or
/// a non-empty list, each in [0, vocab_size)).
/// Throws woq::Error naming the file and field for malformed JSON, missing or
/// mistyped fields, sizes that are not positive or beyond woq's limits (2^20
/// for dimensions and heads, 2^24 for vocab_size and positions, 4096 layers),
/// rms_norm_eps outside (0, 0.1] or rope_theta outside (1, 1e12), token ids
/// outside the vocabulary, an unsupported architecture (or mixture-of-experts
/// fields), an unsupported rope_scaling type (yarn, dynamic, longrope, ...),
/// and inconsistent shapes (num_attention_heads not dividing hidden_size when
/// head_dim is absent, num_key_value_heads not dividing num_attention_heads,
/// odd head_dim). An explicit head_dim need not be hidden_size /
/// num_attention_heads (Qwen3).
/// A path ending in .gguf is read by gguf_model_config (io/gguf_model.h).
ModelConfig read_model_config(const std::string& dir);

}  // namespace woq
