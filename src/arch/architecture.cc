#include "arch/architecture.h"

#include <array>
#include <string>

#include <fmt/format.h>

namespace woq {

namespace {

// transformers: modeling_llama.py, modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py, modeling_phi3.py;
// llama.cpp: convert_hf_to_gguf.py (LlamaModel, MistralModel, Qwen2Model, Qwen3Model).
// A GGUF's general.architecture reads as the first entry that writes it.
// Phi-3 (Phi3ForCausalLM without partial rotary or longrope: Phi-3-mini-4k, Phi-3-medium-4k) is a Llama block
// with fused projections and Mistral's sliding window on every layer.
constexpr std::array<ArchitectureSpec, 5> kArchitectures = {{
    // architecture, model_type, qkv_bias, attention_bias_field, qk_norm, sliding_window, gguf, permute, fused
    {"LlamaForCausalLM", "llama", false, true, false, SlidingWindowRule::kNone, "llama", true, false},
    {"MistralForCausalLM", "mistral", false, false, false, SlidingWindowRule::kAllLayers, "llama", true, false},
    {"Qwen2ForCausalLM", "qwen2", true, false, false, SlidingWindowRule::kFromMaxWindow, "qwen2", false, false},
    {"Qwen3ForCausalLM", "qwen3", false, true, true, SlidingWindowRule::kFromMaxWindow, "qwen3", false, false},
    {"Phi3ForCausalLM", "phi3", false, false, false, SlidingWindowRule::kAllLayers, "", false, true},
}};

}  // namespace

std::string_view dim_name(Dim d) {
  switch (d) {
    case Dim::kHidden: return "hidden_size";
    case Dim::kIntermediate: return "intermediate_size";
    case Dim::kQ: return "num_attention_heads * head_dim";
    case Dim::kKv: return "num_key_value_heads * head_dim";
    case Dim::kHeadDim: return "head_dim";
    case Dim::kVocab: return "vocab_size";
  }
  return "?";
}

std::string dims_name(Dim rows, Dim cols) { return fmt::format("{}, {}", dim_name(rows), dim_name(cols)); }

std::string layer_tensor(std::int64_t layer, std::string_view name) {
  return fmt::format("model.layers.{}.{}", layer, name);
}

std::string linear_tensor(std::int64_t layer, LinearRole role, std::string_view leaf) {
  return fmt::format("model.layers.{}.{}.{}", layer, linear_spec(role).module, leaf);
}

bool is_linear_tensor(std::string_view hf, LinearRole role) {
  for (const std::string_view leaf : {".weight", ".bias"})
    if (hf.ends_with(leaf) && hf.substr(0, hf.size() - leaf.size()).ends_with(linear_spec(role).module)) return true;
  return false;
}

std::span<const ArchitectureSpec> architectures() { return kArchitectures; }

const ArchitectureSpec* find_architecture(std::string_view architecture) {
  for (const ArchitectureSpec& a : kArchitectures)
    if (a.architecture == architecture) return &a;
  return nullptr;
}

const ArchitectureSpec* find_gguf_architecture(std::string_view gguf_architecture) {
  for (const ArchitectureSpec& a : kArchitectures)
    if (!a.gguf_architecture.empty() && a.gguf_architecture == gguf_architecture) return &a;
  return nullptr;
}

std::string_view supported_gguf_architectures() {
  static const std::string names = [] {
    std::string s;
    for (const ArchitectureSpec& a : kArchitectures)
      if (!a.gguf_architecture.empty() && s.find(a.gguf_architecture) == std::string::npos) s += (s.empty() ? "" : ", ") + std::string(a.gguf_architecture);
    return s;
  }();
  return names;
}

std::string_view supported_architectures() {
  static const std::string names = [] {
    std::string s;
    for (const ArchitectureSpec& a : kArchitectures) s += (s.empty() ? "" : ", ") + std::string(a.architecture);
    return s;
  }();
  return names;
}

}  // namespace woq
