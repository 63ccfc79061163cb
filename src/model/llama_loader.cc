// LlamaModel::load: from a Hugging Face checkpoint directory to weights in
// woq's formats.
#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <iterator>
#include <set>
#include <span>

#include <fmt/ranges.h>

#include "arch/architecture.h"
#include "core/error.h"
#include "core/half.h"
#include "core/mmap_file.h"
#include "formats/interleave.h"
#include "formats/kquant.h"
#include "io/fused_projections.h"
#include "io/quantized_checkpoint.h"
#include "kernels/matmul.h"
#include "io/safetensors.h"
#include "model/checkpoint_check.h"
#include "model/llama.h"

namespace woq {

namespace {

// Checks that `t` has exactly `shape`, naming the config fields it comes from.
void expect_shape(const TensorView& t, const std::vector<std::int64_t>& shape, const char* from) {
  require_shape(t, shape, fmt::format("from {} {}", shape_source(t), from));
}

std::vector<float> to_f32(const TensorView& t) {
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  tensor_to_f32(t, out.data());
  return out;
}

// The format a tensor that is not quantized on request keeps: its own
// float format, or for a ggml block type the closest woq format.
QuantSpec keep_format(const TensorView& t) {
  switch (t.dtype) {
    case DType::kF16: return {LowBit::kFp16, 0, Int4Range::kFull};
    case DType::kBF16: return {LowBit::kBf16, 0, Int4Range::kFull};
    case DType::kGgml: return {t.ggml->closest, ggml::kQK, Int4Range::kFull};
    default: return {LowBit::kFp32, 0, Int4Range::kFull};
  }
}

// Whether a block linear of `store` is a quantized ggml tensor (a quantized GGUF file).
bool has_ggml_linears(const TensorStore& store, const ModelConfig& c) {
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& spec : kBlockLinears) {
      const TensorView* t = store.find(linear_tensor(l, spec.role));
      if (t != nullptr && t->dtype == DType::kGgml) return true;
    }
  return false;
}

// A GGUF tensor of a block format kept as stored (kquant.h): its blocks copied row by row, rows in Hugging
// Face order. A NaN or infinite (super-)block scale or min is an error naming the tensor, row and block.
QuantMatrix import_kquant(const TensorView& t, const kquant::Format& format, std::int64_t rows, std::int64_t cols,
                          ThreadPool& pool) {
  QuantMatrix w = allocate_matrix(rows, cols, {format.type, format.block});
  pool.parallel_for(rows, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t stored = t.row_order ? (*t.row_order)[static_cast<std::size_t>(r)] : r;
      const std::span<const std::uint8_t> src = t.stored_row_bytes(stored);
      if (static_cast<std::int64_t>(src.size()) != w.row_bytes)
        fail("{}: tensor '{}' row {} holds {} bytes, expected {}", t.file, t.name, stored, src.size(), w.row_bytes);
      if (const std::int64_t b = kquant::first_nonfinite_scale(format, src.data(), w.groups_per_row); b >= 0)
        fail("{}: tensor '{}' row {} {} {} has a NaN or infinite scale", t.file, t.name, stored,
             format.block == kquant::kSuperBlock ? "super-block" : "block", b);
      std::memcpy(w.data.data() + r * w.row_bytes, src.data(), src.size());
    }
  });
  return w;
}

