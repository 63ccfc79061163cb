// `woq quantize`: a Hugging Face checkpoint in, a GPTQ-format checkpoint out
// (the layout AutoGPTQ, GPTQModel, transformers and vLLM load; see
// formats/checkpoint_packing.h). The linear layers inside the decoder blocks
// (q/k/v/o/gate/up/down) are stored as integers; embeddings, norms, biases
// and lm_head are copied unchanged.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/progress.h"
#include "core/thread_pool.h"
#include "formats/checkpoint_packing.h"
#include "formats/low_bit.h"
#include "io/hf_config.h"
#include "io/quantized_checkpoint.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "model/quant_plan.h"

namespace woq {

/// A decoder block as a quantizer leaves it: its seven linear layers
/// (kBlockLinears' order) and the block's float tensors it changed, by
/// Hugging Face name (AWQ folds its scales into the RMSNorm weights), in fp32
/// with the tensor's element count; written in the input's dtype.
struct QuantizedBlock {
  std::vector<QuantMatrix> linears;
  std::map<std::string, std::vector<float>> replaced;
};

/// Produces decoder block `layer`. Called once per layer, in increasing order.
using BlockQuantizer = std::function<QuantizedBlock(std::int64_t layer)>;

/// How `woq quantize` runs.
struct QuantizeOptions {
  QuantSpec spec;                      ///< sym_int4, asym_int4 or sym_int8 (RTN), recorded in the config
  /// The layout written: GPTQ (kGptq) or AutoAWQ's GEMM (kAwq; needs `plan` from awq_plan).
  QuantizationConfig::Method checkpoint = QuantizationConfig::Method::kGptq;
  /// Per-module formats (model/quant_plan.h): `spec` is its base; the block
  /// linears it gives other formats are written under GPTQModel's `dynamic`
  /// rules ("+:" bits / group_size / sym; "-:" for fp16 / bf16 / fp32, stored
  /// as such). See gptq_plan_config for what it may hold.
  std::shared_ptr<const QuantPlan> plan = nullptr;
  GptqZeros zeros = GptqZeros::kV1;    ///< qzeros format written
  std::uint64_t max_shard_bytes = 5'000'000'000;  ///< safetensors shard limit (bytes)
  bool force = false;                  ///< replace an existing output directory
  std::string method = "rtn";          ///< recorded in quantization_config.meta
  /// The method's settings that quantization_config has no field for (AWQ's grid, clipping, search tokens,
  /// propagation), recorded as quantization_config.meta.woq_settings when not empty.
  nlohmann::ordered_json method_settings = nlohmann::ordered_json::object();
  double damp_percent = 0.01;          ///< recorded in quantization_config (GPTQ)
  bool desc_act = false;               ///< recorded in quantization_config (GPTQ)
  bool static_groups = false;          ///< recorded in quantization_config (GPTQ)
  bool true_sequential = false;        ///< recorded in quantization_config (GPTQ)
  /// Receives progress lines: one per stale temporary directory removed
  /// (see quantize_checkpoint), then one per finished layer.
  std::function<void(const std::string&)> progress;
  /// Called with (layers done, layers) after each decoder block.
  Progress layer_progress;
};

/// What quantizing did.
struct QuantizeReport {
  std::uint64_t bytes_before = 0;  ///< tensor bytes of the input checkpoint
  std::uint64_t bytes_after = 0;   ///< tensor bytes of the output
  std::int64_t matrices = 0;       ///< linear layers written
  std::int64_t kept_float = 0;     ///< of those, kept in floating point (a plan's, or what AWQ cannot pack)
  double seconds = 0;              ///< wall time
  /// Compatibility remarks also written into quantization_config.meta (e.g.
  /// K not a multiple of the group size, which GPTQ kernels require).
  std::vector<std::string> notes;
};

/// Round-to-nearest BlockQuantizer reading float weights from `store`: each
/// linear in `spec`'s format, or in `plan`'s for it when given.
BlockQuantizer rtn_quantizer(const TensorStore& store, const ModelConfig& config, const QuantSpec& spec,
                             ThreadPool& pool, std::shared_ptr<const QuantPlan> plan = nullptr);

/// The quantization_config of a GPTQ checkpoint of `plan` for model `c`:
/// the base's bits / group_size / sym, and one `dynamic` rule per block
/// linear whose format differs, anchored on its full name
/// ("+:model\.layers\.3\.mlp\.down_proj$"; "-:" when it stays float).
/// A group as long as K or longer is written as -1 (per channel). Throws
/// woq::Error naming the plan and module for a format GPTQ cannot hold
/// (K-quants), a float base, and an lm_head entry (woq's GPTQ checkpoints
/// keep lm_head as the input stores it).
QuantizationConfig gptq_plan_config(const QuantPlan& plan, const ModelConfig& c, GptqZeros zeros, bool desc_act);

/// Throws woq::Error naming `in_dir` when its config.json has a
/// quantization_config: woq quantize reads floating-point checkpoints.
void require_float_checkpoint(const std::string& in_dir);

/// The plan of an AWQ (GEMM) checkpoint of model `c` in `spec`: the block
/// linears AutoAWQ's packing cannot hold (N not a multiple of 8, K not a
/// multiple of the group size) stay in float type `keep` (the input's), to
/// be listed in modules_to_not_convert. Throws woq::Error for a format other
/// than asym_int4 / sym_int4, a group size of -1 (AWQ packs K / G groups),
/// or when no linear fits (every layer would stay float).
QuantPlan awq_plan(const QuantSpec& spec, const ModelConfig& c, LowBit keep);

/// The quantization_config of an AWQ GEMM checkpoint of `plan` (awq_plan's):
/// bits 4, the base's group size, and the float modules as
/// modules_to_not_convert (full names, which match only themselves).
QuantizationConfig awq_plan_config(const QuantPlan& plan, const ModelConfig& c);

/// Writes the quantized checkpoint of `in_dir` to `out_dir` with
/// `quantize` supplying the integers (rtn_quantizer when null): config.json
/// plus quantization_config, safetensors (sharded past
/// options.max_shard_bytes, with the index), and every other regular file
/// of in_dir (tokenizer, generation_config, chat template) except weights.
/// Everything is written into a temporary directory beside out_dir and
/// renamed into place at the end, so a failure leaves no partial out_dir;
/// in_dir is never modified. That directory, .NAME.tmp-PID-RANDOM for
/// out_dir NAME, carries this process's PID and an flock(2) while in use;
/// before writing, the ones a killed quantize to the same out_dir left
/// behind (PID no longer running, lock free) are removed and each removal
/// reported to options.progress. An ".old" one, the previous out_dir of a
/// --force run killed between its renames, is kept (and reported) while
/// out_dir is missing. Throws woq::Error when out_dir exists (unless
/// options.force), in_dir is already quantized or its tensors are invalid
/// (see LlamaModel::load), the spec is not an integer format, or when v1
/// cannot store a zero point (see pack_gptq).
/// Removes what woq quantize runs to `out` that were killed left beside it:
/// the .NAME.tmp-PID-RANDOM directories of quantize_checkpoint (as it does
/// itself, see below; never one that is or holds `input`) and the
/// NAME.tmp-PID files a GGUF output is written into, each only when its
/// process no longer runs (and its directory's lock is free). Reports each
/// removal to `log`. run_quantize_request calls it first, so that a run
/// refused or stopped before writing anything also cleans up. Never throws
/// for what it cannot list or remove (it says so).
void remove_stale_quantize_temps(const std::string& out, const std::string& input,
                                 const std::function<void(const std::string&)>& log);

/// Throws woq::Error naming `input` when woq writes no quantized file (GPTQ or GGUF) of `c`'s architecture:
/// one stored with fused projections (Phi-3), whose files would need the fused layout.
void require_writable_architecture(const std::string& input, const ModelConfig& c);

QuantizeReport quantize_checkpoint(const std::string& in_dir, const std::string& out_dir,
                                   const QuantizeOptions& options, ThreadPool& pool,
                                   const BlockQuantizer& quantize = nullptr);

}  // namespace woq
