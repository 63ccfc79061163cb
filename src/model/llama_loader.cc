// LlamaModel::load: from a Hugging Face checkpoint directory to weights in
// woq's formats.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "core/error.h"
#include "core/mmap_file.h"
#include "io/quantized_checkpoint.h"
#include "kernels/matmul.h"
#include "io/safetensors.h"
#include "model/llama.h"

namespace woq {

namespace {

// Checks that `t` has exactly `shape`, naming the config fields it comes from.
void expect_shape(const TensorView& t, const std::vector<std::int64_t>& shape, const char* from) {
  require_shape(t, shape, fmt::format("from config.json {}", from));
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  tensor_to_f32(t, out.data());
  return out;
}

// The unquantized format matching a checkpoint dtype.
LowBit float_format(const TensorView& t) {
  switch (t.dtype) {
    case DType::kF16: return LowBit::kFp16;
    case DType::kBF16: return LowBit::kBf16;
    default: return LowBit::kFp32;
  }
}

// Converts a [rows, cols] tensor row by row straight from the mapping, then
// releases its pages, so loading holds about one tensor of the checkpoint resident.
QuantMatrix load_matrix(const TensorView& t, std::int64_t rows, std::int64_t cols, const char* from,
                        const QuantSpec& spec, ThreadPool& pool) {
  expect_shape(t, {rows, cols}, from);
  require_float_dtype(t);
  const RowReader read = [&t, cols](std::int64_t r, float* out) { tensor_to_f32(t, out, r * cols, cols); };
  try {
    QuantMatrix w = quantize_matrix(read, rows, cols, spec, &pool);
    release_pages(t.bytes);
    return w;
  } catch (const Error& e) {
    fail("{}: tensor '{}': {}", t.file, t.name, e.what());
  }
}

std::vector<float> load_vector(const TensorStore& store, const std::string& name, std::int64_t n,
                               const char* from) {
  const TensorView& t = store.get(name);
  expect_shape(t, {n}, from);
  std::vector<float> v = to_f32(t);
  for (std::size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(v[i])) fail("{}: tensor '{}' holds {} at index {}", t.file, t.name, v[i], i);
  return v;
}

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
    if (std::stoll(index) >= c.num_hidden_layers)
      refuse(fmt::format("belongs to a layer beyond config.json num_hidden_layers = {}", c.num_hidden_layers));
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

// Sets how an integer-format matrix multiplies its inputs, and lays it out
// for that path's kernels.
void set_activations(QuantMatrix& w, const LoadOptions& options, std::vector<std::string>& used, LoadReport& rep,
                     ThreadPool& pool) {
  if (!is_quantized(w.type)) return;
  w.activations = options.activations.value_or(default_activations(w.type));
  prepare_for_kernels(w, &pool);
  rep.int8_activations |= w.activations == Activations::kInt8;
  const std::string what = fmt::format("{} {}", low_bit_name(w.type), activations_name(w.activations));
  if (std::find(used.begin(), used.end(), what) == used.end()) used.push_back(what);
}

}  // namespace

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& dir, const LoadOptions& options,
                                             ThreadPool& pool, LoadReport* report) {
  const auto start = std::chrono::steady_clock::now();
  ModelConfig config = read_model_config(dir);
  const TensorStore store = TensorStore::open_dir(dir);
  const std::optional<QuantizationConfig> quantized = read_quantization_config(dir);
  check_tensor_names(store, config);
  std::unique_ptr<LlamaModel> m(new LlamaModel(std::move(config), pool));
  const ModelConfig& c = m->config_;
  LoadReport rep;

  std::vector<std::string> activations_used;  // "sym_int4 int8", ...
  const TensorView& embed = store.get("model.embed_tokens.weight");
  const QuantSpec keep{float_format(embed), 0, Int4Range::kFull};
  m->embed_ = load_matrix(embed, c.vocab_size, c.hidden_size, "vocab_size, hidden_size", keep, pool);
  rep.other_bytes += m->embed_.bytes();
  const TensorView* head = store.find("lm_head.weight");
  if (!c.tie_word_embeddings && head == nullptr)
    fail("{}: tensor 'lm_head.weight' is missing and config.json tie_word_embeddings is false",
         store.source());
  const TensorView& head_src = head != nullptr ? *head : embed;
  if (head != nullptr || options.lm_head) {
    const QuantSpec spec = options.lm_head.value_or(QuantSpec{float_format(head_src), 0, Int4Range::kFull});
    m->lm_head_ = std::make_unique<QuantMatrix>(
        load_matrix(head_src, c.vocab_size, c.hidden_size, "vocab_size, hidden_size", spec, pool));
    set_activations(*m->lm_head_, options, activations_used, rep, pool);
    (options.lm_head ? rep.lm_head_bytes : rep.other_bytes) += m->lm_head_->bytes();
  }
  m->final_norm_ = load_vector(store, "model.norm.weight", c.hidden_size, "hidden_size");
  rep.other_bytes += m->final_norm_.size() * sizeof(float);

  auto linear = [&](const std::string& name, std::int64_t rows, std::int64_t cols, const char* from) {
    if (quantized) {
      const std::string prefix = name.substr(0, name.size() - std::string_view(".weight").size());
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<QuantMatrix> w = load_quantized_linear(store, *quantized, prefix, rows, cols, rep.warnings, &pool);
      rep.repack_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (w) {
        set_activations(*w, options, activations_used, rep, pool);
        rep.linear_imported_bytes += w->bytes();
        ++rep.linear_imported;
        return std::move(*w);
      }
      if (store.find(name) == nullptr)
        fail("{}: no tensor for '{}': neither GPTQ '{}.qweight', compressed-tensors '{}.weight_packed' nor float '{}'",
             store.source(), prefix, prefix, prefix, name);
    }
    const TensorView& t = store.get(name);
    if (rep.source_dtype.empty()) rep.source_dtype = std::string(dtype_name(t.dtype));
    rep.linear_source_bytes += t.bytes.size();
    QuantMatrix w = load_matrix(t, rows, cols, from, options.linear, pool);
    set_activations(w, options, activations_used, rep, pool);
    rep.linear_bytes += w.bytes();
    ++rep.linear_matrices;
    return w;
  };
  const std::int64_t h = c.hidden_size;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    LayerWeights w;
    w.attn_norm = load_vector(store, p + "input_layernorm.weight", h, "hidden_size");
    w.mlp_norm = load_vector(store, p + "post_attention_layernorm.weight", h, "hidden_size");
    rep.other_bytes += 2 * static_cast<std::uint64_t>(h) * sizeof(float);
    w.wq = linear(p + "self_attn.q_proj.weight", c.q_dim(), h, "num_attention_heads * head_dim, hidden_size");
    w.wk = linear(p + "self_attn.k_proj.weight", c.kv_dim(), h, "num_key_value_heads * head_dim, hidden_size");
    w.wv = linear(p + "self_attn.v_proj.weight", c.kv_dim(), h, "num_key_value_heads * head_dim, hidden_size");
    w.wo = linear(p + "self_attn.o_proj.weight", h, c.q_dim(), "hidden_size, num_attention_heads * head_dim");
    if (c.attention_bias) {
      w.bq = load_vector(store, p + "self_attn.q_proj.bias", c.q_dim(), "num_attention_heads * head_dim");
      w.bk = load_vector(store, p + "self_attn.k_proj.bias", c.kv_dim(), "num_key_value_heads * head_dim");
      w.bv = load_vector(store, p + "self_attn.v_proj.bias", c.kv_dim(), "num_key_value_heads * head_dim");
      rep.other_bytes += (w.bq.size() + w.bk.size() + w.bv.size()) * sizeof(float);
    }
    if (c.o_bias) {
      w.bo = load_vector(store, p + "self_attn.o_proj.bias", h, "hidden_size");
      rep.other_bytes += w.bo.size() * sizeof(float);
    }
    if (c.qk_norm) {
      w.q_norm = load_vector(store, p + "self_attn.q_norm.weight", c.head_dim, "head_dim");
      w.k_norm = load_vector(store, p + "self_attn.k_norm.weight", c.head_dim, "head_dim");
      rep.other_bytes += 2 * static_cast<std::uint64_t>(c.head_dim) * sizeof(float);
    }
    w.gate = linear(p + "mlp.gate_proj.weight", c.intermediate_size, h, "intermediate_size, hidden_size");
    w.up = linear(p + "mlp.up_proj.weight", c.intermediate_size, h, "intermediate_size, hidden_size");
    w.down = linear(p + "mlp.down_proj.weight", h, c.intermediate_size, "hidden_size, intermediate_size");
    m->layers_.push_back(std::move(w));
  }
  if (quantized) rep.imported_format = quantized->describe();
  for (const std::string& a : activations_used) rep.activations += (rep.activations.empty() ? "" : ", ") + a;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (report != nullptr) *report = rep;
  return m;
}

}  // namespace woq