// GGUF Q4_0 blocks hold woq's sym_int4 (group 32, full range), and Q8_0,
// Q5_0 and IQ4_NL blocks integers in [-127, 127] under one fp16 scale per 32,
// i.e. sym_int8 group 32 (GgmlTypeTraits::to_int8): repacked losslessly, rows
// in Hugging Face order; K-quants are kept as stored (import_kquant). nullopt
// for every other type, and for Q8_0 blocks that hold -128 (outside
// sym_int8's [-127, 127]; ggml's quantizer never writes it).
std::optional<QuantMatrix> import_ggml(const TensorView& t, std::int64_t rows, std::int64_t cols, const char* from,
                                       ThreadPool& pool) {
  if (t.dtype != DType::kGgml) return std::nullopt;
  if (const kquant::Format* format = kquant::find(t.ggml->type)) {
    expect_shape(t, {rows, cols}, from);
    QuantMatrix w = import_kquant(t, *format, rows, cols, pool);
    release_pages(t.bytes);
    return w;
  }
  if (t.ggml->type != GgmlType::kQ4_0 && t.ggml->to_int8 == nullptr) return std::nullopt;
  expect_shape(t, {rows, cols}, from);
  const bool q4 = t.ggml->type == GgmlType::kQ4_0;
  QuantMatrix w = allocate_matrix(rows, cols, {q4 ? LowBit::kSymInt4 : LowBit::kSymInt8, ggml::kQK, Int4Range::kFull});
  std::atomic<bool> representable = true;
  pool.parallel_for(rows, [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const std::int64_t stored = t.row_order ? (*t.row_order)[static_cast<std::size_t>(r)] : r;
      const std::uint8_t* src = t.stored_row_bytes(stored).data();
      std::uint8_t* q = w.data.data() + r * w.row_bytes;
      std::uint16_t* scales = w.scales.data() + r * w.groups_per_row;
      if (q4) {
        ggml::sym_int4_from_q4_0(src, cols, q, scales);
      } else if (!t.ggml->to_int8(src, cols, reinterpret_cast<std::int8_t*>(q), scales)) {
        representable = false;
      }
      for (std::int64_t g = 0; g < w.groups_per_row; ++g)
        if ((scales[g] & 0x7c00) == 0x7c00)
          fail("{}: tensor '{}' row {} block {} has scale {} (NaN or infinite)", t.file, t.name, stored, g,
               fp16_to_fp32(scales[g]));
    }
  });
  release_pages(t.bytes);
  if (!representable) return std::nullopt;
  return w;
}

// One line per ggml type that woq converts instead of using as stored.
void note_conversion(const TensorView& t, const std::string& what, LoadReport& rep) {
  const std::string head = fmt::format("{}: {} tensors", t.file, t.ggml->name);
  for (const std::string& w : rep.warnings)
    if (w.starts_with(head) && w.ends_with(what)) return;
  rep.warnings.push_back(fmt::format("{} (e.g. '{}') {}", head, t.name, what));
}

// What a float block linear (`role` of `layer`, K = cols) is converted to:
// options.linear, or under a K-quant file type the type its rule gives. A
// fallback type whose blocks sym_int8 group 32 holds exactly (q5_0, iq4_nl)
// is written by ggml's quantizer and held so (`via`), as the file would hold
// it; q5_1 is held as its own blocks (kquant.h), as the file holds it.
struct Conversion {
  QuantSpec spec;
  const GgmlTypeTraits* via = nullptr;
  std::string_view file_type;  ///< under a mix: the ggml type llama-quantize's file has ("q4_K")
};

Conversion converted_spec(const LoadOptions& options, const ModelConfig& c, bool has_output,
                          const kquant::MixTensor& tensor, LoadReport& rep) {
  if (options.plan) return {options.plan->linear(tensor.layer, tensor.role), nullptr, {}};
  if (options.mix == nullptr) {
    // q4_1 / q5_1 where K is not a multiple of their blocks of 32: fp16, as woq's GGUF writer leaves such a
    // layer F16 (other formats, K-quants included, refuse it when the matrix is made).
    const kquant::Format* block = kquant::find(options.linear.type);
    if (block == nullptr || block->block == kquant::kSuperBlock || tensor.k % block->block == 0)
      return {options.linear, nullptr, {}};
    const std::string head = fmt::format("--low-bit {}: layers whose K is not a multiple of {} (its blocks)",
                                         block->name, block->block);
    if (std::none_of(rep.warnings.begin(), rep.warnings.end(), [&](const std::string& w) { return w.starts_with(head); }))
      rep.warnings.push_back(fmt::format("{} are kept in fp16, as woq's GGUF files of that type hold them (e.g. {}, "
                                         "K = {})", head, kquant::mix_tensor_name(tensor), tensor.k));
    return {QuantSpec{LowBit::kFp16}, nullptr, {}};
  }
  const ArchitectureSpec& spec = *find_architecture(c.architecture);
  const kquant::MixModel model{c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, has_output,
                               spec.gguf_architecture, spec.fused_projections};
  const kquant::MixChoice choice = kquant::mix_type(*options.mix, tensor, model);
  const GgmlTypeTraits& traits = ggml_type_traits(choice.type);
  if (const kquant::Format* f = kquant::find(choice.type))
    return {QuantSpec{f->type, f->block}, nullptr, traits.name};
  if (choice.type == GgmlType::kF16) return {QuantSpec{LowBit::kFp16}, nullptr, traits.name};
  const QuantSpec q8_0{LowBit::kSymInt8, ggml::kQK, Int4Range::kFull, Rounding::kGgml};
  if (traits.to_int8 == nullptr)  // every fallback type of kquant::mix_type is one of the above
    fail("{}: {} ({}) has no in-memory format", options.mix->llama_name, kquant::mix_tensor_name(tensor), traits.name);
  return {q8_0, &traits, traits.name};
}

