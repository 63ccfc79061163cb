#include "model/checkpoint_check.h"

#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "arch/architecture.h"
#include "core/error.h"

namespace woq {

namespace {

// Refuses tensors the model would not use: layers beyond config.json's
// num_hidden_layers, fused q/k/v (Phi-3 style qkv_proj) or gate/up
// projections, biases or q/k norms the configured architecture lacks (a Qwen
// checkpoint labelled Llama), or anything else unknown. Silently ignoring a
// tensor gives wrong output; transformers' rotary_emb.inv_freq buffers are the
// one thing skipped.
// The block linear whose Hugging Face module is `module` ("self_attn.q_proj"), or nullptr.
const LinearSpec* find_linear(std::string_view module) {
  for (const LinearSpec& spec : kBlockLinears)
    if (spec.module == module) return &spec;
  return nullptr;
}

void check_tensor_names(const TensorStore& store, const ModelConfig& c) {
  static const std::set<std::string, std::less<>> kLinearParts = {
      "weight", "qweight", "qzeros", "scales", "g_idx",  // float, GPTQ
      "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx"};  // compressed-tensors
  for (const auto& name : store.names()) {
    if (name == kEmbedTokens.hf || name == kFinalNorm.hf || name == kLmHead.hf) continue;
    auto refuse = [&](const std::string& why) { fail("{}: tensor '{}' {}", store.source(), name, why); };
    // A quantized lm_head (GPTQModel's lm_head: true): its parts as a block linear's; the loader checks the config.
    if (name.starts_with("lm_head.") && kLinearParts.contains(name.substr(std::string_view("lm_head.").size())))
      continue;
    if (!name.starts_with("model.layers."))
      refuse(fmt::format("is not part of a {} checkpoint as woq reads it", c.architecture));
    const std::string rest = name.substr(std::string_view("model.layers.").size());
    const std::size_t dot = rest.find('.');
    const std::string index = rest.substr(0, dot);
    if (dot == std::string::npos || index.empty() || index.size() > 6 ||
        index.find_first_not_of("0123456789") != std::string::npos)
      refuse("has no layer number");
    if (index.size() > 1 && index[0] == '0') refuse("has a layer number with a leading zero (never read)");
    if (std::stoll(index) >= c.num_hidden_layers)
      refuse(fmt::format("belongs to a layer beyond {} = {}", store.source().ends_with(".gguf") ? "the GGUF's block_count"
                                                                                                 : "config.json num_hidden_layers",
                         c.num_hidden_layers));
    const std::string part = rest.substr(dot + 1);
    for (const FusedSpec& f : kFusedProjections)
      if (part.starts_with(std::string(f.module) + "."))
        refuse(find_architecture(c.architecture)->fused_projections
                   ? fmt::format("is not used by {} (its fused projections are read from their .weight alone)",
                                 c.architecture)
                   : fmt::format("is a fused projection; {} is read with separate q/k/v_proj and gate/up_proj "
                                 "(fused ones: Phi3ForCausalLM)", c.architecture));
    if (part == kAttnNorm.hf || part == kMlpNorm.hf || part == kRotaryInvFreq) continue;
    const std::size_t last = part.rfind('.');
    const std::string module = part.substr(0, last), leaf = last == std::string::npos ? "" : part.substr(last + 1);
    if (const LinearSpec* linear = find_linear(module)) {
      if (kLinearParts.contains(leaf)) continue;
      if (leaf == "bias") {
        if (c.has_bias(linear->bias)) continue;
        if (linear->bias == LinearBias::kNone)
          refuse(fmt::format("is a bias of {}, which no architecture woq reads has (mlp_bias)", linear->module));
        refuse(fmt::format("is a bias that {} as config.json describes it does not have (attention_bias {})",
                           c.architecture, c.attention_bias ? "true" : "false"));
      }
    }
    if (part == kQNorm.hf || part == kKNorm.hf) {
      if (c.qk_norm) continue;
      refuse(fmt::format("is a q/k norm, which {} does not have (Qwen3ForCausalLM does)", c.architecture));
    }
    refuse(fmt::format("is not used by {}", c.architecture));
  }
}

// A tensor the model needs: present, of a float or ggml type, with `shape`.
void require(const TensorStore& store, const std::string& name, const std::vector<std::int64_t>& shape,
             const char* from) {
  const TensorView* t = store.find(name);
  if (t == nullptr) fail("{}: tensor '{}' is missing", store.source(), name);
  require_shape(*t, shape, fmt::format("from {} {}", shape_source(*t), from));
  require_float_dtype(*t);
}

}  // namespace

void validate_checkpoint(const TensorStore& store, const ModelConfig& c, bool quantized) {
  check_tensor_names(store, c);
  auto require_spec = [&](const std::string& name, const NamedTensor& t) {
    if (t.rows == t.cols)
      require(store, name, {c.size(t.rows)}, dim_name(t.rows).data());
    else
      require(store, name, {c.size(t.rows), c.size(t.cols)}, dims_name(t.rows, t.cols).c_str());
  };
  require_spec(std::string(kEmbedTokens.hf), kEmbedTokens);
  const bool packed_head = quantized && store.find(std::string(kLmHeadQweight)) != nullptr;
  if (!packed_head && (store.find(std::string(kLmHead.hf)) != nullptr || !c.tie_word_embeddings)) {
    if (store.find(std::string(kLmHead.hf)) == nullptr)
      fail("{}: tensor '{}' is missing and config.json tie_word_embeddings is false", store.source(), kLmHead.hf);
    require_spec(std::string(kLmHead.hf), kLmHead);
  }
  require_spec(std::string(kFinalNorm.hf), kFinalNorm);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    require_spec(layer_tensor(l, kAttnNorm.hf), kAttnNorm);
    require_spec(layer_tensor(l, kMlpNorm.hf), kMlpNorm);
    for (const LinearSpec& spec : kBlockLinears)
      if (c.has_bias(spec.bias))
        require(store, linear_tensor(l, spec.role, "bias"), {c.size(spec.rows)}, dim_name(spec.rows).data());
    if (c.qk_norm) {
      require_spec(layer_tensor(l, kQNorm.hf), kQNorm);
      require_spec(layer_tensor(l, kKNorm.hf), kKNorm);
    }
    for (const LinearSpec& spec : kBlockLinears) {
      const std::string weight = linear_tensor(l, spec.role);
      // A quantized checkpoint's linears have no .weight (GPTQ qweight, compressed-tensors weight_packed):
      // their shapes are checked against the config where they are read.
      if (quantized && store.find(weight) == nullptr) continue;
      require(store, weight, {c.size(spec.rows), c.size(spec.cols)}, dims_name(spec.rows, spec.cols).c_str());
    }
  }
}

}  // namespace woq
