#include "io/gguf_model.h"

#include <vector>
#include <algorithm>

#include "core/error.h"
#include "arch/architecture.h"

namespace woq {

namespace {

using namespace config_limits;

// GGUF tensor names (llama.cpp's LLM_TENSOR_NAMES) and the Hugging Face names woq's loader reads, from the
// architecture spec. Per-layer entries have "blk.N." / "model.layers.N." before them.
struct NamePair {
  std::string gguf, hf;
};
const std::vector<NamePair>& global_names() {
  static const std::vector<NamePair> names = [] {
    std::vector<NamePair> v;
    for (const NamedTensor& t : {kEmbedTokens, kFinalNorm, kLmHead})
      v.push_back({std::string(t.gguf), std::string(t.hf)});
    return v;
  }();
  return names;
}
const std::vector<NamePair>& layer_names() {
  static const std::vector<NamePair> names = [] {
    std::vector<NamePair> v;
    for (const NamedTensor& t : {kAttnNorm, kMlpNorm, kQNorm, kKNorm})
      v.push_back({std::string(t.gguf), std::string(t.hf)});
    for (const LinearSpec& l : kBlockLinears)
      v.push_back({fmt::format("{}.weight", l.gguf), fmt::format("{}.weight", l.module)});
    for (const LinearSpec& l : kBlockLinears)
      if (l.bias != LinearBias::kNone) v.push_back({fmt::format("{}.bias", l.gguf), fmt::format("{}.bias", l.module)});
    // Fused projections (Phi-3, ...): mapped so that the loader refuses them by name.
    for (const FusedSpec& f : kFusedProjections)
      for (const std::string_view leaf : {"weight", "bias"})
        v.push_back({fmt::format("{}.{}", f.gguf, leaf), fmt::format("{}.{}", f.module, leaf)});
    return v;
  }();
  return names;
}

// "PREFIX<digits>.REST" -> (digits, REST), or nullopt.
std::optional<std::pair<std::string_view, std::string_view>> split_layer(std::string_view name, std::string_view prefix) {
  if (!name.starts_with(prefix)) return std::nullopt;
  name.remove_prefix(prefix.size());
  const std::size_t dot = name.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 6 || (dot > 1 && name[0] == '0')) return std::nullopt;  // no "blk.00."
  for (std::size_t i = 0; i < dot; ++i)
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
  return std::pair{name.substr(0, dot), name.substr(dot + 1)};
}

std::optional<std::string> map_name(std::string_view name, bool to_hf) {
  for (const NamePair& p : global_names())
    if ((to_hf ? p.gguf : p.hf) == name) return std::string(to_hf ? p.hf : p.gguf);
  const auto layer = split_layer(name, to_hf ? "blk." : "model.layers.");
  if (!layer) return std::nullopt;
  for (const NamePair& p : layer_names())
    if ((to_hf ? p.gguf : p.hf) == layer->second)
      return fmt::format("{}{}.{}", to_hf ? "model.layers." : "blk.", layer->first, to_hf ? p.hf : p.gguf);
  return std::nullopt;
}

// Metadata of the first part, with the checks every size gets.
class Keys {
 public:
  Keys(const GgufFile& g, std::string arch) : g_(g), arch_(std::move(arch)) {}

  std::string key(std::string_view k) const { return fmt::format("{}.{}", arch_, k); }
  [[noreturn]] void error(std::string_view k, const std::string& why) const {
    fail("{}: metadata '{}' {}", g_.path(), key(k), why);
  }
  // ARCH.k as an integer in [1, max]; `fallback` when absent (-1: required).
  std::int64_t positive(std::string_view k, std::int64_t max, std::int64_t fallback = -1) const {
    const std::string full = key(k);
    const GgufValue* v = g_.find(full);
    if (v != nullptr && v->type == GgufValueType::kArray)
      error(k, "is a per-layer array; woq needs one value for every layer");
    const std::optional<std::int64_t> x = g_.get_int(full);
    if (!x) {
      if (fallback < 0) error(k, "is missing");
      return fallback;
    }
    if (*x <= 0 || *x > max) error(k, fmt::format("is {}; woq accepts 1 to {}", *x, max));
    return *x;
  }
  double number(std::string_view k, double fallback) const { return g_.get_float(key(k)).value_or(fallback); }