// Float tensor t quantized by ggml type `via`'s quantizer and held as the
// sym_int8 group 32 its blocks are (GgmlTypeTraits::to_int8), row by row.
QuantMatrix load_via_ggml(const TensorView& t, std::int64_t rows, std::int64_t cols, const char* from,
                          const GgmlTypeTraits& via, ThreadPool& pool) {
  expect_shape(t, {rows, cols}, from);
  require_float_dtype(t);
  QuantMatrix w = allocate_matrix(rows, cols, {LowBit::kSymInt8, ggml::kQK, Int4Range::kFull});
  pool.parallel_for(rows, [&](std::int64_t r0, std::int64_t r1) {
    std::vector<float> x(static_cast<std::size_t>(cols));
    std::vector<std::uint8_t> blocks(static_cast<std::size_t>(ggml_row_bytes(via, cols)));
    for (std::int64_t r = r0; r < r1; ++r) {
      tensor_to_f32(t, x.data(), r * cols, cols);
      try {
        via.from_float(x.data(), cols, blocks.data());
      } catch (const Error& e) {
        fail("{}: tensor '{}' row {}: {}", t.file, t.name, r, e.what());
      }
      via.to_int8(blocks.data(), cols, reinterpret_cast<std::int8_t*>(w.data.data() + r * w.row_bytes),
                  w.scales.data() + r * w.groups_per_row);
    }
  });
  release_pages(t.bytes);
  return w;
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

// Sets how an integer-format matrix multiplies its inputs and lays it out for
// that path's kernels (ready_for_kernels); notes what it did in `used` and `rep`.
void set_activations(QuantMatrix& w, const LoadOptions& options, std::vector<std::string>& used, LoadReport& rep,
                     ThreadPool& pool, bool ggml_blocks = false) {
  if (is_float_format(w.type)) return;
  const std::string slow = ready_for_kernels(w, options.activations, ggml_blocks, pool);
  if (!slow.empty() && std::find(rep.warnings.begin(), rep.warnings.end(), slow) == rep.warnings.end())
    rep.warnings.push_back(slow);
  rep.rounded_activations |= w.activations != Activations::kF32;
  const std::string what =
      fmt::format("{} {}", low_bit_name(w.type), kquant::activations_label(w.type, w.activations));
  if (std::find(used.begin(), used.end(), what) == used.end()) used.push_back(what);
}

// Counts one more matrix of `format` (first-seen order).
void count_format(std::vector<std::pair<std::string, int>>& counts, const std::string& format) {
  for (auto& [f, n] : counts)
    if (f == format) {
      ++n;
      return;
    }
  counts.emplace_back(format, 1);
}

// What the block linears of `m` are, for the load line and tables: rep.low_bit (their woq formats) and
// rep.label (the imported format and/or the conversion, e.g. "sym_int4 (group_size 32, full range) from F32").
void label_report(LlamaModel& m, const LoadOptions& options, LoadReport& rep) {
  const ModelConfig& c = m.config();
  std::vector<std::string> types;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& spec : kBlockLinears) {
      const std::string t(low_bit_name(m.block_linear(l, spec.role).type));
      if (std::find(types.begin(), types.end(), t) == types.end()) types.push_back(t);
    }
  rep.low_bit = fmt::format("{}", fmt::join(types, ", "));
  // Safetensors / GGUF dtype names (F32, F16, BF16) against woq's (fp32, fp16, bf16).
  std::string stored = rep.source_dtype;
  std::transform(stored.begin(), stored.end(), stored.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (stored == "f32") stored = "fp32";
  if (stored == "f16") stored = "fp16";
  if (options.mix) {
    rep.conversion = fmt::format("{} ({})", options.mix->llama_name, rep.low_bit);
  } else if (options.plan) {
    std::vector<std::pair<std::string, int>> counts;
    for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
      for (const LinearSpec& spec : kBlockLinears) count_format(counts, spec_name(options.plan->linear(l, spec.role)));
    std::vector<std::string> parts;
    for (const auto& [name, n] : counts) parts.push_back(fmt::format("{} x{}", name, n));
    rep.conversion = fmt::format("plan {} ({})", options.plan->source, fmt::join(parts, ", "));
  } else {
    rep.conversion = describe(options.linear);
  }
  const std::string converted = rep.linear_matrices == 0 ? std::string()
                                : stored == low_bit_name(options.linear.type) && !options.plan
                                    ? stored + " as stored"
                                    : fmt::format("{} from {}", rep.conversion, rep.source_dtype);
  rep.label = rep.imported_format.empty() ? converted
              : converted.empty()         ? rep.imported_format
                                          : rep.imported_format + "; the other linears " + converted;
}

// The embedding or lm_head `t` kept in the checkpoint's format: as stored for
// GGUF Q4_0 / Q8_0 / K-quants, else its float format or the closest woq
// format to its ggml type (with a warning).
QuantMatrix keep_tensor(const TensorView& t, const ModelConfig& c, const char* from, ThreadPool& pool, LoadReport& rep) {
  if (std::optional<QuantMatrix> w = import_ggml(t, c.vocab_size, c.hidden_size, from, pool)) return std::move(*w);
  const QuantSpec spec = keep_format(t);
  if (t.dtype == DType::kGgml) {
    note_conversion(t, t.ggml->type == GgmlType::kQ8_0
                           ? std::string("hold -128, outside sym_int8's [-127, 127]: re-rounded to sym_int8 group 32")
                           : fmt::format("converted to {} group {} (woq has no {} kernels; adds that format's "
                                         "rounding)", low_bit_name(spec.type), spec.group_size, t.ggml->name), rep);
    rep.other_converted = true;
  }
  return load_matrix(t, c.vocab_size, c.hidden_size, from, spec, pool);
}

// The float token_embd (`kind` kTokenEmbd) or output (kOutput) `t` in the type llama-quantize's rule gives it
// under options.mix (noted in rep.mixed_other); `ggml`: whether it is held in ggml blocks (int8 activations).
QuantMatrix mixed_tensor(const TensorView& t, kquant::MixTensor::Kind kind, const LoadOptions& options,
                         const ModelConfig& c, bool has_output, ThreadPool& pool, LoadReport& rep, bool& ggml) {
  const std::string from = dims_name(kEmbedTokens.rows, kEmbedTokens.cols);
  const kquant::MixTensor tensor{kind, LinearRole::kQ, 0, c.hidden_size};
  const Conversion conversion = converted_spec(options, c, has_output, tensor, rep);
  QuantMatrix w = conversion.via ? load_via_ggml(t, c.vocab_size, c.hidden_size, from.c_str(), *conversion.via, pool)
                                 : load_matrix(t, c.vocab_size, c.hidden_size, from.c_str(), conversion.spec, pool);
  ggml = conversion.via != nullptr || is_kquant(w.type);
  rep.mixed_other.push_back(fmt::format("{} {}", kquant::mix_tensor_name(tensor), conversion.file_type));
  return w;
}

// Loads the block linears of one model: each as stored (GPTQ / compressed-tensors, GGUF blocks woq runs), kept
// float (a quantized GGUF file's float layers by default), or converted to options.linear / options.mix's type;
// tallies what it did in `rep`.
struct BlockLinearLoader {
  const TensorStore& store;
  const std::optional<QuantizationConfig>& quantized;
  const LoadOptions& options;
  const ModelConfig& c;
  bool has_output;  ///< llama.cpp's file has an output.weight (the mix rule reads it)
  bool keep_float;  ///< float linears beside quantized ones run as stored
  ThreadPool& pool;
  LoadReport& rep;
  std::vector<std::string>& activations_used;
  std::vector<std::pair<std::string, int>> gguf_formats;  ///< GGUF block linears used as stored, per format

  // A layer stored quantized runs as stored: a plan, which names the format of every layer, cannot apply to it.
  void refuse_plan(const std::string& name, const std::string& stored) const {
    if (options.plan)
      fail("{}: '{}' is stored quantized ({}); the plan {} sets the formats float layers are converted to: apply "
           "it to the float original", store.source(), name, stored, options.plan->source);
  }

  QuantMatrix operator()(std::int64_t layer, const LinearSpec& role) {
    if (!options.block_linears) return QuantMatrix{};  // streamed by the caller (calibration)
    const std::string name = linear_tensor(layer, role.role);
    const std::int64_t rows = c.size(role.rows), cols = c.size(role.cols);
    const std::string dims = dims_name(role.rows, role.cols);
    const char* from = dims.c_str();
    if (quantized) {
      const std::string prefix = name.substr(0, name.size() - std::string_view(".weight").size());
      const auto t0 = std::chrono::steady_clock::now();
      std::optional<QuantMatrix> w = load_quantized_linear(store, *quantized, prefix, rows, cols, rep.warnings, &pool);
      rep.repack_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (w) {
        refuse_plan(prefix, quantized->describe());
        set_activations(*w, options, activations_used, rep, pool);
        rep.linear_imported_bytes += w->bytes();
        ++rep.linear_imported;
        return std::move(*w);
      }
      if (store.find(name) == nullptr)
        fail("{}: no tensor for '{}': neither GPTQ / AWQ '{}.qweight', compressed-tensors '{}.weight_packed' nor float '{}'",
             store.source(), prefix, prefix, prefix, name);
    }
    const TensorView& t = store.get(name);
    const auto t0 = std::chrono::steady_clock::now();
    if (std::optional<QuantMatrix> w = import_ggml(t, rows, cols, from, pool)) {
      refuse_plan(t.name, fmt::format("GGUF {}", t.ggml->name));
      rep.repack_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      set_activations(*w, options, activations_used, rep, pool, true);
      rep.linear_imported_bytes += w->bytes();
      ++rep.linear_imported;
      const std::string format = is_kquant(w->type) ? fmt::format("GGUF {}", t.ggml->name)
                                 : fmt::format("GGUF {} (as {} group 32)", t.ggml->name, low_bit_name(w->type));
      count_format(gguf_formats, format);
      return std::move(*w);
    }
    if (keep_float && t.dtype != DType::kGgml) {
      QuantMatrix w = load_matrix(t, rows, cols, from, keep_format(t), pool);
      set_activations(w, options, activations_used, rep, pool);
      rep.linear_kept_float_bytes += w.bytes();
      ++rep.linear_kept_float;
      return w;
    }
    // Q8_0 blocks holding -128 stay 8-bit: sym_int8 group 32, re-rounded. Another ggml type woq does not run as
    // stored (q8_K) becomes its closest woq format unless --low-bit says otherwise (sym_int8 g32).
    const bool q8 = t.dtype == DType::kGgml && t.ggml->type == GgmlType::kQ8_0;
    const bool closest = t.dtype == DType::kGgml && (q8 || options.linear_is_default);
    const Conversion conversion =
        closest ? Conversion{keep_format(t), nullptr, {}}
                : converted_spec(options, c, has_output, {kquant::MixTensor::kBlockLinear, role.role, layer, cols}, rep);
    const QuantSpec& spec = conversion.spec;
    if (t.dtype == DType::kGgml)
      note_conversion(t, q8 ? std::string("hold -128, outside sym_int8's [-127, 127]: dequantized and re-quantized to "
                                          "sym_int8 group 32")
                            : fmt::format("dequantized and re-quantized to {} (woq has no {} kernels; the second "
                                          "rounding adds error: measure it with woq eval compare)",
                                          describe(spec), t.ggml->name), rep);
    if (rep.source_dtype.empty()) rep.source_dtype = std::string(t.type_name());
    rep.linear_source_bytes += t.bytes.size();
    QuantMatrix w = conversion.via ? load_via_ggml(t, rows, cols, from, *conversion.via, pool)
                                   : load_matrix(t, rows, cols, from, spec, pool);
    set_activations(w, options, activations_used, rep, pool, conversion.via != nullptr);
    rep.linear_bytes += w.bytes();
    ++rep.linear_matrices;
    if (std::find(rep.converted_roles.begin(), rep.converted_roles.end(), role.label) == rep.converted_roles.end())
      rep.converted_roles.emplace_back(role.label);
    return w;
  }
};

// lm_head as a GPTQ checkpoint whose config says `lm_head: true` stores it (GPTQModel's quantized lm_head,
// which vLLM reads): its integers as stored, in the format `dynamic` gives the module "lm_head"; nullopt when
// lm_head is float. Throws woq::Error for lm_head integers the config does not announce, an announced lm_head
// without them, a tied lm_head, or LoadOptions::lm_head (woq does not re-quantize stored integers).
std::optional<QuantMatrix> packed_lm_head(const TensorStore& store, const std::optional<QuantizationConfig>& quantized,
                                          const ModelConfig& c, const LoadOptions& options, ThreadPool& pool,
                                          LoadReport& rep) {
  const bool packed = store.find(std::string(kLmHeadQweight)) != nullptr;
  const bool gptq = quantized && quantized->method == QuantizationConfig::Method::kGptq;
  if (!packed && !(gptq && quantized->lm_head)) return std::nullopt;
  const std::string where = store.source();
  if (!gptq)
    fail("{}: tensor '{}' is a GPTQ lm_head, but config.json's quantization_config {}", where, kLmHeadQweight,
         quantized ? "is " + quantized->describe() : std::string("is missing"));
  if (!quantized->lm_head)
    fail("{}: tensor '{}' exists, but config.json's quantization_config.lm_head is not true (GPTQModel and vLLM "
         "read lm_head as float then)", where, kLmHeadQweight);
  if (c.tie_word_embeddings)
    fail("{}: quantization_config.lm_head is true, but config.json's tie_word_embeddings ties lm_head to the "
         "embeddings; a quantized lm_head needs its own tensors", where);
  const bool quantized_head = quantized->for_module(std::string(kLmHeadModule)).has_value();
  if (!packed && quantized_head)
    fail("{}: quantization_config.lm_head is true, but there is no tensor '{}'", where, kLmHeadQweight);
  if (!quantized_head && packed)
    fail("{}: '{}' exists, but config.json's quantization_config (dynamic) keeps 'lm_head' unquantized", where,
         kLmHeadQweight);
  if (!quantized_head) return std::nullopt;  // a "-:lm_head" rule: the float lm_head.weight
  if (options.lm_head)
    fail("{}: lm_head is stored as GPTQ integers ({}); woq runs them as stored and does not round them again: "
         "drop --lm-head-low-bit (or the plan's lm_head)", where, quantized->for_module("lm_head")->describe());
  return load_quantized_linear(store, *quantized, std::string(kLmHeadModule), c.vocab_size, c.hidden_size,
                               rep.warnings, &pool);
}

}  // namespace

