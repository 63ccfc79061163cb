// The one check of a checkpoint's tensors against its configuration, run by
// every path that reads a model (LlamaModel::load) or writes one from it
// (woq quantize to GPTQ or GGUF) before anything is computed or written.
#pragma once

#include "io/hf_config.h"
#include "io/safetensors.h"

namespace woq {

/// Checks `store` against `config` without reading tensor data: every tensor
/// name belongs to the architecture and to a layer below num_hidden_layers
/// (no fused projections, no biases or q/k norms the architecture lacks);
/// the embeddings [vocab_size, hidden_size], lm_head (unless tied, or stored
/// as GPTQ integers in a `quantized` checkpoint), the final
/// norm [hidden_size], each layer's norms, biases and q/k norms, and — unless
/// `quantized` (GPTQ / compressed-tensors linears, checked where they are
/// read) — each layer's seven float linears are present with their shapes.
/// Throws woq::Error naming the file (store.source()), the tensor and the
/// configuration fields its expected shape comes from.
void validate_checkpoint(const TensorStore& store, const ModelConfig& config, bool quantized);

}  // namespace woq
