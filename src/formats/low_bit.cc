#include "formats/low_bit.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/asym_int4.h"
#include "formats/ggml_types.h"
#include "formats/group_rule.h"
#include "formats/interleave.h"
#include "formats/kquant.h"
#include "formats/kquant_mix.h"
#include "formats/scale.h"
#include "formats/sym_int4.h"
#include "formats/sym_int8.h"

namespace woq {

namespace {

constexpr std::array<std::pair<LowBit, std::string_view>, 6> kNames{{
    {LowBit::kFp32, "fp32"},
    {LowBit::kFp16, "fp16"},
    {LowBit::kBf16, "bf16"},
    {LowBit::kSymInt4, "sym_int4"},
    {LowBit::kAsymInt4, "asym_int4"},
    {LowBit::kSymInt8, "sym_int8"},
}};

std::int64_t packed_row_bytes(LowBit type, std::int64_t cols) {
  switch (type) {
    case LowBit::kFp32: return 4 * cols;
    case LowBit::kFp16:
    case LowBit::kBf16: return 2 * cols;
    case LowBit::kSymInt4:
    case LowBit::kAsymInt4: return (cols + 1) / 2;
    case LowBit::kSymInt8: return cols;
    case LowBit::kQ2_K:
    case LowBit::kQ3_K:
    case LowBit::kQ4_K:
    case LowBit::kQ5_K:
    case LowBit::kQ6_K: return cols / kquant::kSuperBlock * kquant::find(type)->block_bytes;
  }
  return 0;
}

// Stores one row of fp32 values in `w`'s format.
void encode_row(QuantMatrix& w, std::int64_t r, const float* x) {
  std::uint8_t* dst = w.data.data() + r * w.row_bytes;
  std::uint16_t* scales = w.scales.data() + r * w.groups_per_row;
  const std::int64_t k = w.cols;
  switch (w.type) {
    case LowBit::kFp32: std::memcpy(dst, x, static_cast<std::size_t>(4 * k)); break;
    case LowBit::kFp16:
      for (std::int64_t j = 0; j < k; ++j) {
        const std::uint16_t h = fp32_to_fp16(x[j]);
        std::memcpy(dst + 2 * j, &h, 2);
      }
      break;
    case LowBit::kBf16:
      for (std::int64_t j = 0; j < k; ++j) {
        const std::uint16_t h = fp32_to_bf16(x[j]);
        std::memcpy(dst + 2 * j, &h, 2);
      }
      break;
    case LowBit::kSymInt4:
      sym_int4::quantize_row(x, k, w.group_size, w.int4_range, dst, scales);
      break;
    case LowBit::kAsymInt4:
      asym_int4::quantize_row(x, k, w.group_size, dst, scales,
                              w.zeros.data() + r * w.groups_per_row);
      break;
    case LowBit::kSymInt8:
      sym_int8::quantize_row(x, k, w.group_size, reinterpret_cast<std::int8_t*>(dst), scales);
      break;
    case LowBit::kQ2_K:
    case LowBit::kQ3_K:
    case LowBit::kQ4_K:
    case LowBit::kQ5_K:
    case LowBit::kQ6_K: ggml_type_traits(kquant::find(w.type)->ggml).from_float(x, k, dst); break;
  }
}

// Row r of w from x by ggml's reference Q4_0 / Q8_0 quantizer, through
// ggml blocks (`blocks` holds one row of them).
void encode_row_ggml(QuantMatrix& w, std::int64_t r, const float* x, std::vector<std::uint8_t>& blocks) {
  std::uint8_t* dst = w.data.data() + r * w.row_bytes;
  std::uint16_t* scales = w.scales.data() + r * w.groups_per_row;
  if (w.type == LowBit::kSymInt4) {
    ggml::quantize_q4_0_ggml(x, w.cols, blocks.data());
    ggml::sym_int4_from_q4_0(blocks.data(), w.cols, dst, scales);
  } else {
    ggml::quantize_q8_0_ggml(x, w.cols, blocks.data());
    ggml::sym_int8_from_q8_0(blocks.data(), w.cols, reinterpret_cast<std::int8_t*>(dst), scales);
  }
}

}  // namespace

bool is_int4(LowBit type) { return type == LowBit::kSymInt4 || type == LowBit::kAsymInt4; }

GroupRule fit_group(LowBit type, Int4Range range, const float* x, std::int64_t n) {
  GroupRule r;
  switch (type) {
    case LowBit::kSymInt4: {
      float amax = 0.0f, max = 0.0f;  // max: the signed value of largest magnitude
      for (std::int64_t j = 0; j < n; ++j)
        if (std::fabs(x[j]) > amax) {
          amax = std::fabs(x[j]);
          max = x[j];
        }
      const bool full = range == Int4Range::kFull;
      r.scale = codec::encode_scale(full ? max / -8.0f : amax / 7.0f);
      r.zero = 8;
      r.lo = full ? 0 : 1;
      r.hi = 15;
      return r;
    }
    case LowBit::kAsymInt4: {
      float lo = 0.0f, hi = 0.0f;
      for (std::int64_t j = 0; j < n; ++j) {
        lo = std::min(lo, x[j]);
        hi = std::max(hi, x[j]);
      }
      r.scale = codec::encode_scale((hi - lo) / 15.0f);
      r.zero = codec::round_div(-lo, r.step(), 0, 15);
      r.lo = 0;
      r.hi = 15;
      return r;
    }
    case LowBit::kSymInt8: {
      float amax = 0.0f;
      for (std::int64_t j = 0; j < n; ++j) amax = std::max(amax, std::fabs(x[j]));
      r.scale = codec::encode_scale(amax / 127.0f);
      r.lo = -127;
      r.hi = 127;
      return r;
    }
    default: fail("fit_group: {} is not an integer format", low_bit_name(type));
  }
}

std::string_view low_bit_name(LowBit type) {
  for (const auto& [t, name] : kNames)
    if (t == type) return name;
  if (const kquant::Format* f = kquant::find(type)) return f->name;
  return "?";
}

LowBit parse_low_bit(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const auto& [t, n] : kNames)
    if (n == lower) return t;
  for (const kquant::Format& f : kquant::formats())
    if (f.name == lower) return f.type;
  if (const kquant::Mix* m = kquant::find_mix(name))
    fail("low-bit type '{}' is llama-quantize's file type {}, a type per layer of a whole model; here give one format "
         "(fp32, fp16, bf16, sym_int4, asym_int4, sym_int8, q2_k ... q6_k)", printable(name), m->llama_name);
  fail("unknown low-bit type '{}' (expected one of: fp32, fp16, bf16, sym_int4, asym_int4, sym_int8, q2_k, q3_k, "
       "q4_k, q5_k, q6_k; or, for a whole model, llama-quantize's q2_k, q3_k_s/m/l, q4_k_s/m, q5_k_s/m, q6_k)",
       printable(name));
}

