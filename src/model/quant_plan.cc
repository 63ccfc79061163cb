#include "model/quant_plan.h"

#include <charconv>
#include <string_view>

#include <fmt/format.h>

#include "core/error.h"
#include "formats/kquant.h"
#include "io/json_file.h"

namespace woq {

namespace {

constexpr std::string_view kLayersPrefix = "model.layers.";

}  // namespace

nlohmann::ordered_json spec_json(const QuantSpec& s) {
  nlohmann::ordered_json j;
  j["low_bit"] = std::string(low_bit_name(s.type));
  if (is_quantized(s.type) && !is_kquant(s.type)) j["group_size"] = s.group_size;
  if (s.type == LowBit::kSymInt4 && s.int4_range != Int4Range::kFull) j["int4_range"] = std::string(int4_range_name(s.int4_range));
  if (s.rounding != Rounding::kWoq) j["rounding"] = std::string(rounding_name(s.rounding));
  return j;
}

QuantSpec parse_spec(const nlohmann::json& j, const std::string& what) {
  if (!j.is_object()) fail("{}: must be an object like {{\"low_bit\": \"sym_int4\", \"group_size\": 32}}, got {}", what,
                           describe_json(j));
  QuantSpec s;
  auto text = [&](const char* key) -> std::optional<std::string> {
    if (!j.contains(key)) return std::nullopt;
    if (!j[key].is_string()) fail("{}.{}: must be a string, got {}", what, key, describe_json(j[key]));
    return j[key].get<std::string>();
  };
  for (const auto& [key, value] : j.items())
    if (key != "low_bit" && key != "group_size" && key != "int4_range" && key != "rounding")
      fail("{}: unknown field '{}' (a spec has low_bit, group_size, int4_range, rounding)", what, key);
  const std::optional<std::string> low_bit = text("low_bit");
  if (!low_bit) fail("{}: 'low_bit' is missing", what);
  try {
    s.type = parse_low_bit(*low_bit);
    if (const std::optional<std::string> r = text("int4_range")) s.int4_range = parse_int4_range(*r);
    if (const std::optional<std::string> r = text("rounding")) s.rounding = parse_rounding(*r);
    if (is_kquant(s.type)) {
      s.group_size = kquant::find(s.type)->block;
      if (j.contains("group_size"))
        fail("group_size: {}'s blocks are fixed ({} weights); leave it out", low_bit_name(s.type), s.group_size);
    } else if (j.contains("group_size")) {
      if (!j["group_size"].is_number_integer())
        fail("group_size: must be an integer, got {}", describe_json(j["group_size"]));
      s.group_size = j["group_size"].get<std::int64_t>();
    } else if (is_quantized(s.type)) {
      fail("'group_size' is missing (-1 = per output channel)");
    }
    validate(s);
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(what)) throw;
    fail("{}: {}", what, e.what());
  }
  return s;
}

std::optional<std::pair<std::int64_t, LinearRole>> parse_module(std::string_view name) {
  if (!name.starts_with(kLayersPrefix)) return std::nullopt;
  name.remove_prefix(kLayersPrefix.size());
  const std::size_t dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 9 || name[0] < '0' || name[0] > '9') return std::nullopt;
  std::int64_t layer = 0;
  const auto [end, ec] = std::from_chars(name.data(), name.data() + dot, layer);
  if (ec != std::errc() || end != name.data() + dot || (dot > 1 && name[0] == '0')) return std::nullopt;
  const std::string_view module = name.substr(dot + 1);
  for (const LinearSpec& spec : kBlockLinears)
    if (module == spec.module) return std::make_pair(layer, spec.role);
  return std::nullopt;
}

std::string spec_name(const QuantSpec& s) {
  std::string name(low_bit_name(s.type));
  if (!is_quantized(s.type)) return name;
  name += s.group_size == -1 ? std::string(" per channel") : fmt::format(" g{}", s.group_size);
  if (s.type == LowBit::kSymInt4 && s.int4_range == Int4Range::kClip) name += " clip";
  if (s.rounding == Rounding::kGgml) name += " ggml";
  return name;
}

