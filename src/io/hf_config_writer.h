// The inverse of read_model_config: a ModelConfig as the config.json and
// generation_config.json transformers writes, for checkpoints woq creates
// (woq make-random, woq quantize from a GGUF file).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "io/hf_config.h"

namespace woq {

/// config.json of `c` (transformers' LlamaConfig / MistralConfig /
/// Qwen2Config / Qwen3Config fields: sizes, heads, head_dim, rope_theta,
/// rope_scaling, rms_norm_eps, sliding window, biases, tied embeddings,
/// bos/eos ids) with "torch_dtype" `torch_dtype` ("float32", "float16",
/// "bfloat16"). read_model_config of the result gives `c` back. Per-frequency
/// RoPE factors (a GGUF's rope_freqs tensor) are written as the rope_scaling
/// that gives them (none, linear, or llama3 with its factors and original
/// context found by search, within 1e-5). Throws woq::Error for an
/// architecture woq lacks and for factors no rope_scaling gives.
nlohmann::ordered_json hf_config_json(const ModelConfig& c, std::string_view torch_dtype);

/// generation_config.json of `c`: its bos_token_id and eos_token_id (one id
/// or the list).
nlohmann::ordered_json hf_generation_config_json(const ModelConfig& c);

}  // namespace woq
