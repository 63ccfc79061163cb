// Checkpoints that store a block's projections fused (Phi-3: self_attn.qkv_proj, mlp.gate_up_proj) read as the
// separate q/k/v and gate/up tensors every other part of woq uses (arch/architecture.h's kBlockLinears).
#pragma once

#include "io/hf_config.h"
#include "io/safetensors.h"

namespace woq {

/// Replaces each layer's fused projections in `store` by views of their rows, in the split transformers'
/// Phi3Attention / Phi3MLP make: "model.layers.N.self_attn.qkv_proj.weight" [q_dim + 2 kv_dim, hidden] gives
/// q_proj (rows [0, q_dim)), k_proj (the next kv_dim) and v_proj (the last kv_dim); "mlp.gate_up_proj.weight"
/// [2 intermediate, hidden] gives gate_proj (the first half) and up_proj (the second; Phi3MLP's chunk(2)).
/// Views share the mapping (no copy). Float tensors only. Throws woq::Error naming the tensor when a fused
/// tensor is missing, has another shape or a non-float dtype, or a separate projection is stored beside it.
void split_fused_projections(TensorStore& store, const ModelConfig& c);

}  // namespace woq
