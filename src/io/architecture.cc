#include "io/architecture.h"

#include <array>
#include <string>

namespace woq {

namespace {

// transformers: modeling_llama.py, modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py;
// llama.cpp: convert_hf_to_gguf.py (LlamaModel, MistralModel, Qwen2Model, Qwen3Model).
// A GGUF's general.architecture reads as the first entry that writes it.
constexpr std::array<ArchitectureSpec, 4> kArchitectures = {{
    {"LlamaForCausalLM", "llama", false, true, false, SlidingWindowRule::kNone, "llama", true},
    {"MistralForCausalLM", "mistral", false, false, false, SlidingWindowRule::kAllLayers, "llama", true},
    {"Qwen2ForCausalLM", "qwen2", true, false, false, SlidingWindowRule::kFromMaxWindow, "qwen2", false},
    {"Qwen3ForCausalLM", "qwen3", false, true, true, SlidingWindowRule::kFromMaxWindow, "qwen3", false},
}};

}  // namespace

std::span<const ArchitectureSpec> architectures() { return kArchitectures; }

const ArchitectureSpec* find_architecture(std::string_view architecture) {
  for (const ArchitectureSpec& a : kArchitectures)
    if (a.architecture == architecture) return &a;
  return nullptr;
}

const ArchitectureSpec* find_gguf_architecture(std::string_view gguf_architecture) {
  for (const ArchitectureSpec& a : kArchitectures)
    if (a.gguf_architecture == gguf_architecture) return &a;
  return nullptr;
}

std::string_view supported_gguf_architectures() {
  static const std::string names = [] {
    std::string s;
    for (const ArchitectureSpec& a : kArchitectures)
      if (s.find(a.gguf_architecture) == std::string::npos) s += (s.empty() ? "" : ", ") + std::string(a.gguf_architecture);
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
