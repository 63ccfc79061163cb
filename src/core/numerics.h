// Which rounding a model's forward pass follows outside its matrix products.
#pragma once

#include <string_view>

namespace woq {

/// How RMSNorm, RoPE, SiLU and attention round (the linear layers are the
/// same in both):
/// - kWoq: woq's own operations (kernels/ops.h, kernels/attention.h), the same
///   bits on every ISA, tiled FlashAttention.
/// - kGgml: llama.cpp's CPU backend's operations in its order
///   (kernels/ggml_numerics.h), as ggml c392e5094 built for this CPU's vector
///   width computes them, so that a GGUF file gives llama.cpp's logits; the
///   bits then differ between AVX2 and AVX-512 machines, as llama.cpp's do.
/// A GGUF file loads with kGgml, everything else with kWoq; `--numerics` chooses.
enum class Numerics { kWoq, kGgml };

/// "woq", "ggml".
constexpr std::string_view numerics_name(Numerics n) { return n == Numerics::kGgml ? "ggml" : "woq"; }

/// The Numerics named "woq" or "ggml". Throws woq::Error for any other name.
Numerics parse_numerics(std::string_view name);

}  // namespace woq
