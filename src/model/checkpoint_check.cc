#include "model/checkpoint_check.h"

#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"

namespace woq {

namespace {

// Refuses tensors the model would not use: layers beyond config.json's
// num_hidden_layers, fused q/k/v (Phi-3 style qkv_proj) or gate/up
// projections, biases or q/k norms the configured architecture lacks (a Qwen
// checkpoint labelled Llama), or anything else unknown. Silently ignoring a
// tensor gives wrong output; transformers' rotary_emb.inv_freq buffers are the
// one thing skipped.
void check_tensor_names(const TensorStore& store, const ModelConfig& c) {
  static const std::set<std::string, std::less<>> kLinearParts = {
      "weight", "qweight", "qzeros", "scales", "g_idx",  // float, GPTQ
      "weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx"};  // compressed-tensors
  for (const auto& name : store.names()) {
    if (name == "model.embed_tokens.weight" || name == "model.norm.weight" || name == "lm_head.weight") continue;
    auto refuse = [&](const std::string& why) { fail("{}: tensor '{}' {}", store.source(), name, why); };
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
    if (part.find(".qkv_proj.") != std::string::npos || part.find("qkv_proj.") == 0 ||
        part.find(".gate_up_proj.") != std::string::npos)
      refuse("is a fused projection; woq reads separate q/k/v_proj and gate/up_proj");
    if (part == "input_layernorm.weight" || part == "post_attention_layernorm.weight" ||
        part == "self_attn.rotary_emb.inv_freq")
      continue;
    const std::size_t last = part.rfind('.');
    const std::string module = part.substr(0, last), leaf = last == std::string::npos ? "" : part.substr(last + 1);
    const bool qkv = module == "self_attn.q_proj" || module == "self_attn.k_proj" || module == "self_attn.v_proj";
    const bool linear = qkv || module == "self_attn.o_proj" || module == "mlp.gate_proj" || module == "mlp.up_proj" ||
                        module == "mlp.down_proj";
    if (linear && kLinearParts.contains(leaf)) continue;
    if (linear && leaf == "bias") {
      if ((qkv && c.attention_bias) || (module == "self_attn.o_proj" && c.o_bias)) continue;
      refuse(fmt::format("is a bias that {} as config.json describes it does not have (attention_bias {})",
                         c.architecture, c.attention_bias ? "true" : "false"));
    }
    if (part == "self_attn.q_norm.weight" || part == "self_attn.k_norm.weight") {
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
  const std::int64_t h = c.hidden_size;
  require(store, "model.embed_tokens.weight", {c.vocab_size, h}, "vocab_size, hidden_size");
  if (store.find("lm_head.weight") != nullptr || !c.tie_word_embeddings) {
    if (store.find("lm_head.weight") == nullptr)
      fail("{}: tensor 'lm_head.weight' is missing and config.json tie_word_embeddings is false", store.source());
    require(store, "lm_head.weight", {c.vocab_size, h}, "vocab_size, hidden_size");
  }
  require(store, "model.norm.weight", {h}, "hidden_size");
  struct Linear {
    const char* name;
    std::int64_t rows, cols;
    const char* from;
  };
  const Linear linears[] = {
      {"self_attn.q_proj", c.q_dim(), h, "num_attention_heads * head_dim, hidden_size"},
      {"self_attn.k_proj", c.kv_dim(), h, "num_key_value_heads * head_dim, hidden_size"},
      {"self_attn.v_proj", c.kv_dim(), h, "num_key_value_heads * head_dim, hidden_size"},
      {"self_attn.o_proj", h, c.q_dim(), "hidden_size, num_attention_heads * head_dim"},
      {"mlp.gate_proj", c.intermediate_size, h, "intermediate_size, hidden_size"},
      {"mlp.up_proj", c.intermediate_size, h, "intermediate_size, hidden_size"},
      {"mlp.down_proj", h, c.intermediate_size, "hidden_size, intermediate_size"}};
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    require(store, p + "input_layernorm.weight", {h}, "hidden_size");
    require(store, p + "post_attention_layernorm.weight", {h}, "hidden_size");
    if (c.attention_bias) {
      require(store, p + "self_attn.q_proj.bias", {c.q_dim()}, "num_attention_heads * head_dim");
      require(store, p + "self_attn.k_proj.bias", {c.kv_dim()}, "num_key_value_heads * head_dim");
      require(store, p + "self_attn.v_proj.bias", {c.kv_dim()}, "num_key_value_heads * head_dim");
    }
    if (c.o_bias) require(store, p + "self_attn.o_proj.bias", {h}, "hidden_size");
    if (c.qk_norm) {
      require(store, p + "self_attn.q_norm.weight", {c.head_dim}, "head_dim");
      require(store, p + "self_attn.k_norm.weight", {c.head_dim}, "head_dim");
    }
    for (const Linear& lin : linears) {
      const std::string weight = p + lin.name + ".weight";
      // A quantized checkpoint's linears have no .weight (GPTQ qweight, compressed-tensors weight_packed):
      // their shapes are checked against the config where they are read.
      if (quantized && store.find(weight) == nullptr) continue;
      require(store, weight, {lin.rows, lin.cols}, lin.from);
    }
  }
}

}  // namespace woq
