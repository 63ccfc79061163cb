// Pre-quantized Hugging Face checkpoints: the quantization_config of
// config.json and the integer tensors of each linear layer, in GPTQ format
// (AutoGPTQ, GPTQModel, transformers), AWQ (AutoAWQ's GEMM and GEMV
// layouts) or compressed-tensors pack-quantized (Neural Magic /
// llm-compressor). Bit layouts: formats/checkpoint_packing.h.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/regex.h"
#include "formats/checkpoint_packing.h"
#include "io/safetensors.h"

namespace woq {

/// One rule of GPTQModel's per-module overrides, quantization_config.dynamic
/// (also read by vLLM and transformers): the key is a regex matched at the
/// start of a module name ("model.layers.3.mlp.down_proj"; Python's
/// re.match). "-:" before it: the modules it matches are not quantized (kept
/// in floating point); "+:" or nothing: the fields given (bits, group_size,
/// sym, desc_act) replace the config's for them.
struct DynamicRule {
  std::string key;  ///< as the file writes it, prefix included
  bool skip = false;
  std::shared_ptr<const Regex> regex;
  std::optional<int> bits;
  std::optional<std::int64_t> group_size;
  std::optional<bool> sym, desc_act;
};

/// config.json "quantization_config" of a checkpoint woq can load.
struct QuantizationConfig {
  enum class Method { kGptq, kAwq, kCompressedTensors };
  Method method = Method::kGptq;
  AwqVersion awq_version = AwqVersion::kGemm;  ///< AWQ only: "version"
  int bits = 4;                   ///< 4 or 8
  std::int64_t group_size = 128;  ///< -1 = per output channel
  bool sym = true;
  bool desc_act = false;
  GptqZeros zeros = GptqZeros::kV1;  ///< GPTQ only: checkpoint_format gptq / gptq_v2
  /// GPTQ only: "lm_head": lm_head is stored quantized too (lm_head.qweight, ...), in this config's format
  /// unless a `dynamic` rule matching "lm_head" says otherwise (GPTQModel's QuantizeConfig.lm_head; vLLM
  /// and transformers read it).
  bool lm_head = false;
  /// How it was made, as far as the config says: quantization_config.meta's
  /// quantizer (AutoGPTQ / GPTQModel / woq write it) and woq_method (gptq or
  /// rtn), and damp_percent for GPTQ; e.g. "woq 0.1.0, gptq, damp_percent 0.01";
  /// empty when the config says nothing.
  std::string provenance;
  /// GPTQ only: `dynamic`'s rules in the file's order (the first that matches a module decides).
  std::vector<DynamicRule> dynamic;
  /// CPU seconds for_module has spent matching `dynamic` (shared by the copies of this config); for_module
  /// throws woq::Error past kDynamicBudgetSeconds.
  std::shared_ptr<double> dynamic_cpu_seconds = std::make_shared<double>(0.0);
  static constexpr double kDynamicBudgetSeconds = 2.0;
  /// AWQ only: modules_to_not_convert; a module whose name contains one of
  /// them is stored in floating point (transformers' rule).
  std::vector<std::string> not_converted;

  /// "GPTQ v1 4-bit sym group_size 128", then "with N per-module rules" and the provenance in parentheses.
  std::string describe() const;
  /// The config of module `prefix` ("model.layers.3.mlp.down_proj") under
  /// `dynamic`: the first rule that matches decides, as in GPTQModel and
  /// vLLM; nullopt when it is a "-:" rule or the module is in
  /// not_converted (it is stored in floating point). Without a matching
  /// rule: this config. Throws woq::Error when matching has taken more than
  /// kDynamicBudgetSeconds of CPU time in all (a rule's one match is bounded
  /// by Regex::match_at_start's step limit).
  std::optional<QuantizationConfig> for_module(const std::string& prefix) const;
};

/// Reads DIR/config.json's quantization_config: nullopt when there is none
/// (and for a .gguf path).
/// Throws woq::Error naming config.json and the field for an unsupported
/// quant_method (bitsandbytes, ...), bits other than 4 and 8 (AWQ: 4), an
/// AWQ version other than gemm / gemv (gemv_fast and marlin are named),
/// zero_point false (AutoAWQ's packers need zero points), a
/// group_size that is neither -1 nor positive, a compressed-tensors format
/// other than pack-quantized, quantized activations, or several
/// compressed-tensors config groups with different weight settings; and for
/// a `dynamic` rule that is not an object, has a regex PCRE2 cannot compile,
/// or a field other than bits, group_size, sym, desc_act (and GPTQModel's
/// quantizing-only ones, damp_percent, mse, ...), naming the rule.
std::optional<QuantizationConfig> read_quantization_config(const std::string& dir);

/// The quantization_config woq writes for a GPTQ checkpoint (the fields
/// AutoGPTQ, GPTQModel and transformers' GPTQConfig read; `dynamic` when
/// config.dynamic has rules).
nlohmann::ordered_json gptq_config_json(const QuantizationConfig& config, double damp_percent, bool static_groups,
                                        bool true_sequential);

/// The quantization_config of an AWQ checkpoint (AutoAWQ's fields, which
/// transformers' AwqConfig and vLLM read): quant_method awq, bits,
/// group_size, zero_point true, version, modules_to_not_convert (null when
/// empty).
nlohmann::ordered_json awq_config_json(const QuantizationConfig& config);

/// Loads the linear layer `prefix` (e.g. "model.layers.0.mlp.down_proj",
/// shape [rows = N, cols = K]) from its integer tensors: GPTQ
/// prefix.{qweight, qzeros, scales, g_idx}, AWQ prefix.{qweight, qzeros,
/// scales} (as asym_int4 with the config's group size) or compressed-tensors
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