bool is_quantized(LowBit type) {
  return type == LowBit::kSymInt4 || type == LowBit::kAsymInt4 || type == LowBit::kSymInt8;
}

bool is_kquant(LowBit type) { return kquant::find(type) != nullptr; }

std::string_view activations_name(Activations a) {
  switch (a) {
    case Activations::kInt8: return "int8";
    case Activations::kF32: return "f32";
    case Activations::kBf16: return "bf16";
    case Activations::kInt16: return "int16";
  }
  return "?";
}

Activations parse_activations(std::string_view name) {
  for (const Activations a : {Activations::kInt8, Activations::kF32, Activations::kBf16, Activations::kInt16})
    if (name == activations_name(a)) return a;
  fail("unknown activations '{}' (expected int8, f32, bf16 or int16)", printable(name));
}

// By measurement (README, "Activations"): for 8-bit weights int8 activations
// double the KL divergence on the bundled model (0.00146 vs 0.00070 with f32
// ones), bf16 ones add 6 % (0.00074) and int16 ones nothing measurable
// (0.000702), while int16 decodes at the integer path's speed (8-layer
// llama-2-7b shapes on an AMX Xeon, 2026-12-03: tg32 7.5 / 13.8 t/s at 1 / 2
// threads against bf16's 5.9 / 10.9 and llama.cpp Q8_0's 8.2 / 15.8 with fewer
// bytes per token) and prefills faster than bf16 on AVX2 and AVX-512 (pp128 at
// 2 threads: 27 against 19, 95 against 62); on AMX bf16 prefills faster
// (pp512 ~180 against 130 at g32, 175 per channel). For 4-bit weights int8
// activations cost nothing measurable (0.1810 vs 0.1807) and decode ~2.7x faster.
Activations default_activations(LowBit type) {
  return type == LowBit::kSymInt8 ? Activations::kInt16 : Activations::kInt8;
}