std::string ready_for_kernels(QuantMatrix& w, std::optional<Activations> requested, bool ggml_blocks,
                              ThreadPool& pool) {
  if (is_kquant(w.type)) {
    // ggml's block formats take their Q8_K / Q8_1 activations (int8, ggml's), or f32 ones on request.
    const Activations a = requested.value_or(Activations::kInt8);
    const std::string_view blocks = ggml_type_traits(kquant::find(w.type)->activation).name;
    if (a != Activations::kInt8 && a != Activations::kF32)
      fail("--activations {}: {} layers (GGUF {}) take int8 ({}, as llama.cpp) or f32 activations",
           activations_name(a), low_bit_name(w.type), kquant::find(w.type)->block == 32 ? "blocks" : "K-quants",
           blocks);
    w.activations = a;
    return {};
  }
  if (!is_quantized(w.type)) return {};
  // A GGUF file's blocks meet int8 activations by default, as llama.cpp's (Q8_0 blocks of 32) do.
  w.activations = requested.value_or(ggml_blocks ? Activations::kInt8 : default_activations(w.type));
  std::string slow;
  if (w.activations != Activations::kF32 && !can_interleave(w)) {
    // The integer and bf16 kernels need groups of whole 32-blocks: these layers multiply in f32 (and say so).
    slow = fmt::format(
        "group_size {} is not a multiple of 32: {} layers with it take the f32 kernels instead of the {} ones "
        "(several times slower); use a multiple of 32, or -1",
        w.group_size, low_bit_name(w.type), w.activations == Activations::kBf16 ? "bf16" : "integer");
    w.activations = Activations::kF32;
  }
  prepare_for_kernels(w, &pool);
  return slow;
}

