// A quantization plan: the format and group size of every block linear (and
// of lm_head and the input embeddings), as data. llama.cpp's llama_tensor_get_type decides this by a
// fixed rule per file type and GPTQModel's `dynamic` takes per-module
// overrides written by hand; a plan is the same decision written down, so a
// plan found by measurement (quantize/plan_search.h) or written by a user
// loads like any --low-bit.
//
// File (JSON, "woq_plan": 1):
//   {"woq_plan": 1,
//    "base": {"low_bit": "sym_int4", "group_size": 32},
//    "activations": "int8",                  // optional: what integer layers multiply their inputs as
//    "tensors": {"model.layers.3.mlp.down_proj": {"low_bit": "sym_int8", "group_size": -1},
//                "lm_head": {"low_bit": "sym_int8", "group_size": -1},
//                "model.embed_tokens": {"low_bit": "q4_k"}, ...},
//    "solve": {...}, "verify": {...}}      // optional: what found it and what it measured (kept, not read)
// A spec may also give "int4_range" ("full" / "clip") and "rounding" ("woq" / "ggml").
// Module names are Hugging Face's ("model.layers.N." + the linear's module).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "formats/low_bit.h"

namespace woq {

/// The plan's key of lm_head (a plan that does not name it leaves lm_head as the checkpoint stores it).
inline constexpr std::string_view kLmHeadModule = "lm_head";
/// The plan's key of the input embeddings (a plan that does not name them leaves them as stored; only an
/// untied model's: tied ones are also lm_head).
inline constexpr std::string_view kEmbeddingsModule = "model.embed_tokens";

/// Formats per tensor; the block linears it does not name take `base`.
struct QuantPlan {
  QuantSpec base;
  /// Hugging Face module name ("model.layers.3.mlp.down_proj", "lm_head", "model.embed_tokens") -> its format.
  std::map<std::string, QuantSpec> tensors;
  /// What the integer layers multiply their inputs as ("activations": "int8"
  /// in the file); unset: each format's default (a plan for a GGUF file says
  /// int8, as llama.cpp's Q8_0 / K-quant dot products take).
  std::optional<Activations> activations;
  /// Where the plan came from (a file path), for messages and the load line.
  std::string source;
  /// Informational objects of the file ("solve", "verify"), written back unchanged.
  nlohmann::ordered_json info = nlohmann::ordered_json::object();

  /// The format of block `layer`'s linear `role`.
  const QuantSpec& linear(std::int64_t layer, LinearRole role) const;
  /// lm_head's format when the plan names it.
  std::optional<QuantSpec> lm_head() const;
  /// The input embeddings' format when the plan names them.
  std::optional<QuantSpec> embeddings() const;
  /// Throws woq::Error (naming source and the module) when a module names a
  /// layer at or beyond `layers` or is not a block linear / lm_head / the embeddings.
  void check_layers(std::int64_t layers) const;
};

/// A short name of a format: "sym_int4 g32", "sym_int8 per channel", "q4_k", "fp16".
std::string spec_name(const QuantSpec& spec);

/// "model.layers.{layer}.{module}" of block linear `role` (the plan's key).
std::string plan_module(std::int64_t layer, LinearRole role);
/// The layer and role of a plan key "model.layers.N.<module>", or nullopt.
std::optional<std::pair<std::int64_t, LinearRole>> parse_module(std::string_view name);

/// A format as the plan file writes it: {"low_bit": "sym_int4", "group_size": 32}.
nlohmann::ordered_json spec_json(const QuantSpec& spec);
/// A format from its JSON; `what` names the field in errors
/// ("PATH: tensors.model.layers.3.mlp.down_proj"). Throws woq::Error for an
/// unknown field or name, a missing low_bit or group_size, or an invalid spec.
QuantSpec parse_spec(const nlohmann::json& json, const std::string& what);

/// The plan as its file's JSON.
nlohmann::ordered_json plan_json(const QuantPlan& plan);
/// A plan from its file's JSON; `source` names it in errors. Throws woq::Error
/// naming the field for an unknown key, an unknown module name, a format name
/// woq lacks or an invalid group size (formats/low_bit.h's validate).
QuantPlan parse_plan(const nlohmann::json& json, const std::string& source);
/// Reads a plan file (parse_plan; read_json_file's errors).
QuantPlan read_plan(const std::string& path);
/// Writes `plan` to `path` (PATH.tmp renamed into place).
void write_plan(const QuantPlan& plan, const std::string& path);

}  // namespace woq
