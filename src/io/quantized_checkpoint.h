// Pre-quantized Hugging Face checkpoints: the quantization_config of
// config.json and the integer tensors of each linear layer, in GPTQ format
// (AutoGPTQ, GPTQModel, transformers) or compressed-tensors pack-quantized
// (Neural Magic / llm-compressor). Bit layouts: formats/checkpoint_packing.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "formats/checkpoint_packing.h"
#include "io/safetensors.h"

namespace woq {

/// config.json "quantization_config" of a checkpoint woq can load.
struct QuantizationConfig {
  enum class Method { kGptq, kCompressedTensors };
  Method method = Method::kGptq;
  int bits = 4;                   ///< 4 or 8
  std::int64_t group_size = 128;  ///< -1 = per output channel
  bool sym = true;
  bool desc_act = false;
  GptqZeros zeros = GptqZeros::kV1;  ///< GPTQ only: checkpoint_format gptq / gptq_v2
  /// How it was made, as far as the config says: quantization_config.meta's
  /// quantizer (AutoGPTQ / GPTQModel / woq write it) and woq_method (gptq or
  /// rtn), and damp_percent for GPTQ; e.g. "woq 0.1.0, gptq, damp_percent 0.01";
  /// empty when the config says nothing.
  std::string provenance;

  /// "GPTQ v1 4-bit sym group_size 128", then the provenance in parentheses.
  std::string describe() const;
};

/// Reads DIR/config.json's quantization_config: nullopt when there is none
/// (and for a .gguf path).
/// Throws woq::Error naming config.json and the field for an unsupported
/// quant_method (awq, bitsandbytes, ...), bits other than 4 and 8, a
/// group_size that is neither -1 nor positive, a compressed-tensors format
/// other than pack-quantized, quantized activations, or several
/// compressed-tensors config groups with different weight settings.
std::optional<QuantizationConfig> read_quantization_config(const std::string& dir);

/// The quantization_config woq writes for a GPTQ checkpoint (the fields
/// AutoGPTQ, GPTQModel and transformers' GPTQConfig read).
nlohmann::ordered_json gptq_config_json(const QuantizationConfig& config, double damp_percent, bool static_groups,
                                        bool true_sequential);

/// Loads the linear layer `prefix` (e.g. "model.layers.0.mlp.down_proj",
/// shape [rows = N, cols = K]) from its integer tensors: GPTQ
/// prefix.{qweight, qzeros, scales, g_idx} or compressed-tensors
/// prefix.{weight_packed, weight_scale, weight_zero_point, weight_shape,
/// weight_g_idx}. Returns nullopt when neither qweight nor weight_packed
/// exists (the layer is stored in floating point). Throws woq::Error naming
/// the tensor and file for wrong shapes or dtypes (shapes are derived from
/// the config's bits and group_size, so a config that disagrees with the
/// tensors fails here), out-of-range g_idx and zero points. Messages about
/// recoverable oddities (v2 zeros labelled v1) are appended to `warnings`.
/// The repack runs on `pool` when given.
std::optional<QuantMatrix> load_quantized_linear(const TensorStore& store, const QuantizationConfig& config,
                                                 const std::string& prefix, std::int64_t rows, std::int64_t cols,
                                                 std::vector<std::string>& warnings, ThreadPool* pool = nullptr);

}  // namespace woq
