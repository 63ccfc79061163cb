// The Llama-family architectures woq runs, one table entry each (as
// gemma.cpp's configs.cc and CTranslate2's model factory): which biases and
// norms a block has and how config.json's sliding window applies; and the
// tensors of a decoder block (each linear's role, Hugging Face and GGUF names,
// shape and shared input; the norms), which every loader, writer and
// quantizer reads instead of spelling names. Adding an architecture that
// differs only in these is one entry here. The model's semantics, read by
// io (names, config rules) and model (shapes, roles); depends on nothing
// else of woq.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace woq {

/// A size of a block tensor, from config.json (ModelConfig::size gives it).
enum class Dim {
  kHidden,        ///< hidden_size
  kIntermediate,  ///< intermediate_size
  kQ,             ///< num_attention_heads * head_dim
  kKv,            ///< num_key_value_heads * head_dim
  kHeadDim,       ///< head_dim
  kVocab,         ///< vocab_size
};
/// The config.json fields `d` is made of, for error messages ("num_attention_heads * head_dim").
std::string_view dim_name(Dim d);

/// The linear layers of a decoder block, in forward order (kBlockLinears' order).
enum class LinearRole { kQ, kK, kV, kO, kGate, kUp, kDown };

/// The activation a block linear multiplies. Linears with the same input share
/// one quantization of it and one GPTQ Hessian (q/k/v; gate/up).
enum class LinearInput {
  kAttnNorm,   ///< the attention norm's output [T, hidden]: q, k, v
  kAttention,  ///< attention's output [T, q_dim]: o
  kMlpNorm,    ///< the MLP norm's output [T, hidden]: gate, up
  kGated,      ///< silu(gate) * up [T, intermediate]: down
};

/// Which config flag gives a block linear a bias ("{module}.bias", [rows]).
enum class LinearBias {
  kNone,     ///< never (the MLP)
  kQkv,      ///< ModelConfig::attention_bias (q/k/v: Qwen2 always, Llama/Qwen3 config attention_bias)
  kOutput,   ///< ModelConfig::o_bias (o: Llama/Qwen3 config attention_bias)
};

/// One linear layer of a decoder block: weight [rows, cols] = [out, in].
struct LinearSpec {
  LinearRole role;
  std::string_view module;  ///< Hugging Face module under "model.layers.N.": "self_attn.q_proj"
  std::string_view gguf;    ///< llama.cpp tensor under "blk.N." (LLM_TENSOR_NAMES), without ".weight": "attn_q"
  std::string_view label;   ///< the role as the load summary names it: "q"
  Dim rows, cols;
  LinearInput input;
  LinearBias bias;
};

/// The seven linears of a Llama block (transformers' LlamaDecoderLayer), in LinearRole order.
inline constexpr std::array<LinearSpec, 7> kBlockLinears = {{
    // role, module, gguf, label, rows, cols, input, bias
    {LinearRole::kQ, "self_attn.q_proj", "attn_q", "q",  //
     Dim::kQ, Dim::kHidden, LinearInput::kAttnNorm, LinearBias::kQkv},
    {LinearRole::kK, "self_attn.k_proj", "attn_k", "k",  //
     Dim::kKv, Dim::kHidden, LinearInput::kAttnNorm, LinearBias::kQkv},
    {LinearRole::kV, "self_attn.v_proj", "attn_v", "v",  //
     Dim::kKv, Dim::kHidden, LinearInput::kAttnNorm, LinearBias::kQkv},
    {LinearRole::kO, "self_attn.o_proj", "attn_output", "o",  //
     Dim::kHidden, Dim::kQ, LinearInput::kAttention, LinearBias::kOutput},
    {LinearRole::kGate, "mlp.gate_proj", "ffn_gate", "gate",  //
     Dim::kIntermediate, Dim::kHidden, LinearInput::kMlpNorm, LinearBias::kNone},
    {LinearRole::kUp, "mlp.up_proj", "ffn_up", "up",  //
     Dim::kIntermediate, Dim::kHidden, LinearInput::kMlpNorm, LinearBias::kNone},
    {LinearRole::kDown, "mlp.down_proj", "ffn_down", "down",  //
     Dim::kHidden, Dim::kIntermediate, LinearInput::kGated, LinearBias::kNone},
}};
/// The spec of `role`.
constexpr const LinearSpec& linear_spec(LinearRole role) { return kBlockLinears[static_cast<std::size_t>(role)]; }

