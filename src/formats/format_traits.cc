#include "formats/format_traits.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/half.h"
#include "formats/asym_int4.h"
#include "formats/kquant.h"
#include "formats/sym_int4.h"
#include "formats/sym_int8.h"

namespace woq {

namespace {

// ---- fp32 / fp16 / bf16: one value per weight ----

template <std::int64_t kBytes>
std::int64_t plain_row_bytes(std::int64_t cols) {
  return kBytes * cols;
}

void encode_fp32(const QuantMatrix& w, const float* x, std::uint8_t* data, std::uint16_t*, std::uint8_t*) {
  std::memcpy(data, x, static_cast<std::size_t>(4 * w.cols));
}

void decode_fp32(const QuantMatrix& w, const std::uint8_t* data, const std::uint16_t*, const std::uint8_t*,
                 float* out) {
  std::memcpy(out, data, static_cast<std::size_t>(4 * w.cols));
}

template <std::uint16_t (*Encode)(float)>
void encode_half(const QuantMatrix& w, const float* x, std::uint8_t* data, std::uint16_t*, std::uint8_t*) {
  for (std::int64_t j = 0; j < w.cols; ++j) {
    const std::uint16_t h = Encode(x[j]);
    std::memcpy(data + 2 * j, &h, 2);
  }
}

template <float (*Decode)(std::uint16_t)>
void decode_half(const QuantMatrix& w, const std::uint8_t* data, const std::uint16_t*, const std::uint8_t*,
                 float* out) {
  for (std::int64_t j = 0; j < w.cols; ++j) {
    std::uint16_t h;
    std::memcpy(&h, data + 2 * j, 2);
    out[j] = Decode(h);
  }
}

// ---- woq's grouped integers (sym_int4.h, asym_int4.h, sym_int8.h) ----

std::int64_t nibble_row_bytes(std::int64_t cols) { return (cols + 1) / 2; }

void encode_sym_int4(const QuantMatrix& w, const float* x, std::uint8_t* data, std::uint16_t* scales,
                     std::uint8_t*) {
  sym_int4::quantize_row(x, w.cols, w.group_size, w.int4_range, data, scales);
}

void decode_sym_int4(const QuantMatrix& w, const std::uint8_t* data, const std::uint16_t* scales,
                     const std::uint8_t*, float* out) {
  sym_int4::dequantize_row(data, scales, w.cols, w.group_size, out);
}

void encode_asym_int4(const QuantMatrix& w, const float* x, std::uint8_t* data, std::uint16_t* scales,
                      std::uint8_t* zeros) {
  asym_int4::quantize_row(x, w.cols, w.group_size, data, scales, zeros);
}

void decode_asym_int4(const QuantMatrix& w, const std::uint8_t* data, const std::uint16_t* scales,
                      const std::uint8_t* zeros, float* out) {
  asym_int4::dequantize_row(data, scales, zeros, w.cols, w.group_size, out);
}

GroupRule fit_asym_int4(Int4Range, const float* x, std::int64_t n) { return asym_int4::fit_group(x, n); }

void encode_sym_int8(const QuantMatrix& w, const float* x, std::uint8_t* data, std::uint16_t* scales,
                     std::uint8_t*) {
  sym_int8::quantize_row(x, w.cols, w.group_size, reinterpret_cast<std::int8_t*>(data), scales);
}

void decode_sym_int8(const QuantMatrix& w, const std::uint8_t* data, const std::uint16_t* scales,
                     const std::uint8_t*, float* out) {
  sym_int8::dequantize_row(reinterpret_cast<const std::int8_t*>(data), scales, w.cols, w.group_size, out);
}

GroupRule fit_sym_int8(Int4Range, const float* x, std::int64_t n) { return sym_int8::fit_group(x, n); }

// ---- ggml's block formats, kept as stored (kquant.h): ggml's own codecs ----

template <LowBit T>
std::int64_t kquant_row_bytes(std::int64_t cols) {
  return cols / kquant::find(T)->block * kquant::find(T)->block_bytes;
}

void encode_kquant(const QuantMatrix& w, const float* x, std::uint8_t* data, std::uint16_t*, std::uint8_t*) {
  ggml_type_traits(kquant::find(w.type)->ggml).from_float(x, w.cols, data);
}

void decode_kquant(const QuantMatrix& w, const std::uint8_t* data, const std::uint16_t*, const std::uint8_t*,
                   float* out) {
  ggml_type_traits(kquant::find(w.type)->ggml).to_float(data, out, w.cols);
}

constexpr FormatTraits kquant_row(LowBit type, std::string_view name, int bits, GgmlType ggml,
                                  std::int64_t (*row_bytes)(std::int64_t),
                                  ActivationBlocks activations = ActivationBlocks::kQ8_K,
                                  std::optional<std::uint32_t> llama_ftype = std::nullopt) {
  return {type,         name, FormatFamily::kKQuant, bits,          0,      activations,
          Activations::kInt8, ggml, llama_ftype, row_bytes, encode_kquant, decode_kquant, nullptr};
}

// llama.cpp's llama_ftype numbers (include/llama.h).
constexpr std::uint32_t kFtypeF32 = 0, kFtypeF16 = 1, kFtypeQ4_0 = 2, kFtypeQ4_1 = 3, kFtypeQ8_0 = 7, kFtypeQ5_1 = 9,
                        kFtypeBf16 = 32;

// In LowBit order. Default activations by measurement (README, "Activations"):
// for 8-bit weights int8 activations double the KL divergence on the bundled
// model (0.00146 vs 0.00070 with f32 ones), bf16 ones add 6 % (0.00074) and
// int16 ones nothing measurable (0.000702), while int16 decodes at the integer
// path's speed (8-layer llama-2-7b shapes on an AMX Xeon, 2026-12-03: tg32
// 7.5 / 13.8 t/s at 1 / 2 threads against bf16's 5.9 / 10.9 and llama.cpp
// Q8_0's 8.2 / 15.8 with fewer bytes per token) and prefills faster than bf16
// on AVX2 and AVX-512 (pp128 at 2 threads: 27 against 19, 95 against 62); on
// AMX bf16 prefills faster (pp512 ~180 against 130 at g32, 175 per channel).
// For 4-bit weights int8 activations cost nothing measurable (0.1810 vs
// 0.1807) and decode ~2.7x faster.
constexpr std::array<FormatTraits, kFormatCount> kFormats{{
    {LowBit::kFp32, "fp32", FormatFamily::kFloat, 32, 0, ActivationBlocks::kF32, Activations::kF32, GgmlType::kF32,
     kFtypeF32, plain_row_bytes<4>, encode_fp32, decode_fp32, nullptr},
    {LowBit::kFp16, "fp16", FormatFamily::kFloat, 16, 0, ActivationBlocks::kF32, Activations::kF32, GgmlType::kF16,
     kFtypeF16, plain_row_bytes<2>, encode_half<fp32_to_fp16>, decode_half<fp16_to_fp32>, nullptr},
    {LowBit::kBf16, "bf16", FormatFamily::kFloat, 16, 0, ActivationBlocks::kF32, Activations::kF32, GgmlType::kBF16,
     kFtypeBf16, plain_row_bytes<2>, encode_half<fp32_to_bf16>, decode_half<bf16_to_fp32>, nullptr},
    {LowBit::kSymInt4, "sym_int4", FormatFamily::kGrouped, 4, 8, ActivationBlocks::kQ8_32, Activations::kInt8,
     GgmlType::kQ4_0, kFtypeQ4_0, nibble_row_bytes, encode_sym_int4, decode_sym_int4, sym_int4::fit_group},
    {LowBit::kAsymInt4, "asym_int4", FormatFamily::kGrouped, 4, -1, ActivationBlocks::kQ8_32, Activations::kInt8,
     std::nullopt, std::nullopt, nibble_row_bytes, encode_asym_int4, decode_asym_int4, fit_asym_int4},
    {LowBit::kSymInt8, "sym_int8", FormatFamily::kGrouped, 8, 128, ActivationBlocks::kQ8_32, Activations::kInt16,
     GgmlType::kQ8_0, kFtypeQ8_0, plain_row_bytes<1>, encode_sym_int8, decode_sym_int8, fit_sym_int8},
    kquant_row(LowBit::kQ2_K, "q2_k", 2, GgmlType::kQ2_K, kquant_row_bytes<LowBit::kQ2_K>),
    kquant_row(LowBit::kQ3_K, "q3_k", 3, GgmlType::kQ3_K, kquant_row_bytes<LowBit::kQ3_K>),
    kquant_row(LowBit::kQ4_K, "q4_k", 4, GgmlType::kQ4_K, kquant_row_bytes<LowBit::kQ4_K>),
    kquant_row(LowBit::kQ5_K, "q5_k", 5, GgmlType::kQ5_K, kquant_row_bytes<LowBit::kQ5_K>),
    kquant_row(LowBit::kQ6_K, "q6_k", 6, GgmlType::kQ6_K, kquant_row_bytes<LowBit::kQ6_K>),
    kquant_row(LowBit::kQ4_1, "q4_1", 4, GgmlType::kQ4_1, kquant_row_bytes<LowBit::kQ4_1>, ActivationBlocks::kQ8_1,
               kFtypeQ4_1),
    kquant_row(LowBit::kQ5_1, "q5_1", 5, GgmlType::kQ5_1, kquant_row_bytes<LowBit::kQ5_1>, ActivationBlocks::kQ8_1,
               kFtypeQ5_1),
}};

constexpr bool in_lowbit_order() {
  for (std::size_t i = 0; i < kFormats.size(); ++i)
    if (static_cast<std::size_t>(kFormats[i].type) != i) return false;
  return true;
}
static_assert(in_lowbit_order(), "kFormats must list every LowBit in enum order");
static_assert(static_cast<std::size_t>(LowBit::kQ5_1) + 1 == kFormatCount, "a LowBit without a traits row");

}  // namespace

std::span<const FormatTraits> weight_formats() { return kFormats; }

const FormatTraits& format_traits(LowBit type) {
  const auto i = static_cast<std::size_t>(type);
  if (i >= kFormats.size()) fail("unknown weight format number {}", i);
  return kFormats[i];
}

const FormatTraits* find_format(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const FormatTraits& f : kFormats)
    if (f.name == lower) return &f;
  return nullptr;
}

GroupRule fit_group(LowBit type, Int4Range range, const float* x, std::int64_t n) {
  const FormatTraits& f = format_traits(type);
  if (f.fit_group == nullptr) fail("fit_group: {} is not an integer format", f.name);
  return f.fit_group(range, x, n);
}

}  // namespace woq
