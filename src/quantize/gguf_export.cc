#include "quantize/gguf_export.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include <fmt/ranges.h>

#include "core/error.h"
#include "core/half.h"
#include "formats/format_traits.h"
#include "formats/ggml_types.h"
#include "formats/kquant.h"
#include "formats/kquant_mix.h"
#include "formats/sym_int4.h"
#include "formats/sym_int8.h"
#include "arch/architecture.h"
#include "io/gguf_model.h"
#include "io/gguf_writer.h"
#include "io/hf_config.h"
#include "io/quantized_checkpoint.h"
#include "io/safetensors.h"
#include "model/checkpoint_check.h"
#include "model/llama.h"
#include "quantize/quantize_checkpoint.h"
#include "tokenizer/gguf_vocab_writer.h"

namespace woq {

namespace {

// The GGUF type of a model stored all in `type`, and llama's file type for it.
const FormatTraits& gguf_format(LowBit type) {
  const FormatTraits& f = format_traits(type);
  if (!f.ggml || !f.llama_ftype) {
    std::string mixes;
    for (const kquant::Mix& m : kquant::mixes()) mixes += fmt::format(", {}", m.name);
    fail("GGUF output: --low-bit {} has no GGUF file type (sym_int4 = Q4_0, sym_int8 = Q8_0, q4_1, q5_1, fp16, bf16, "
         "fp32, or llama-quantize's K-quant types{})", f.name, mixes);
  }
  return f;
}

GgmlType ggml_type_of(LowBit type) { return *gguf_format(type).ggml; }

// The integer block types of 32 a single --low-bit writes (Q4_0, Q8_0, Q4_1, Q5_1): K must be a multiple of 32,
// and embeddings and output stay F16 beside them.
bool is_block32(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1;
}

// Encodes fp32 row x[0, k) as `type` into out (ggml_row_bytes(type, k) bytes):
// woq rounding writes Q4_0/Q8_0 blocks equal to woq's sym_int4/sym_int8 g32,
// every other case is ggml's from_float_ref (llama-quantize's bytes).
void encode_row(const float* x, std::int64_t k, GgmlType type, Rounding rounding, std::uint8_t* out) {
  if (rounding == Rounding::kWoq && type == GgmlType::kQ4_0) {
    std::vector<std::uint8_t> q(static_cast<std::size_t>(k / 2));
    std::vector<std::uint16_t> scales(static_cast<std::size_t>(k / ggml::kQK));
    sym_int4::quantize_row(x, k, ggml::kQK, Int4Range::kFull, q.data(), scales.data());
    return ggml::q4_0_from_sym_int4(q.data(), scales.data(), k, out);
  }
  if (rounding == Rounding::kWoq && type == GgmlType::kQ8_0) {
    std::vector<std::int8_t> q(static_cast<std::size_t>(k));
    std::vector<std::uint16_t> scales(static_cast<std::size_t>(k / ggml::kQK));
    sym_int8::quantize_row(x, k, ggml::kQK, q.data(), scales.data());
    return ggml::q8_0_from_sym_int8(q.data(), scales.data(), k, out);
  }
  const GgmlTypeTraits& t = ggml_type_traits(type);
  if (t.from_float == nullptr) fail("GGUF output: cannot encode {}", t.name);
  t.from_float(x, k, out);
}

}  // namespace

std::uint32_t gguf_file_type(LowBit type) { return *gguf_format(type).llama_ftype; }

namespace {

void check_output_path(const std::string& in, const std::string& out, bool force) {
  namespace fs = std::filesystem;
  if (!is_gguf_path(out)) fail("{}: a GGUF output file name must end in .gguf", out);
  if (gguf_split_paths_pattern(out))
    fail("{}: woq writes one file, and a name ending in -NNNNN-of-NNNNN.gguf reads as a part of a split set", out);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out)) && !force) fail("{}: already exists (pass --force to replace it)", out);
  if (fs::exists(out) && fs::equivalent(in, out, ec)) fail("{}: the output is the input", out);
  if (fs::is_directory(out)) fail("{}: is a directory", out);
}

