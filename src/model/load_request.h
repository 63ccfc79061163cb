// Load options as the CLI's flags and the Python API's keyword arguments spell
// them (names of woq's formats), parsed in one place, and the lines that say
// what loading did.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/llama.h"

namespace woq {

/// The model-loading choices by name: `low_bit` sym_int4 | asym_int4 |
/// sym_int8 | fp16 | bf16 | fp32 | q3_k | q4_k | q5_k (every linear in that
/// K-quant) | a llama-quantize file type (q2_k, q3_k_s/m/l, q4_k_s/m,
/// q5_k_s/m, q6_k: LoadOptions::mix); `int4_range` full | clip; `rounding` woq |
/// ggml, or empty (not given: woq's; ggml's block formats, which have ggml's
/// only, refuse an explicit woq); `lm_head_low_bit` empty (keep lm_head as stored) or a low_bit name;
/// `activations` empty (each format's default), int8, int16, f32 or bf16; `numerics` empty, woq or ggml.
///
/// An empty `low_bit` is the default: sym_int4, with LoadOptions::linear_is_default set.
struct LoadRequest {
  std::string low_bit;
  std::int64_t group_size = 32;
  std::string int4_range = "full";
  std::string rounding;
  std::string lm_head_low_bit;
  std::string activations;
  /// A plan file (model/quant_plan.h) or a llama-quantize file type name
  /// ("q4_k_m": its rule); empty = none. Excludes low_bit.
  std::string plan;
  /// "woq" or "ggml" (core/numerics.h); empty: the checkpoint's.
  std::string numerics;
};

/// The LoadOptions `request` names. Appends to `notes` (when given) what is
/// ignored (--int4-range for a format without int4). Throws woq::Error for an
/// unknown name or an invalid group size (formats/low_bit.h's parse_* and
/// validate), a plan given with a low_bit, or read_plan's errors.
LoadOptions parse_load_request(const LoadRequest& request, std::vector<std::string>* notes = nullptr);

/// The options that load `plan`: its base as `linear`, its lm_head and
/// activations when it names them, and the plan itself (a copy).
LoadOptions load_options_of(const QuantPlan& plan);

/// What loading with `options` did, one line each: the report's warnings
/// ("warning: ..."), then the summary ("35 linear layers (q/k/v/o/gate/up/down)
/// F32 -> sym_int4 ...: 0.95 MiB -> 0.14 MiB; embeddings, norms and lm_head kept
/// as stored (0.13 MiB); loaded in 0.01 s").
std::vector<std::string> load_summary(const LoadReport& report, const LoadOptions& options);

/// What a loaded model is, for tables and JSON: the report's label and the
/// file or directory name, e.g. "GPTQ v1 4-bit asym group_size 128 (...) [q]"
/// (the name with controls and bidi marks as '?', see printable_text).
std::string model_label(const std::string& path, const LoadReport& report);

}  // namespace woq