 private:
  const GgufFile& g_;
  std::string arch_;
};

// The tensors of a GGUF model under their Hugging Face names.
class GgufTensors final : public TensorSource {
 public:
  explicit GgufTensors(const std::string& path) : parts_(shared_gguf(path)), path_(parts_->front().path()) {
    const ModelConfig c = gguf_model_config(*parts_);
    const ArchitectureSpec* spec = find_architecture(c.architecture);
    const std::string_view arch = *parts_->front().get_string("general.architecture");
    // Built when a q/k tensor of the right shape is seen: the config alone may claim
    // heads * head_dim of 2^40 rows, which no tensor in the file can have.
    std::shared_ptr<const std::vector<std::int64_t>> q_order, k_order;
    for (const GgufFile& part : *parts_) {
      for (const GgufTensorInfo& info : part.tensors()) {
        if (info.name == "rope_freqs.weight") continue;  // read into the config
        const std::optional<std::string> hf = hf_tensor_name(info.name);
        if (!hf)
          fail("{}: tensor '{}' is not part of a {} model as woq reads it", part.path(), printable(info.name), arch);
        TensorView t;
        t.name = info.name;
        t.file = part.path();
        t.shape.assign(info.ne.rbegin(), info.ne.rend());
        t.bytes = info.bytes;
        switch (info.type->type) {
          case GgmlType::kF32: t.dtype = DType::kF32; break;
          case GgmlType::kF16: t.dtype = DType::kF16; break;
          case GgmlType::kBF16: t.dtype = DType::kBF16; break;
          case GgmlType::kF64: t.dtype = DType::kF64; break;
          default: t.dtype = DType::kGgml; t.ggml = info.type;
        }
        const bool is_q = is_linear_tensor(*hf, LinearRole::kQ);
        const bool is_k = is_linear_tensor(*hf, LinearRole::kK);
        if (spec->gguf_permute_qk && (is_q || is_k)) {
          // Rows are permuted as a whole: [rows] or [rows, K] only.
          const std::int64_t rows = is_q ? c.q_dim() : c.kv_dim();
          if (t.shape.size() > 2 || t.shape.front() != rows)
            fail("{}: tensor '{}' has shape {}, expected {} rows", part.path(), info.name, t.shape_str(), rows);
          auto& order = is_q ? q_order : k_order;
          if (!order)
            order = std::make_shared<std::vector<std::int64_t>>(
                gguf_qk_row_order(rows, is_q ? c.num_attention_heads : c.num_key_value_heads));
          t.row_order = order;
        }
        tensors_.emplace(*hf, std::move(t));
      }
    }
  }
  const std::map<std::string, TensorView>& tensors() const override { return tensors_; }
  const std::string& path() const override { return path_; }

 private:
  std::shared_ptr<const std::vector<GgufFile>> parts_;
  std::string path_;
  std::map<std::string, TensorView> tensors_;
};

}  // namespace

std::unique_ptr<TensorSource> open_gguf_tensors(const std::string& path) { return std::make_unique<GgufTensors>(path); }

std::optional<std::string> hf_tensor_name(std::string_view gguf_name) { return map_name(gguf_name, true); }
std::optional<std::string> gguf_tensor_name(std::string_view hf_name) { return map_name(hf_name, false); }