// llama.cpp's general.* and <arch>.* keys for config c.
void write_metadata(GgufWriter& w, const std::string& in, const ModelConfig& c, const ArchitectureSpec& spec,
                    std::uint32_t file_type) {
  namespace fs = std::filesystem;
  const std::string arch(spec.gguf_architecture);
  auto key = [&](std::string_view k) { return fmt::format("{}.{}", arch, k); };
  auto u32 = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  w.set_string("general.architecture", arch);
  const fs::path in_path(in);
  std::string model_name = (in_path.has_filename() ? in_path.filename() : in_path.parent_path().filename()).string();
  if (is_gguf_path(in))
    model_name = GgufFile(gguf_split_paths(in).front()).get_string("general.name").value_or(model_name);
  w.set_string("general.name", model_name);
  w.set_u32("general.file_type", file_type);
  w.set_u32("general.quantization_version", 2);
  w.set_u32(key("vocab_size"), u32(c.vocab_size));
  w.set_u32(key("context_length"), u32(c.max_position_embeddings));
  w.set_u32(key("embedding_length"), u32(c.hidden_size));
  w.set_u32(key("block_count"), u32(c.num_hidden_layers));
  w.set_u32(key("feed_forward_length"), u32(c.intermediate_size));
  w.set_u32(key("rope.dimension_count"), u32(c.head_dim));
  w.set_u32(key("attention.head_count"), u32(c.num_attention_heads));
  w.set_u32(key("attention.head_count_kv"), u32(c.num_key_value_heads));
  w.set_u32(key("attention.key_length"), u32(c.head_dim));
  w.set_u32(key("attention.value_length"), u32(c.head_dim));
  w.set_f32(key("rope.freq_base"), static_cast<float>(c.rope_theta));
  w.set_f32(key("attention.layer_norm_rms_epsilon"), static_cast<float>(c.rms_norm_eps));
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    w.set_string(key("rope.scaling.type"), "linear");
    w.set_f32(key("rope.scaling.factor"), static_cast<float>(c.rope_scaling.factor));
  }
}

// One tensor to write: its source rows (a stored tensor, or a GPTQ linear's
// stand-in with the config's shape), its type, and the GGUF row order.
struct TensorPlan {
  TensorView t;  // copied: a stand-in lives only as long as add(), the writer runs later
  GgmlType type;
  std::int64_t k = 0, rows = 0;
  std::vector<std::int64_t> hf_row;  // GGUF row g holds HF row hf_row[g]; empty: the same order
  std::string prefix;                // "model.layers.L.self_attn.q_proj"
  bool linear = false;
};

// Adds the tensors of a model to a GgufWriter: rows read in Hugging Face
// order, written in GGUF order. A GPTQ / compressed-tensors linear has no
// `.weight`: it stands in with the config's shape, and its rows come from the
// dequantized checkpoint.
class GgufTensorExporter {
 public:
  GgufTensorExporter(const ModelConfig& c, const ArchitectureSpec& spec, const TensorStore& store,
                     const std::optional<QuantizationConfig>& quantized, const GgufExportOptions& options,
                     ThreadPool& pool, GgufExportReport& report, GgufWriter& w)
      : c_(c), spec_(spec), store_(store), quantized_(quantized), options_(options), pool_(pool), report_(report),
        w_(w), stored_names_(quantized ? store.names() : std::vector<std::string>{}) {}

  // Adds HF tensor `hf` as `type`; a linear's `shape` (rows, K) stands in for a quantized one.
  void add(const std::string& hf, GgmlType type, bool linear, std::pair<std::int64_t, std::int64_t> shape = {}) {
    TensorPlan p;
    p.t = quantized_ && linear && store_.find(hf) == nullptr ? stand_in(hf, shape) : store_.get(hf);
    const std::string name = *gguf_tensor_name(hf);
    p.k = p.t.shape.back();
    p.rows = p.t.numel() / p.k;
    p.linear = linear;
    report_.bytes_before += p.t.bytes.size();
    p.type = checked_type(name, p.k, type);
    report_.bytes_after += static_cast<std::uint64_t>(p.rows * ggml_row_bytes(ggml_type_traits(p.type), p.k));
    if (linear) count_linear(p.type);
    if (p.t.ggml != nullptr) note_ggml_source(*p.t.ggml, p.type);
    p.hf_row = gguf_row_order(hf, p.t);
    p.prefix = hf.substr(0, hf.rfind('.'));
    std::vector<std::int64_t> ne(p.t.shape.rbegin(), p.t.shape.rend());
    w_.add_tensor(name, ne, p.type, [this, p = std::move(p)](std::span<std::uint8_t> dst) { encode(p, dst); });
  }