/// A tensor outside the block linears: its Hugging Face and GGUF names (per-layer
/// ones under "model.layers.N." / "blk.N.") and its [size] or [rows, cols].
struct NamedTensor {
  std::string_view hf, gguf;
  Dim rows, cols;  ///< cols == rows for a vector
};
inline constexpr NamedTensor kEmbedTokens{"model.embed_tokens.weight", "token_embd.weight", Dim::kVocab, Dim::kHidden};
inline constexpr NamedTensor kFinalNorm{"model.norm.weight", "output_norm.weight", Dim::kHidden, Dim::kHidden};
inline constexpr NamedTensor kLmHead{"lm_head.weight", "output.weight", Dim::kVocab, Dim::kHidden};
/// lm_head's packed integers in a GPTQ checkpoint that quantizes it (GPTQModel's `lm_head: true`).
inline constexpr std::string_view kLmHeadQweight = "lm_head.qweight";
inline constexpr NamedTensor kAttnNorm{"input_layernorm.weight", "attn_norm.weight", Dim::kHidden, Dim::kHidden};
inline constexpr NamedTensor kMlpNorm{"post_attention_layernorm.weight", "ffn_norm.weight", Dim::kHidden, Dim::kHidden};
/// RMSNorm of each q / k head (ArchitectureSpec::qk_norm).
inline constexpr NamedTensor kQNorm{"self_attn.q_norm.weight", "attn_q_norm.weight", Dim::kHeadDim, Dim::kHeadDim};
inline constexpr NamedTensor kKNorm{"self_attn.k_norm.weight", "attn_k_norm.weight", Dim::kHeadDim, Dim::kHeadDim};
/// A per-layer buffer transformers saves in some checkpoints and woq ignores (RoPE is computed from the config).
inline constexpr std::string_view kRotaryInvFreq = "self_attn.rotary_emb.inv_freq";
/// A fused projection: one stored matrix whose rows are those of several block linears, in order.
struct FusedSpec {
  std::string_view module;  ///< Hugging Face module under "model.layers.N.": "self_attn.qkv_proj"
  std::string_view gguf;    ///< llama.cpp tensor under "blk.N.", without ".weight": "attn_qkv"
  std::array<LinearRole, 3> parts;
  std::size_t part_count;
};
/// Phi-3's (transformers' Phi3Attention: q, k, v rows; Phi3MLP: gate then up, chunk(2)). Architectures without
/// ArchitectureSpec::fused_projections refuse them by name.
inline constexpr std::array<FusedSpec, 2> kFusedProjections = {{
    {"self_attn.qkv_proj", "attn_qkv", {LinearRole::kQ, LinearRole::kK, LinearRole::kV}, 3},
    {"mlp.gate_up_proj", "ffn_gate_up", {LinearRole::kGate, LinearRole::kUp, LinearRole::kUp}, 2},
}};

/// "rows, cols" in config.json fields ("num_attention_heads * head_dim, hidden_size"), for error messages.
std::string dims_name(Dim rows, Dim cols);

/// "model.layers.{layer}.{name}": a per-layer tensor's Hugging Face name.
std::string layer_tensor(std::int64_t layer, std::string_view name);
/// "model.layers.{layer}.{module}.{leaf}" for block linear `role` ("weight", "bias", "qweight", ...).
std::string linear_tensor(std::int64_t layer, LinearRole role, std::string_view leaf = "weight");
/// Whether the Hugging Face tensor name `hf` is the weight or the bias of a block linear of `role`.
bool is_linear_tensor(std::string_view hf, LinearRole role);

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
  /// GGUF general.architecture llama.cpp writes for it ("llama", "qwen2", ...); empty: woq reads and
  /// writes no GGUF file of it.
  std::string_view gguf_architecture;
  /// llama.cpp stores q/k projection rows permuted for interleaved RoPE
  /// (convert_hf_to_gguf's LlamaModel.permute); qwen2/qwen3 keep HF's order.
  bool gguf_permute_qk;
  /// q/k/v and gate/up are stored fused (kFusedProjections) and split into kBlockLinears when a
  /// checkpoint is opened (io/fused_projections.h).
  bool fused_projections;
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
