#include "quantize/gguf_export.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>

#include "core/error.h"
#include "core/half.h"
#include "formats/ggml_types.h"
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

GgmlType ggml_type_of(LowBit type) {
  switch (type) {
    case LowBit::kSymInt4: return GgmlType::kQ4_0;
    case LowBit::kSymInt8: return GgmlType::kQ8_0;
    case LowBit::kFp16: return GgmlType::kF16;
    case LowBit::kBf16: return GgmlType::kBF16;
    case LowBit::kFp32: return GgmlType::kF32;
    default: fail("GGUF output: --low-bit {} has no GGUF type (sym_int4 = Q4_0, sym_int8 = Q8_0, fp16, bf16, fp32)",
                  low_bit_name(type));
  }
}

// Encodes fp32 row x[0, k) as `type` into out (ggml_row_bytes(type, k) bytes).
void encode_row(const float* x, std::int64_t k, GgmlType type, Rounding rounding, std::uint8_t* out) {
  switch (type) {
    case GgmlType::kF32: std::memcpy(out, x, static_cast<std::size_t>(k) * 4); return;
    case GgmlType::kF16:
    case GgmlType::kBF16:
      for (std::int64_t i = 0; i < k; ++i) {
        const std::uint16_t h = type == GgmlType::kF16 ? fp32_to_fp16(x[i]) : fp32_to_bf16(x[i]);
        std::memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::kQ4_0: {
      if (rounding == Rounding::kGgml) return ggml::quantize_q4_0_ggml(x, k, out);
      std::vector<std::uint8_t> q(static_cast<std::size_t>(k / 2));
      std::vector<std::uint16_t> scales(static_cast<std::size_t>(k / ggml::kQK));
      sym_int4::quantize_row(x, k, ggml::kQK, Int4Range::kFull, q.data(), scales.data());
      return ggml::q4_0_from_sym_int4(q.data(), scales.data(), k, out);
    }
    case GgmlType::kQ8_0: {
      if (rounding == Rounding::kGgml) return ggml::quantize_q8_0_ggml(x, k, out);
      std::vector<std::int8_t> q(static_cast<std::size_t>(k));
      std::vector<std::uint16_t> scales(static_cast<std::size_t>(k / ggml::kQK));
      sym_int8::quantize_row(x, k, ggml::kQK, q.data(), scales.data());
      return ggml::q8_0_from_sym_int8(q.data(), scales.data(), k, out);
    }
    default: fail("GGUF output: cannot encode {}", ggml_type_traits(type).name);
  }
}

}  // namespace

std::uint32_t gguf_file_type(LowBit type) {
  switch (type) {
    case LowBit::kFp32: return 0;
    case LowBit::kFp16: return 1;
    case LowBit::kSymInt4: return 2;
    case LowBit::kSymInt8: return 7;
    case LowBit::kBf16: return 32;
    default: ggml_type_of(type);  // throws
  }
  return 0;
}