 private:
  TensorView stand_in(const std::string& hf, std::pair<std::int64_t, std::int64_t> shape) {
    TensorView t;
    t.name = hf;
    t.file = store_.source();
    t.shape = {shape.first, shape.second};
    const std::string stored = hf.substr(0, hf.rfind('.') + 1);  // "model.layers.L.self_attn.q_proj."
    for (const std::string& name : stored_names_)
      if (name.starts_with(stored) && !name.ends_with(".bias")) report_.bytes_before += store_.get(name).bytes.size();
    return t;
  }

  void count_linear(GgmlType type) {
    ++report_.matrices;
    const std::string name(ggml_type_traits(type).name);
    for (auto& [n, count] : report_.linear_types)
      if (n == name) return static_cast<void>(++count);
    report_.linear_types.emplace_back(name, 1);
  }

  // `type`, or F16 where Q4_0/Q8_0/Q4_1/Q5_1 blocks cannot hold K (as llama.cpp falls back).
  GgmlType checked_type(const std::string& name, std::int64_t k, GgmlType type) {
    if (is_block32(type) && k % ggml::kQK != 0) {
      report_.notes.push_back(fmt::format("{}: K = {} is not a multiple of 32, which {} blocks need; written as F16",
                                          name, k, ggml_type_traits(type).name));
      return GgmlType::kF16;
    }
    return type;
  }

  void note_ggml_source(const GgmlTypeTraits& source, GgmlType type) {
    const std::string note =
        source.type == type
            ? fmt::format("{} tensors of the input are copied as stored (no rounding)", source.name)
            : fmt::format("{} tensors of the input are dequantized and rounded again to {} (a second rounding)",
                          source.name, ggml_type_traits(type).name);
    if (std::find(report_.notes.begin(), report_.notes.end(), note) == report_.notes.end())
      report_.notes.push_back(note);
  }

  // llama's q/k interleave their rotary halves in GGUF (convert_hf_to_gguf.py's permute).
  std::vector<std::int64_t> gguf_row_order(const std::string& hf, const TensorView& t) const {
    std::vector<std::int64_t> hf_row;
    const bool q = is_linear_tensor(hf, LinearRole::kQ);
    const bool kp = is_linear_tensor(hf, LinearRole::kK);
    if (spec_.gguf_permute_qk && (q || kp)) {
      const std::vector<std::int64_t> order =
          gguf_qk_row_order(t.shape.front(), q ? c_.num_attention_heads : c_.num_key_value_heads);
      hf_row.resize(order.size());
      for (std::size_t r = 0; r < order.size(); ++r) hf_row[static_cast<std::size_t>(order[r])] = static_cast<std::int64_t>(r);
    }
    return hf_row;
  }

  // GGUF row g of p (for a permuted 1-D bias: all its elements in GGUF order) into x, as float.
  void read_row(const TensorPlan& p, const std::optional<QuantMatrix>& gptq, std::int64_t g, float* x) const {
    const auto at = [](const std::vector<std::int64_t>& v, std::int64_t i) { return v[static_cast<std::size_t>(i)]; };
    if (p.hf_row.empty()) {
      if (gptq) return dequantize_row(*gptq, g, x);
      return tensor_to_f32(p.t, x, g * p.k, p.k);
    }
    if (p.rows == 1) {  // a 1-D q/k bias moves element by element
      std::vector<float> all(static_cast<std::size_t>(p.k));
      tensor_to_f32(p.t, all.data());
      for (std::int64_t i = 0; i < p.k; ++i) x[i] = all[static_cast<std::size_t>(at(p.hf_row, i))];
      return;
    }
    if (gptq) return dequantize_row(*gptq, at(p.hf_row, g), x);
    tensor_to_f32(p.t, x, at(p.hf_row, g) * p.k, p.k);
  }

