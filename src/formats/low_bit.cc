#include "formats/low_bit.h"

#include <cmath>
#include <cstring>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/format_traits.h"
#include "formats/ggml_types.h"
#include "formats/interleave.h"
#include "formats/kquant.h"
#include "formats/kquant_mix.h"

namespace woq {

namespace {

// Row r's part of a per-group array of w (scales, zeros), or nullptr when w has none.
template <typename T>
T* row_of(std::vector<T>& v, std::int64_t r, const QuantMatrix& w) {
  return v.empty() ? nullptr : v.data() + r * w.groups_per_row;
}
template <typename T>
const T* row_of(const std::vector<T>& v, std::int64_t r, const QuantMatrix& w) {
  return v.empty() ? nullptr : v.data() + r * w.groups_per_row;
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

bool is_int4(LowBit type) { return is_quantized(type) && format_traits(type).value_bits == 4; }

std::string_view low_bit_name(LowBit type) { return format_traits(type).name; }

LowBit parse_low_bit(std::string_view name) {
  if (const FormatTraits* f = find_format(name)) return f->type;
  if (const kquant::Mix* m = kquant::find_mix(name))
    fail("low-bit type '{}' is llama-quantize's file type {}, a type per layer of a whole model; here give one format "
         "(fp32, fp16, bf16, sym_int4, asym_int4, sym_int8, q2_k ... q6_k, q4_1, q5_1)", printable(name), m->llama_name);
  fail("unknown low-bit type '{}' (expected one of: fp32, fp16, bf16, sym_int4, asym_int4, sym_int8, q2_k, q3_k, "
       "q4_k, q5_k, q6_k, q4_1, q5_1; or, for a whole model, llama-quantize's q2_k, q3_k_s/m/l, q4_k_s/m, q5_k_s/m, q6_k)",
       printable(name));
}

bool is_quantized(LowBit type) { return format_traits(type).family == FormatFamily::kGrouped; }

bool is_kquant(LowBit type) { return format_traits(type).family == FormatFamily::kKQuant; }

bool is_float_format(LowBit type) { return format_traits(type).family == FormatFamily::kFloat; }

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

Activations default_activations(LowBit type) { return format_traits(type).default_activations; }

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

QuantMatrix matrix_layout(std::int64_t rows, std::int64_t cols, const QuantSpec& spec) {
  if (rows <= 0 || cols <= 0) fail("cannot store an empty matrix [{}, {}]", rows, cols);
  validate(spec);
  QuantMatrix w;
  w.type = spec.type;
  w.int4_range = spec.int4_range;
  w.rows = rows;
  w.cols = cols;
  if (is_kquant(spec.type)) {
    const std::int64_t block = kquant::find(spec.type)->block;
    if (cols % block != 0)
      fail("{} needs K a multiple of {} (its {}), got K = {}", low_bit_name(spec.type), block,
           block == kquant::kSuperBlock ? "super-blocks" : "blocks", cols);
    w.group_size = block;
    w.groups_per_row = cols / block;
  }
  w.row_bytes = format_traits(spec.type).row_bytes(cols);
  if (is_quantized(spec.type)) {
    const std::int64_t g = spec.group_size;
    w.group_size = (g == -1 || g > cols) ? cols : g;
    w.groups_per_row = (cols + w.group_size - 1) / w.group_size;
  }
  return w;
}

QuantMatrix allocate_matrix(std::int64_t rows, std::int64_t cols, const QuantSpec& spec) {
  QuantMatrix w = matrix_layout(rows, cols, spec);
  if (is_quantized(spec.type)) {
    w.scales.assign(static_cast<std::size_t>(rows * w.groups_per_row), 0);
    if (spec.type == LowBit::kAsymInt4) w.zeros.assign(w.scales.size(), 0);
  }
  w.data.assign(static_cast<std::size_t>(rows * w.row_bytes), 0);
  return w;
}

void require_finite_row(const float* x, std::int64_t cols, std::int64_t row) {
  bool finite = true;  // |x| <= max is false for NaN and ±inf: one pass the compiler vectorizes
  for (std::int64_t j = 0; j < cols; ++j) finite &= std::fabs(x[j]) <= std::numeric_limits<float>::max();
  if (!finite)
    for (std::int64_t j = 0; j < cols; ++j)
      if (!std::isfinite(x[j])) fail("non-finite weight {} at row {}, column {}", x[j], row, j);
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
      require_finite_row(x, cols, r);
      try {
        if (ggml_rounding) {
          encode_row_ggml(w, r, x, blocks);
        } else {
          format_traits(w.type).encode_row(w, x, w.data.data() + r * w.row_bytes, row_of(w.scales, r, w),
                                           row_of(w.zeros, r, w));
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
  const std::uint16_t* scales = row_of(w.scales, row, w);
  const std::uint8_t* zeros = row_of(w.zeros, row, w);
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
  format_traits(w.type).decode_row(w, src, scales, zeros, out);
}

}  // namespace woq