std::string_view int4_range_name(Int4Range range) {
  return range == Int4Range::kFull ? "full" : "clip";
}

Int4Range parse_int4_range(std::string_view name) {
  if (name == "full") return Int4Range::kFull;
  if (name == "clip") return Int4Range::kClip;
  fail("unknown int4 range '{}' (expected full or clip)", name);
}

std::size_t QuantMatrix::bytes() const {
  return data.size() + scales.size() * sizeof(std::uint16_t) + zeros.size();
}

QuantMatrix quantize_matrix(const float* src, std::int64_t rows, std::int64_t cols,
                            const QuantSpec& spec, ThreadPool* pool) {
  const RowReader read = [src, cols](std::int64_t r, float* out) {
    std::memcpy(out, src + r * cols, static_cast<std::size_t>(cols) * sizeof(float));
  };
  return quantize_matrix(read, rows, cols, spec, pool);
}

std::string_view rounding_name(Rounding r) { return r == Rounding::kGgml ? "ggml" : "woq"; }

Rounding parse_rounding(std::string_view name) {
  if (name == "woq") return Rounding::kWoq;
  if (name == "ggml") return Rounding::kGgml;
  fail("rounding '{}' is not one of: woq, ggml", name);
}

void validate(const QuantSpec& spec) {
  const std::int64_t g = spec.group_size;
  if (is_quantized(spec.type) && g != -1 && (g < 1 || (is_int4(spec.type) && g % 2 != 0)))
    fail("group_size {} is invalid for {} (use -1 for per-channel or a positive{} number)", g,
         low_bit_name(spec.type), is_int4(spec.type) ? " even" : "");
  if (spec.rounding == Rounding::kGgml && is_quantized(spec.type) &&
      !(g == ggml::kQK && (spec.type == LowBit::kSymInt8 ||
                           (spec.type == LowBit::kSymInt4 && spec.int4_range == Int4Range::kFull))))
    fail("ggml rounding is ggml's Q4_0 / Q8_0 rule: sym_int4 (full range) or sym_int8 at group_size 32, not {} "
         "group_size {}", low_bit_name(spec.type), g);
}

std::string describe(const QuantSpec& spec) {
  std::string s(low_bit_name(spec.type));
  if (is_quantized(spec.type)) {
    s += spec.group_size == -1 ? " (per channel" : fmt::format(" (group_size {}", spec.group_size);
    if (spec.type == LowBit::kSymInt4) s += fmt::format(", {} range", int4_range_name(spec.int4_range));
    if (spec.rounding == Rounding::kGgml) s += ", ggml rounding";
    s += ")";
  }
  return s;
}

QuantMatrix allocate_matrix(std::int64_t rows, std::int64_t cols, const QuantSpec& spec) {
  if (rows <= 0 || cols <= 0) fail("cannot store an empty matrix [{}, {}]", rows, cols);
  validate(spec);
  QuantMatrix w;
  w.type = spec.type;
  w.int4_range = spec.int4_range;
  w.rows = rows;
  w.cols = cols;
  if (is_kquant(spec.type)) {
    if (cols % kquant::kSuperBlock != 0)
      fail("{} needs K a multiple of {} (its super-blocks), got K = {}", low_bit_name(spec.type), kquant::kSuperBlock,
           cols);
    w.group_size = kquant::kSuperBlock;
    w.groups_per_row = cols / kquant::kSuperBlock;
  }
  w.row_bytes = packed_row_bytes(spec.type, cols);
  if (is_quantized(spec.type)) {
    const std::int64_t g = spec.group_size;
    w.group_size = (g == -1 || g > cols) ? cols : g;
    w.groups_per_row = (cols + w.group_size - 1) / w.group_size;
    w.scales.assign(static_cast<std::size_t>(rows * w.groups_per_row), 0);
    if (spec.type == LowBit::kAsymInt4) w.zeros.assign(w.scales.size(), 0);
  }
  w.data.assign(static_cast<std::size_t>(rows * w.row_bytes), 0);
  return w;
}