  // The writer's callback: p's rows encoded into dst (ggml_row_bytes per row).
  void encode(const TensorPlan& p, std::span<std::uint8_t> dst) const {
    // The same ggml type from a GGUF: its stored bytes are already in GGUF order.
    if (p.t.ggml != nullptr && p.t.ggml->type == p.type) {
      std::memcpy(dst.data(), p.t.bytes.data(), dst.size());
      release_pages(p.t.bytes);
      return;
    }
    std::optional<QuantMatrix> gptq;
    if (quantized_ && p.linear) {
      std::vector<std::string> warnings;
      gptq = load_quantized_linear(store_, *quantized_, p.prefix, p.rows, p.k, warnings, &pool_);
      if (!gptq && p.t.bytes.empty()) store_.get(p.t.name);  // neither quantized nor float: names the missing tensor
    }
    const std::int64_t row_bytes = ggml_row_bytes(ggml_type_traits(p.type), p.k);
    pool_.parallel_for(p.rows, [&](std::int64_t r0, std::int64_t r1) {
      std::vector<float> x(static_cast<std::size_t>(p.k));
      for (std::int64_t g = r0; g < r1; ++g) {
        read_row(p, gptq, g, x.data());
        for (std::int64_t i = 0; i < p.k; ++i)
          if (!std::isfinite(x[static_cast<std::size_t>(i)]))
            fail("{}: tensor '{}' holds {} at row {}, column {}", p.t.file, p.t.name, x[static_cast<std::size_t>(i)],
                 p.hf_row.empty() ? g : p.hf_row[static_cast<std::size_t>(g)], i);
        try {
          encode_row(x.data(), p.k, p.type, options_.rounding, dst.data() + g * row_bytes);
        } catch (const Error& e) {
          fail("{}: tensor '{}' row {}: {}", p.t.file, p.t.name, g, e.what());
        }
      }
    });
    release_pages(p.t.bytes);
  }

  const ModelConfig& c_;
  const ArchitectureSpec& spec_;
  const TensorStore& store_;
  const std::optional<QuantizationConfig>& quantized_;
  const GgufExportOptions& options_;
  ThreadPool& pool_;
  GgufExportReport& report_;
  GgufWriter& w_;
  const std::vector<std::string> stored_names_;
};

// The ggml type of every tensor written: a K-quant mix's rule (llama-quantize's
// per-tensor choice), or one type for the block linears with token_embd and
// output in a GGUF input's own type, else F16 beside integer linears and the
// target type beside float ones.
class TypePlan {
 public:
  TypePlan(const GgufExportOptions& o, const ModelConfig& c, const ArchitectureSpec& spec, bool has_output,
           std::vector<std::string>& notes)
      : mix_(o.mix), plan_(o.plan), rounding_(o.rounding), target_(o.mix ? GgmlType::kF32 : o.plan ? GgmlType::kF16 : ggml_type_of(o.type)),
        notes_(notes) {
    if (plan_) {
      plan_->check_layers(c.num_hidden_layers);
      if (plan_->lm_head() && !has_output)
        fail("{}: lm_head: {} ties its output projection to the embeddings, so the GGUF file has no output tensor "
             "to write in {}; leave lm_head out of the plan", plan_->source, c.architecture,
             spec_name(*plan_->lm_head()));
      if (plan_->embeddings() && !has_output)
        fail("{}: model.embed_tokens: {} ties its output projection to the embeddings, so token_embd is also the "
             "output; leave model.embed_tokens out of the plan", plan_->source, c.architecture);
    }
    model_ = {c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, has_output, spec.gguf_architecture,
              spec.fused_projections};
  }
  std::uint32_t file_type() const {
    return mix_ ? mix_->file_type : gguf_file_type_of(plan_ ? planned(plan_->base, "base", 0) : target_);
  }
  GgmlType linear(LinearRole role, std::int64_t layer, std::int64_t k) {
    if (plan_) return planned(plan_->linear(layer, role), plan_module(layer, role), k);
    if (mix_ == nullptr) return target_;
    return ruled({kquant::MixTensor::kBlockLinear, role, layer, k});
  }
  GgmlType big(const TensorView& t, bool output) {
    if (plan_ && output && plan_->lm_head()) return planned(*plan_->lm_head(), "lm_head", t.shape.back());
    if (plan_ && !output && plan_->embeddings())
      return planned(*plan_->embeddings(), std::string(kEmbeddingsModule), t.shape.back());
    if (mix_ != nullptr)
      return ruled({output ? kquant::MixTensor::kOutput : kquant::MixTensor::kTokenEmbd, LinearRole::kQ, 0,
                    t.shape.back()});
    if (t.ggml != nullptr) return t.ggml->type;
    if (plan_)  // as loaded with the plan: in the input's float type
      return t.dtype == DType::kF32 ? GgmlType::kF32 : t.dtype == DType::kBF16 ? GgmlType::kBF16 : GgmlType::kF16;
    return is_block32(target_) ? GgmlType::kF16 : target_;  // F16 beside integer linears, as for Q4_0
  }
  std::string_view name() const {
    return mix_ ? mix_->llama_name : plan_ ? std::string_view(plan_->source) : ggml_type_traits(target_).name;
  }
  // One note per fallback: which tensors llama-quantize's rule could not give their type, and what they got.
  void note_fallbacks() const {
    for (const Fallback& f : fallbacks_) {
      const std::size_t shown = std::min<std::size_t>(f.tensors.size(), 4);
      const std::string names = fmt::format("{}{}", fmt::join(f.tensors.begin(), f.tensors.begin() +
                                                                  static_cast<std::ptrdiff_t>(shown), ", "),
                                            f.tensors.size() > shown ? ", ..." : "");
      const std::string_view ruled = ggml_type_traits(f.ruled).name, type = ggml_type_traits(f.type).name;
      if (f.ruled == GgmlType::kQ8_0)  // output with K % 32 != 0
        notes_.push_back(fmt::format("{} tensor(s) have a K that is not a multiple of 32 (q8_0's block): written as "
                                     "f16, where llama-quantize stops with 'Unsupported tensor size': {}",
                                     f.tensors.size(), names));
      else
        notes_.push_back(fmt::format("{} tensor(s) have a K that is not a multiple of 256 ({}'s super-block){}, so they "
                                     "are written as {}, as llama-quantize falls back: {}", f.tensors.size(), ruled,
                                     f.type == GgmlType::kF16 ? " nor of 32" : "", type, names));
    }
  }