std::string plan_module(std::int64_t layer, LinearRole role) {
  return fmt::format("{}{}.{}", kLayersPrefix, layer, linear_spec(role).module);
}

const QuantSpec& QuantPlan::linear(std::int64_t layer, LinearRole role) const {
  const auto it = tensors.find(plan_module(layer, role));
  return it == tensors.end() ? base : it->second;
}

namespace {

std::optional<QuantSpec> named(const std::map<std::string, QuantSpec>& tensors, std::string_view module) {
  const auto it = tensors.find(std::string(module));
  return it == tensors.end() ? std::nullopt : std::optional<QuantSpec>(it->second);
}

// lm_head or the embeddings: named by the plan apart from the block linears.
bool is_model_end(std::string_view name) { return name == kLmHeadModule || name == kEmbeddingsModule; }

}  // namespace

std::optional<QuantSpec> QuantPlan::lm_head() const { return named(tensors, kLmHeadModule); }

std::optional<QuantSpec> QuantPlan::embeddings() const { return named(tensors, kEmbeddingsModule); }

void QuantPlan::check_layers(std::int64_t layers) const {
  for (const auto& [name, spec] : tensors) {
    if (is_model_end(name)) continue;
    const auto parsed = parse_module(name);
    if (!parsed)
      fail("{}: tensors: '{}' is not a block linear (model.layers.N.self_attn.q_proj, ...), lm_head or "
           "model.embed_tokens", source, name);
    if (parsed->first >= layers)
      fail("{}: tensors: '{}' names layer {}, but the model has {} layers (a plan for another model?)", source, name,
           parsed->first, layers);
  }
}

nlohmann::ordered_json plan_json(const QuantPlan& plan) {
  nlohmann::ordered_json j;
  j["woq_plan"] = 1;
  j["base"] = spec_json(plan.base);
  if (plan.activations) j["activations"] = std::string(activations_name(*plan.activations));
  nlohmann::ordered_json tensors = nlohmann::ordered_json::object();
  for (const auto& [name, spec] : plan.tensors) tensors[name] = spec_json(spec);
  j["tensors"] = std::move(tensors);
  for (const auto& [key, value] : plan.info.items()) j[key] = value;
  return j;
}

QuantPlan parse_plan(const nlohmann::json& json, const std::string& source) {
  if (!json.is_object()) fail("{}: a plan must be a JSON object, got {}", source, describe_json(json));
  if (!json.contains("woq_plan") || json["woq_plan"] != 1)
    fail("{}: not a woq plan file (field 'woq_plan' must be 1)", source);
  QuantPlan plan;
  plan.source = source;
  for (const auto& [key, value] : json.items()) {
    if (key == "woq_plan") continue;
    if (key == "base") {
      plan.base = parse_spec(value, source + ": base");
    } else if (key == "tensors") {
      if (!value.is_object()) fail("{}: tensors: must be an object of module name -> spec", source);
      for (const auto& [name, spec] : value.items()) {
        const std::string what = fmt::format("{}: tensors.{}", source, name);
        if (!is_model_end(name) && !parse_module(name))
          fail("{}: not a block linear (model.layers.N.self_attn.q_proj, ..., mlp.down_proj), lm_head or "
               "model.embed_tokens", what);
        plan.tensors[name] = parse_spec(spec, what);
      }
    } else if (key == "activations") {
      if (!value.is_string()) fail("{}: activations: must be a string (int8, int16, f32 or bf16)", source);
      try {
        plan.activations = parse_activations(value.get<std::string>());
      } catch (const Error& e) {
        fail("{}: activations: {}", source, e.what());
      }
    } else if (key == "solve" || key == "verify") {
      plan.info[key] = value;
    } else {
      fail("{}: unknown field '{}' (a plan has woq_plan, base, tensors, and optionally activations, solve and verify)", source, key);
    }
  }
  if (!json.contains("base")) fail("{}: 'base' is missing (the format of the layers 'tensors' does not name)", source);
  return plan;
}

QuantPlan read_plan(const std::string& path) { return parse_plan(read_json_file(path), path); }

void write_plan(const QuantPlan& plan, const std::string& path) { write_json_file(path, plan_json(plan)); }

}  // namespace woq