QuantMatrix quantize_matrix(const RowReader& read_row, std::int64_t rows, std::int64_t cols,
                            const QuantSpec& spec, ThreadPool* pool) {
  QuantMatrix w = allocate_matrix(rows, cols, spec);
  const bool ggml_rounding = spec.rounding == Rounding::kGgml && is_quantized(spec.type);
  if (ggml_rounding && cols % ggml::kQK != 0)
    fail("ggml rounding needs K a multiple of 32 (Q4_0 / Q8_0 blocks), got K = {}", cols);

  auto encode = [&](std::int64_t r0, std::int64_t r1) {
    std::vector<std::uint8_t> blocks(ggml_rounding ? static_cast<std::size_t>(cols / ggml::kQK * ggml::kQ8_0Bytes) : 0);
    std::vector<float> row(static_cast<std::size_t>(cols));
    const float* x = row.data();
    for (std::int64_t r = r0; r < r1; ++r) {
      read_row(r, row.data());
      for (std::int64_t j = 0; j < cols; ++j)
        if (!std::isfinite(x[j])) fail("non-finite weight {} at row {}, column {}", x[j], r, j);
      try {
        if (ggml_rounding) {
          encode_row_ggml(w, r, x, blocks);
        } else {
          encode_row(w, r, x);
        }
      } catch (const Error& e) {
        fail("row {}: {}", r, e.what());
      }
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(rows, encode, 16);
  } else {
    encode(0, rows);
  }
  return w;
}

void dequantize_row(const QuantMatrix& w, std::int64_t row, float* out) {
  if (w.input_order.empty()) return dequantize_stored_row(w, row, out);
  std::vector<float> stored(static_cast<std::size_t>(w.cols));
  dequantize_stored_row(w, row, stored.data());
  for (std::int64_t k = 0; k < w.cols; ++k) out[w.input_order[static_cast<std::size_t>(k)]] = stored[static_cast<std::size_t>(k)];
}

void dequantize_stored_row(const QuantMatrix& w, std::int64_t row, float* out) {
  const std::uint8_t* src = w.data.data() + row * w.row_bytes;
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  const std::uint8_t* zeros = w.zeros.empty() ? nullptr : w.zeros.data() + row * w.groups_per_row;
  std::vector<std::uint8_t> row_data, row_zeros;
  std::vector<std::uint16_t> row_scales;
  if (w.interleave != 1) {  // the row, gathered into the row-major layout (a rare path: explain's f32 rows)
    row_data.resize(static_cast<std::size_t>(w.row_bytes));
    row_scales.resize(static_cast<std::size_t>(w.groups_per_row));
    row_zeros.resize(static_cast<std::size_t>(w.groups_per_row));
    gather_row(w, row, row_data.data(), row_scales.data(), row_zeros.data());
    src = row_data.data();
    scales = row_scales.data();
    zeros = row_zeros.data();
  }
  const std::int64_t k = w.cols;
  switch (w.type) {
    case LowBit::kFp32: std::memcpy(out, src, static_cast<std::size_t>(4 * k)); break;
    case LowBit::kFp16:
      for (std::int64_t j = 0; j < k; ++j) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * j, 2);
        out[j] = fp16_to_fp32(h);
      }
      break;
    case LowBit::kBf16:
      for (std::int64_t j = 0; j < k; ++j) {
        std::uint16_t h;
        std::memcpy(&h, src + 2 * j, 2);
        out[j] = bf16_to_fp32(h);
      }
      break;
    case LowBit::kSymInt4: sym_int4::dequantize_row(src, scales, k, w.group_size, out); break;
    case LowBit::kAsymInt4:
      asym_int4::dequantize_row(src, scales, zeros, k, w.group_size, out);
      break;
    case LowBit::kSymInt8:
      sym_int8::dequantize_row(reinterpret_cast<const std::int8_t*>(src), scales, k, w.group_size,
                               out);
      break;
    case LowBit::kQ2_K:
    case LowBit::kQ3_K:
    case LowBit::kQ4_K:
    case LowBit::kQ5_K:
    case LowBit::kQ6_K: ggml_type_traits(kquant::find(w.type)->ggml).to_float(src, out, k); break;
  }
}

}  // namespace woq