GgufExportReport export_gguf(const std::string& in, const std::string& out, const GgufExportOptions& options,
                             ThreadPool& pool) {
  namespace fs = std::filesystem;
  const auto start = std::chrono::steady_clock::now();
  const GgmlType target = ggml_type_of(options.type);
  if (!is_gguf_path(out)) fail("{}: a GGUF output file name must end in .gguf", out);
  if (gguf_split_paths_pattern(out))
    fail("{}: woq writes one file, and a name ending in -NNNNN-of-NNNNN.gguf reads as a part of a split set", out);
  std::error_code ec;
  if (fs::exists(fs::symlink_status(out)) && !options.force) fail("{}: already exists (pass --force to replace it)", out);
  if (fs::exists(out) && fs::equivalent(in, out, ec)) fail("{}: the output is the input", out);
  if (fs::is_directory(out)) fail("{}: is a directory", out);

  const ModelConfig c = read_model_config(in);
  require_writable_architecture(in, c);
  const ArchitectureSpec* spec = find_architecture(c.architecture);
  const TensorStore store = TensorStore::open(in);
  const std::optional<QuantizationConfig> quantized = read_quantization_config(in);
  validate_checkpoint(store, c, quantized.has_value());  // what loading the output would refuse, before writing it
  GgufExportReport report;
  if (quantized)
    report.notes.push_back(fmt::format("the {} linear layers were dequantized and rounded again to {}; the result "
                                       "differs from the checkpoint by that second rounding", quantized->describe(),
                                       ggml_type_traits(target).name));
  if (c.sliding_window > 0)
    report.notes.push_back(fmt::format("sliding_window {} is not stored: llama.cpp's {} architecture attends to the "
                                       "whole context", c.sliding_window, spec->gguf_architecture));

  GgufWriter w;
  const std::string arch(spec->gguf_architecture);
  auto key = [&](std::string_view k) { return fmt::format("{}.{}", arch, k); };
  auto u32 = [](std::int64_t v) { return static_cast<std::uint32_t>(v); };
  w.set_string("general.architecture", arch);
  const fs::path in_path(in);
  std::string model_name = (in_path.has_filename() ? in_path.filename() : in_path.parent_path().filename()).string();
  if (is_gguf_path(in))
    model_name = GgufFile(gguf_split_paths(in).front()).get_string("general.name").value_or(model_name);
  w.set_string("general.name", model_name);
  w.set_u32("general.file_type", gguf_file_type(options.type));
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
  for (std::string& note : write_gguf_vocab(in, c, w)) report.notes.push_back(std::move(note));

  // Tensors: rows read in Hugging Face order, written in GGUF order.
  // A GPTQ / compressed-tensors linear has no `.weight`: it stands in with the
  // config's shape, and its rows come from the dequantized checkpoint.
  const std::vector<std::string> stored_names = quantized ? store.names() : std::vector<std::string>{};
  auto add = [&](const std::string& hf, GgmlType type, bool linear, std::pair<std::int64_t, std::int64_t> shape = {}) {
    TensorView stand_in;
    if (quantized && linear && store.find(hf) == nullptr) {
      stand_in.name = hf;
      stand_in.file = store.source();
      stand_in.shape = {shape.first, shape.second};
      const std::string stored = hf.substr(0, hf.rfind('.') + 1);  // "model.layers.L.self_attn.q_proj."
      for (const std::string& name : stored_names)
        if (name.starts_with(stored) && !name.ends_with(".bias")) report.bytes_before += store.get(name).bytes.size();
    }
    const TensorView& t = stand_in.shape.empty() ? store.get(hf) : stand_in;
    const std::string name = *gguf_tensor_name(hf);
    const std::int64_t k = t.shape.back();
    const std::int64_t rows = t.numel() / k;
    report.bytes_before += t.bytes.size();
    if ((type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0) && k % ggml::kQK != 0) {
      report.notes.push_back(fmt::format("{}: K = {} is not a multiple of 32, which {} blocks need; written as F16",
                                         name, k, ggml_type_traits(type).name));
      type = GgmlType::kF16;
    }
    const GgmlTypeTraits& traits = ggml_type_traits(type);
    report.bytes_after += static_cast<std::uint64_t>(rows * ggml_row_bytes(traits, k));
    if (linear && type == target) ++report.matrices;
    if (t.ggml != nullptr) {
      const std::string note =
          t.ggml->type == type
              ? fmt::format("{} tensors of the input are copied as stored (no rounding)", t.ggml->name)
              : fmt::format("{} tensors of the input are dequantized and rounded again to {} (a second rounding)",
                            t.ggml->name, ggml_type_traits(type).name);
      if (std::find(report.notes.begin(), report.notes.end(), note) == report.notes.end()) report.notes.push_back(note);
    }
    std::vector<std::int64_t> ne(t.shape.rbegin(), t.shape.rend());
    // GGUF row g holds HF row hf_row[g] (llama's q/k interleave their rotary halves).
    std::vector<std::int64_t> hf_row;
    const bool q = is_linear_tensor(hf, LinearRole::kQ);
    const bool kp = is_linear_tensor(hf, LinearRole::kK);
    if (spec->gguf_permute_qk && (q || kp)) {
      const std::vector<std::int64_t> order =
          gguf_qk_row_order(t.shape.front(), q ? c.num_attention_heads : c.num_key_value_heads);
      hf_row.resize(order.size());
      for (std::size_t r = 0; r < order.size(); ++r) hf_row[static_cast<std::size_t>(order[r])] = static_cast<std::int64_t>(r);
    }
    const std::int64_t row_len = hf_row.empty() ? k : 1;  // a permuted bias moves element by element
    const std::string prefix = hf.substr(0, hf.rfind('.'));
    // t is copied: a stand-in lives only as long as this call, the writer runs later.
    w.add_tensor(name, ne, type, [&, t, type, k, rows, hf_row, row_len, prefix, linear](std::span<std::uint8_t> dst) {
      // The same ggml type from a GGUF: its stored bytes are already in GGUF order.
      if (t.ggml != nullptr && t.ggml->type == type) {
        std::memcpy(dst.data(), t.bytes.data(), dst.size());
        release_pages(t.bytes);
        return;
      }
      std::optional<QuantMatrix> gptq;
      if (quantized && linear) {
        std::vector<std::string> warnings;
        gptq = load_quantized_linear(store, *quantized, prefix, rows, k, warnings, &pool);
        if (!gptq && t.bytes.empty()) store.get(t.name);  // neither quantized nor float: names the missing tensor
      }
      const std::int64_t row_bytes = ggml_row_bytes(ggml_type_traits(type), k);
      pool.parallel_for(rows, [&](std::int64_t r0, std::int64_t r1) {
        std::vector<float> x(static_cast<std::size_t>(k));
        for (std::int64_t g = r0; g < r1; ++g) {
          if (hf_row.empty()) {
            if (gptq) {
              dequantize_row(*gptq, g, x.data());
            } else {
              tensor_to_f32(t, x.data(), g * k, k);
            }
          } else if (row_len == 1 && rows == 1) {  // a 1-D q/k bias
            std::vector<float> all(static_cast<std::size_t>(k));
            tensor_to_f32(t, all.data());
            for (std::int64_t i = 0; i < k; ++i) x[static_cast<std::size_t>(i)] = all[static_cast<std::size_t>(hf_row[static_cast<std::size_t>(i)])];
          } else if (gptq) {
            dequantize_row(*gptq, hf_row[static_cast<std::size_t>(g)], x.data());
          } else {
            tensor_to_f32(t, x.data(), hf_row[static_cast<std::size_t>(g)] * k, k);
          }
          for (std::int64_t i = 0; i < k; ++i)
            if (!std::isfinite(x[static_cast<std::size_t>(i)]))
              fail("{}: tensor '{}' holds {} at row {}, column {}", t.file, t.name, x[static_cast<std::size_t>(i)],
                   hf_row.empty() ? g : hf_row[static_cast<std::size_t>(g)], i);
          try {
            encode_row(x.data(), k, type, options.rounding, dst.data() + g * row_bytes);
          } catch (const Error& e) {
            fail("{}: tensor '{}' row {}: {}", t.file, t.name, g, e.what());
          }
        }
      });
      release_pages(t.bytes);
    });
  };
  const bool int_target = target == GgmlType::kQ4_0 || target == GgmlType::kQ8_0;
  // Embeddings and output: a GGUF input's own type, else F16 beside integer layers.
  auto big_type = [&](const TensorView& t) {
    if (t.ggml != nullptr) return t.ggml->type;
    return int_target ? GgmlType::kF16 : target;
  };
  const TensorView& embed = store.get(std::string(kEmbedTokens.hf));
  add(std::string(kEmbedTokens.hf), big_type(embed), false);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    add(layer_tensor(l, kAttnNorm.hf), GgmlType::kF32, false);
    for (const LinearSpec& linear : kBlockLinears) {
      add(linear_tensor(l, linear.role), target, true, block_linear_shape(c, linear.role));
      const std::string bias = linear_tensor(l, linear.role, "bias");
      if (store.find(bias) != nullptr) add(bias, GgmlType::kF32, false);
    }
    if (c.qk_norm) {
      add(layer_tensor(l, kQNorm.hf), GgmlType::kF32, false);
      add(layer_tensor(l, kKNorm.hf), GgmlType::kF32, false);
    }
    add(layer_tensor(l, kMlpNorm.hf), GgmlType::kF32, false);
  }
  add(std::string(kFinalNorm.hf), GgmlType::kF32, false);
  if (const TensorView* head = store.find(std::string(kLmHead.hf)); head != nullptr && !c.tie_word_embeddings)
    add(std::string(kLmHead.hf), big_type(*head), false);
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