 private:
  GgmlType ruled(const kquant::MixTensor& t) {
    const kquant::MixChoice choice = kquant::mix_type(*mix_, t, model_);
    if (choice.type != choice.ruled) {
      auto it = std::find_if(fallbacks_.begin(), fallbacks_.end(), [&](const Fallback& f) {
        return f.ruled == choice.ruled && f.type == choice.type;
      });
      if (it == fallbacks_.end()) it = fallbacks_.insert(fallbacks_.end(), {choice.ruled, choice.type, {}});
      it->tensors.push_back(kquant::mix_tensor_name(t));
    }
    return choice.type;
  }
  // The ggml type of a planned format (`module` and K, when known, name the tensor in errors).
  GgmlType planned(const QuantSpec& spec, const std::string& module, std::int64_t k) const {
    const bool q4_0 = spec.type == LowBit::kSymInt4 && spec.group_size == ggml::kQK && spec.int4_range == Int4Range::kFull;
    const bool q8_0 = spec.type == LowBit::kSymInt8 && spec.group_size == ggml::kQK;
    if (!q4_0 && !q8_0 && (is_quantized(spec.type) || !format_traits(spec.type).ggml))
      fail("{}: {}: {} has no GGUF type (Q4_0 = sym_int4 g32, Q8_0 = sym_int8 g32, the K-quants, q4_1, q5_1, fp16, "
           "bf16, fp32); "
           "measure with --candidates gguf for a plan that can be written as GGUF", plan_->source, module,
           spec_name(spec));
    if (is_kquant(spec.type) && k % kquant::find(spec.type)->block != 0)
      fail("{}: {}: {} needs K to be a multiple of {}, K = {}", plan_->source, module, spec_name(spec),
           kquant::find(spec.type)->block, k);
    if ((q4_0 || q8_0) && k % ggml::kQK != 0)
      fail("{}: {}: {} is {} in GGUF, whose blocks need K to be a multiple of 32, K = {}", plan_->source, module,
           spec_name(spec), q4_0 ? "Q4_0" : "Q8_0", k);
    if ((q4_0 || q8_0) && spec.rounding != rounding_)
      fail("{}: {}: the plan rounds {} as {}, the file is written with --rounding {}; give --rounding {}",
           plan_->source, module, spec_name(spec), rounding_name(spec.rounding), rounding_name(rounding_),
           rounding_name(spec.rounding));
    return *format_traits(spec.type).ggml;
  }
  static std::uint32_t gguf_file_type_of(GgmlType t) {
    for (const FormatTraits& f : weight_formats())
      if (f.ggml == t && f.llama_ftype) return *f.llama_ftype;
    return 0;
  }

  // Tensors whose K does not fit the ruled type's blocks, by (ruled, written) type.
  struct Fallback {
    GgmlType ruled, type;
    std::vector<std::string> tensors;
  };