ModelConfig gguf_model_config(const std::vector<GgufFile>& parts) {
  const GgufFile& g = parts.front();
  auto find_tensor = [&](std::string_view name) -> const GgufTensorInfo* {
    for (const GgufFile& p : parts)
      if (const GgufTensorInfo* t = p.find_tensor(name)) return t;
    return nullptr;
  };
  const std::optional<std::string_view> arch = g.get_string("general.architecture");
  if (!arch) fail("{}: metadata 'general.architecture' is missing", g.path());
  const ArchitectureSpec* spec = find_gguf_architecture(*arch);
  if (spec == nullptr)
    fail("{}: metadata 'general.architecture' is '{}'; woq runs {}", g.path(), printable(*arch),
         supported_gguf_architectures());
  const Keys k(g, std::string(*arch));
  if (const auto experts = g.get_int(k.key("expert_count")); experts && *experts > 0)
    k.error("expert_count", fmt::format("is {}: mixture-of-experts models are not supported", *experts));

  ModelConfig c;
  c.numerics = Numerics::kGgml;  // llama.cpp's rounding, for its logits on the same file
  c.architecture = std::string(spec->architecture);
  c.hidden_size = k.positive("embedding_length", kMaxDim);
  c.intermediate_size = k.positive("feed_forward_length", kMaxDim);
  c.num_hidden_layers = k.positive("block_count", kMaxLayers);
  c.num_attention_heads = k.positive("attention.head_count", kMaxDim);
  c.num_key_value_heads = k.positive("attention.head_count_kv", kMaxDim, c.num_attention_heads);
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    k.error("attention.head_count_kv", fmt::format("({}) does not divide attention.head_count ({})",
                                                   c.num_key_value_heads, c.num_attention_heads));
  if (!g.find(k.key("attention.key_length")) && c.hidden_size % c.num_attention_heads != 0)
    k.error("attention.head_count", fmt::format("({}) does not divide embedding_length ({}) and there is no "
                                                "attention.key_length", c.num_attention_heads, c.hidden_size));
  c.head_dim = k.positive("attention.key_length", kMaxDim, c.hidden_size / c.num_attention_heads);
  if (k.positive("attention.value_length", kMaxDim, c.head_dim) != c.head_dim)
    k.error("attention.value_length", "differs from attention.key_length; woq needs them equal");
  if (c.head_dim % 2 != 0) k.error("attention.key_length", fmt::format("({}) must be even for RoPE", c.head_dim));
  if (k.positive("rope.dimension_count", kMaxDim, c.head_dim) != c.head_dim)
    k.error("rope.dimension_count", fmt::format("differs from the head size {}: partial rotary is not supported", c.head_dim));
  c.max_position_embeddings = k.positive("context_length", kMaxPositions, c.max_position_embeddings);
  c.rms_norm_eps = k.number("attention.layer_norm_rms_epsilon", 1e-5);
  if (!(c.rms_norm_eps > 0 && c.rms_norm_eps <= 0.1))
    k.error("attention.layer_norm_rms_epsilon", fmt::format("must be in (0, 0.1], got {}", c.rms_norm_eps));
  c.rope_theta = k.number("rope.freq_base", 10000.0);
  if (!(c.rope_theta > 1 && c.rope_theta < 1e12))
    k.error("rope.freq_base", fmt::format("must be in (1, 1e12), got {}", c.rope_theta));

  const std::string scaling(g.get_string(k.key("rope.scaling.type")).value_or("none"));
  if (scaling == "linear") {
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    c.rope_scaling.factor = k.number("rope.scaling.factor", 1.0);
    if (!(c.rope_scaling.factor >= 1.0 && c.rope_scaling.factor <= 1024.0))
      k.error("rope.scaling.factor", fmt::format("must be in [1, 1024], got {}", c.rope_scaling.factor));
  } else if (scaling != "none") {
    k.error("rope.scaling.type", fmt::format("is '{}'; woq supports none and linear (llama3 scaling comes as the "
                                             "rope_freqs tensor)", printable(scaling)));
  }
  if (const GgufTensorInfo* f = find_tensor("rope_freqs.weight")) {
    const std::int64_t half = c.head_dim / 2;
    if (f->ne.size() != 1 || f->ne[0] != half || f->type->type != GgmlType::kF32)
      fail("{}: tensor 'rope_freqs.weight' must be F32 [{}] (head size / 2)", g.path(), half);
    if (c.rope_scaling.type != RopeScaling::Type::kNone)
      fail("{}: both rope.scaling.type {} and a rope_freqs tensor", g.path(), scaling);
    c.rope_scaling.type = RopeScaling::Type::kFactors;
    c.rope_scaling.freq_factors.resize(static_cast<std::size_t>(half));
    f->type->to_float(f->bytes.data(), c.rope_scaling.freq_factors.data(), half);
    for (std::size_t i = 0; i < c.rope_scaling.freq_factors.size(); ++i) {
      const float v = c.rope_scaling.freq_factors[i];
      if (!(v >= 1e-6f && v <= 1e6f)) fail("{}: tensor 'rope_freqs.weight'[{}] is {}; factors must be positive", g.path(), i, v);
    }
  }

  // The vocabulary: the tokenizer's tokens (llama.cpp's n_vocab); token_embd must match it.
  const std::vector<std::string_view>* tokens = g.get_strings("tokenizer.ggml.tokens");
  const GgufTensorInfo* embed = find_tensor("token_embd.weight");
  if (tokens != nullptr) {
    c.vocab_size = static_cast<std::int64_t>(tokens->size());
  } else if (embed != nullptr && embed->ne.size() == 2) {
    c.vocab_size = embed->ne[1];
  } else {
    fail("{}: neither metadata 'tokenizer.ggml.tokens' nor tensor 'token_embd.weight' gives the vocabulary size", g.path());
  }
  if (c.vocab_size <= 0 || c.vocab_size > kMaxVocab)
    fail("{}: a vocabulary of {} tokens; woq accepts 1 to {}", g.path(), c.vocab_size, kMaxVocab);
  c.tie_word_embeddings = find_tensor("output.weight") == nullptr;
  if (spec->qkv_bias) {
    c.attention_bias = true;
  } else if (spec->attention_bias_field) {
    c.attention_bias = find_tensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = find_tensor("blk.0.attn_output.bias") != nullptr;
  }
  c.qk_norm = spec->qk_norm;

  auto token = [&](std::string_view key) { return gguf_token_id(g, key, c.vocab_size).value_or(-1); };
  c.bos_token_id = token("bos_token_id");
  // llama.cpp stops on EOS and on EOT / EOM where the file names them (Llama 3's <|eot_id|>, <|eom_id|>).
  for (const char* key : {"eos_token_id", "eot_token_id", "eom_token_id"}) {
    const std::int64_t id = token(key);
    if (id >= 0 && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(id);
  }
  c.warnings = gguf_token_id_warnings(g, c.vocab_size);
  return c;
}

std::vector<std::int64_t> gguf_qk_row_order(std::int64_t rows, std::int64_t n_head) {
  if (n_head <= 0 || rows <= 0 || rows % n_head != 0 || (rows / n_head) % 2 != 0)
    fail("a q/k projection of {} rows cannot be split into {} heads of even size", rows, n_head);
  const std::int64_t hd = rows / n_head, half = hd / 2;
  std::vector<std::int64_t> order(static_cast<std::size_t>(rows));
  for (std::int64_t h = 0; h < n_head; ++h)
    for (std::int64_t j = 0; j < 2; ++j)
      for (std::int64_t i = 0; i < half; ++i)
        order[static_cast<std::size_t>(h * hd + j * half + i)] = h * hd + 2 * i + j;
  return order;
}

}  // namespace woq
