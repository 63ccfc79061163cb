#include "io/architecture.h"

#include <array>
#include <string>

namespace woq {

namespace {

// transformers: modeling_llama.py, modeling_mistral.py, modeling_qwen2.py, modeling_qwen3.py.
constexpr std::array<ArchitectureSpec, 4> kArchitectures = {{
    {"LlamaForCausalLM", "llama", false, true, false, SlidingWindowRule::kNone},
    {"MistralForCausalLM", "mistral", false, false, false, SlidingWindowRule::kAllLayers},
    {"Qwen2ForCausalLM", "qwen2", true, false, false, SlidingWindowRule::kFromMaxWindow},
    {"Qwen3ForCausalLM", "qwen3", false, true, true, SlidingWindowRule::kFromMaxWindow},
}};

}  // namespace

std::span<const ArchitectureSpec> architectures() { return kArchitectures; }

const ArchitectureSpec* find_architecture(std::string_view architecture) {
  for (const ArchitectureSpec& a : kArchitectures)
    if (a.architecture == architecture) return &a;
  return nullptr;
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