  const kquant::Mix* mix_;
  std::shared_ptr<const QuantPlan> plan_;
  Rounding rounding_;
  GgmlType target_;
  std::vector<Fallback> fallbacks_;
  kquant::MixModel model_;
  std::vector<std::string>& notes_;
};

// Every tensor of the model in llama.cpp's order: token_embd, the blocks, output_norm, output.
void add_model_tensors(GgufTensorExporter& e, const TensorStore& store, const ModelConfig& c, TypePlan& plan) {
  const TensorView& embed = store.get(std::string(kEmbedTokens.hf));
  e.add(std::string(kEmbedTokens.hf), plan.big(embed, false), false);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    e.add(layer_tensor(l, kAttnNorm.hf), GgmlType::kF32, false);
    for (const LinearSpec& linear : kBlockLinears) {
      const auto shape = block_linear_shape(c, linear.role);
      e.add(linear_tensor(l, linear.role), plan.linear(linear.role, l, shape.second), true, shape);
      const std::string bias = linear_tensor(l, linear.role, "bias");
      if (store.find(bias) != nullptr) e.add(bias, GgmlType::kF32, false);
    }
    if (c.qk_norm) {
      e.add(layer_tensor(l, kQNorm.hf), GgmlType::kF32, false);
      e.add(layer_tensor(l, kKNorm.hf), GgmlType::kF32, false);
    }
    e.add(layer_tensor(l, kMlpNorm.hf), GgmlType::kF32, false);
  }
  e.add(std::string(kFinalNorm.hf), GgmlType::kF32, false);
  if (const TensorView* head = store.find(std::string(kLmHead.hf)); head != nullptr && !c.tie_word_embeddings)
    e.add(std::string(kLmHead.hf), plan.big(*head, true), false);
}

}  // namespace

GgufExportReport export_gguf(const std::string& in, const std::string& out, const GgufExportOptions& options,
                             ThreadPool& pool) {
  const auto start = std::chrono::steady_clock::now();
  if (options.mix == nullptr && !options.plan) ggml_type_of(options.type);  // refuses a type GGUF has none for, before reading
  check_output_path(in, out, options.force);

  const ModelConfig c = read_model_config(in);
  require_writable_architecture(in, c);
  const ArchitectureSpec* spec = find_architecture(c.architecture);
  const TensorStore store = TensorStore::open(in);
  const std::optional<QuantizationConfig> quantized = read_quantization_config(in);
  validate_checkpoint(store, c, quantized.has_value());  // what loading the output would refuse, before writing it
  if (quantized && store.find(std::string(kLmHeadQweight)) != nullptr)
    fail("{}: lm_head is stored as GPTQ integers ('{}', quantization_config.lm_head); the GGUF writer takes a float "
         "lm_head (the file would have no output tensor): write the GGUF from the float checkpoint", in,
         kLmHeadQweight);
  GgufExportReport report;
  const bool has_output = store.find(std::string(kLmHead.hf)) != nullptr && !c.tie_word_embeddings;
  TypePlan plan(options, c, *spec, has_output, report.notes);
  if (quantized)
    report.notes.push_back(fmt::format("the {} linear layers were dequantized and rounded again to {}; the result "
                                       "differs from the checkpoint by that second rounding", quantized->describe(),
                                       plan.name()));
  if (c.sliding_window > 0)
    report.notes.push_back(fmt::format("sliding_window {} is not stored: llama.cpp's {} architecture attends to the "
                                       "whole context", c.sliding_window, spec->gguf_architecture));

  GgufWriter w;
  write_metadata(w, in, c, *spec, plan.file_type());
  for (std::string& note : write_gguf_vocab(in, c, w)) report.notes.push_back(std::move(note));
  GgufTensorExporter exporter(c, *spec, store, quantized, options, pool, report, w);
  add_model_tensors(exporter, store, c, plan);
  plan.note_fallbacks();
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3 || c.rope_scaling.type == RopeScaling::Type::kFactors) {
    const std::vector<float> factors = rope_freq_factors(c);
    w.add_tensor("rope_freqs.weight", {static_cast<std::int64_t>(factors.size())}, GgmlType::kF32,
                 [factors](std::span<std::uint8_t> dst) { std::memcpy(dst.data(), factors.data(), dst.size()); });
  }
  w.write(out);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace woq
