// The Llama-family architectures woq runs, one table entry each (as
// gemma.cpp's configs.cc and CTranslate2's model factory): which biases and
// norms a block has and how config.json's sliding window applies. Adding an
// architecture that differs only in these is one entry here.
#pragma once

#include <span>
#include <string_view>

namespace woq {

/// How config.json "sliding_window" limits attention (transformers' masks:
/// a query at position i sees keys j with i - j < window).
enum class SlidingWindowRule {
  kNone,           ///< ignored (LlamaConfig has no sliding window)
  kAllLayers,      ///< every layer, when sliding_window is not null (Mistral)
  kFromMaxWindow,  ///< layers >= max_window_layers, when use_sliding_window (Qwen2, Qwen3)
};

struct ArchitectureSpec {
  std::string_view architecture;  ///< config.json "architectures"[0]
  std::string_view model_type;    ///< config.json "model_type"
  /// q/k/v projections always carry biases (Qwen2); else none.
  bool qkv_bias;
  /// config.json "attention_bias" (default false) adds biases to q/k/v/o (LlamaConfig, Qwen3Config).
  bool attention_bias_field;
  /// RMSNorm over each head's head_dim of q and k, after the projection and
  /// before RoPE (Qwen3: self_attn.q_norm / k_norm, [head_dim]).
  bool qk_norm;
  SlidingWindowRule sliding_window;
  /// GGUF general.architecture llama.cpp writes for it ("llama", "qwen2", ...).
  std::string_view gguf_architecture;
  /// llama.cpp stores q/k projection rows permuted for interleaved RoPE
  /// (convert_hf_to_gguf's LlamaModel.permute); qwen2/qwen3 keep HF's order.
  bool gguf_permute_qk;
};

/// Every supported architecture.
std::span<const ArchitectureSpec> architectures();
/// The entry for config.json's "architectures"[0], or nullptr.
const ArchitectureSpec* find_architecture(std::string_view architecture);
/// The entry a GGUF general.architecture reads as, or nullptr.
const ArchitectureSpec* find_gguf_architecture(std::string_view gguf_architecture);
/// "llama, qwen2, qwen3" for error messages.
std::string_view supported_gguf_architectures();
/// "LlamaForCausalLM, MistralForCausalLM, ..." for error messages.
std::string_view supported_architectures();

}  // namespace woq