std::unique_ptr<LlamaModel> LlamaModel::load(const std::string& dir, const LoadOptions& options,
                                             ThreadPool& pool, LoadReport* report) {
  const auto start = std::chrono::steady_clock::now();
  ModelConfig config = read_model_config(dir);
  TensorStore store = TensorStore::open(dir);
  const std::optional<QuantizationConfig> quantized = read_quantization_config(dir);
  if (find_architecture(config.architecture)->fused_projections) {
    if (quantized)
      fail("{}: a {} checkpoint of {} (fused qkv_proj and gate_up_proj) is not supported; woq reads its float "
           "checkpoints", dir, quantized->describe(), config.architecture);
    split_fused_projections(store, config);
  }
  validate_checkpoint(store, config, quantized.has_value());
  if (options.plan) options.plan->check_layers(config.num_hidden_layers);
  if (options.numerics) config.numerics = *options.numerics;
  std::unique_ptr<LlamaModel> m(new LlamaModel(std::move(config), pool));
  const ModelConfig& c = m->config_;
  LoadReport rep;
  rep.numerics = c.numerics;
  rep.warnings = c.warnings;

  std::vector<std::string> activations_used;  // "sym_int4 int8", ...
  // The float linears of a quantized GGUF file, or of a GPTQ checkpoint (modules its `dynamic` leaves
  // unquantized), run as stored unless a format was asked for.
  const bool keep_float = options.linear_is_default && (quantized || has_ggml_linears(store, c));
  const std::string vocab_hidden = dims_name(kEmbedTokens.rows, kEmbedTokens.cols);
  const TensorView& embed = store.get(std::string(kEmbedTokens.hf));
  const TensorView* head = store.find(std::string(kLmHead.hf));
  if (!c.tie_word_embeddings && head == nullptr && !(quantized && store.find(std::string(kLmHeadQweight)))) {
    if (quantized && quantized->lm_head)
      fail("{}: quantization_config.lm_head is true, but there is no tensor '{}'", store.source(), kLmHeadQweight);
    fail("{}: tensor '{}' is missing and config.json tie_word_embeddings is false", store.source(), kLmHead.hf);
  }
  const bool has_output = head != nullptr && !c.tie_word_embeddings;  // llama.cpp's file has an output.weight
  // token_embd / output as stored, or under a K-quant file type in the type its rule gives (`ggml`: in ggml blocks).
  auto keep = [&](const TensorView& t, kquant::MixTensor::Kind kind, bool& ggml) {
    if (options.mix != nullptr && t.dtype != DType::kGgml && !quantized)
      return mixed_tensor(t, kind, options, c, has_output, pool, rep, ggml);
    ggml = t.dtype == DType::kGgml;
    return keep_tensor(t, c, vocab_hidden.c_str(), pool, rep);
  };
  // A pipeline stage reads its blocks only (LoadOptions::first_block), and the ends of the model it runs.
  const std::int64_t first = options.first_block, last = options.last_block < 0 ? c.num_hidden_layers : options.last_block;
  if (first < 0 || first >= last || last > c.num_hidden_layers)
    fail("decoder blocks [{}, {}) of a model of {}", first, last, c.num_hidden_layers);
  m->first_block_ = first;
  m->last_block_ = last;
  const bool has_head = last == c.num_hidden_layers;
  bool embed_ggml = false;
  if (first == 0 || (has_head && head == nullptr && !options.lm_head)) {
    if (const std::optional<QuantSpec> planned = options.plan ? options.plan->embeddings() : std::nullopt) {
      if (c.tie_word_embeddings)
        fail("{}: model.embed_tokens: {} ties lm_head to the embeddings, so they are one matrix; plan lm_head's format "
             "with --lm-head-low-bit or leave model.embed_tokens out of the plan", options.plan->source, dir);
      if (quantized)
        fail("{}: model.embed_tokens: {} is a {} checkpoint; a plan converts the embeddings of a float checkpoint "
             "only", options.plan->source, dir, quantized->describe());
      if (embed.dtype == DType::kGgml)
        fail("{}: model.embed_tokens: {} stores the embeddings as {}; a plan converts float embeddings only",
             options.plan->source, dir, embed.type_name());
      m->embed_ = load_matrix(embed, c.vocab_size, c.hidden_size, vocab_hidden.c_str(), *planned, pool);
      rep.embeddings_bytes += m->embed_.bytes();
    } else {
      m->embed_ = keep(embed, kquant::MixTensor::kTokenEmbd, embed_ggml);
      rep.other_bytes += m->embed_.bytes();
    }
  }
  const TensorView& head_src = head != nullptr ? *head : embed;
  if (!has_head) {
    // no lm_head, no final norm: a later stage has them
  } else if (std::optional<QuantMatrix> w = packed_lm_head(store, quantized, c, options, pool, rep)) {
    m->lm_head_ = std::make_unique<QuantMatrix>(std::move(*w));
    set_activations(*m->lm_head_, options, activations_used, rep, pool);
    rep.other_bytes += m->lm_head_->bytes();
  } else if (head != nullptr || options.lm_head) {
    if (options.lm_head && head_src.dtype == DType::kGgml)
      fail("{}: '{}' (lm_head) is stored as GGUF {}; woq runs it as stored and does not round it again: drop "
           "--lm-head-low-bit (or the plan's lm_head)", store.source(), head_src.name, head_src.ggml->name);
    bool head_ggml = false;
    m->lm_head_ = std::make_unique<QuantMatrix>(
        options.lm_head
            ? load_matrix(head_src, c.vocab_size, c.hidden_size, vocab_hidden.c_str(), *options.lm_head, pool)
            : keep(head_src, kquant::MixTensor::kOutput, head_ggml));
    set_activations(*m->lm_head_, options, activations_used, rep, pool, head_ggml);
    (options.lm_head ? rep.lm_head_bytes : rep.other_bytes) += m->lm_head_->bytes();
  } else {
    // Tied: the embedding is also the output projection (its lookup reads either layout).
    set_activations(m->embed_, options, activations_used, rep, pool, embed_ggml);
  }
  if (has_head) {
    m->final_norm_ =
        load_vector(store, std::string(kFinalNorm.hf), c.size(kFinalNorm.rows), dim_name(kFinalNorm.rows).data());
    rep.other_bytes += m->final_norm_.size() * sizeof(float);
  }

  BlockLinearLoader linear{store, quantized, options, c, has_output, keep_float, pool, rep, activations_used, {}};
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights w;
    if (l < first || l >= last) {  // another pipeline stage's block
      m->layers_.push_back(std::move(w));
      if (options.progress) options.progress(l + 1, c.num_hidden_layers);
      continue;
    }
    auto vector = [&](const NamedTensor& t) {
      std::vector<float> v = load_vector(store, layer_tensor(l, t.hf), c.size(t.rows), dim_name(t.rows).data());
      rep.other_bytes += v.size() * sizeof(float);
      return v;
    };
    w.attn_norm = vector(kAttnNorm);
    w.mlp_norm = vector(kMlpNorm);
    for (const LinearSpec& spec : kBlockLinears) w.linear(spec.role) = linear(l, spec);
    for (const LinearSpec& spec : kBlockLinears)
      if (c.has_bias(spec.bias)) {
        std::vector<float>& b = w.bias(spec.role);
        b = load_vector(store, linear_tensor(l, spec.role, "bias"), c.size(spec.rows), dim_name(spec.rows).data());
        rep.other_bytes += b.size() * sizeof(float);
      }
    if (c.qk_norm) {
      w.q_norm = vector(kQNorm);
      w.k_norm = vector(kKNorm);
    }
    m->layers_.push_back(std::move(w));
    if (options.progress) options.progress(l + 1, c.num_hidden_layers);
  }
  if (quantized) rep.imported_format = quantized->describe();
  for (const auto& [format, count] : linear.gguf_formats)
    rep.imported_format += fmt::format("{}{} x{}", rep.imported_format.empty() ? "" : ", ", format, count);
  label_report(*m, options, rep);
  for (const std::string& a : activations_used) rep.activations += (rep.activations.empty() ? "" : ", ") + a;
  rep.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (report != nullptr) *report = rep;
  return m;
}

}  // namespace woq
