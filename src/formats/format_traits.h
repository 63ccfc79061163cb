// The weight formats as data: one traits row per LowBit (the "format traits"
// seam of STYLE.md; ggml's type_traits[] / type_traits_cpu[] with their
// vec_dot_type are the model). What differs between formats — name, width
// of the stored values, bytes per row, how a row is encoded from and decoded
// to fp32, the per-group rule GPTQ fits, the activations the integer kernels
// take, the ggml type and llama file type a GGUF writer gives it — is a
// column here, so that code outside the codecs and kernels looks it up
// instead of switching on the format. The kernels specialise on the format
// at compile time (one template per format and ISA, kernels/matmul*.cc,
// kernels/kquant_dot*.{cc,h}); their tables are per ISA.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "formats/ggml_types.h"
#include "formats/group_rule.h"
#include "formats/low_bit.h"

namespace woq {

/// How a format holds its weights.
enum class FormatFamily {
  kFloat,    ///< one float per weight (fp32, fp16, bf16)
  kGrouped,  ///< woq's integers with one fp16 scale (and zero) per group along K, beside the data (low_bit.h)
  kKQuant,   ///< ggml blocks that carry their own scales inside the data, kept as stored (kquant.h): the
             ///< K-quants' super-blocks of 256, q4_1 / q5_1's blocks of 32
};

/// The activations a format's integer kernels take (ggml's vec_dot_type).
enum class ActivationBlocks {
  kF32,    ///< none: float formats meet fp32 inputs
  kQ8_32,  ///< int8 (or int16) blocks of 32 with one scale each (kernels/q8_activations.h)
  kQ8_K,   ///< ggml's block_q8_K: 256 int8, one float scale, sums per 16 (kquant.h)
  kQ8_1,   ///< ggml's block_q8_1: 32 int8, fp16 scale d and fp16 d · sum (kquant.h)
};

/// One weight format. Rows and their data are laid out as QuantMatrix
/// describes; the codec functions read and write one row-major row.
struct FormatTraits {
  LowBit type;
  std::string_view name;  ///< on the command line: "sym_int4", "q4_k"
  FormatFamily family;
  /// Width of one stored value in bits (32, 16, 8, 4; K-quants: 2..6, q4_1 / q5_1 4 / 5: their quants' width).
  int value_bits;
  /// Integer formats whose zero point is fixed: the zero of their unsigned
  /// integers as GPTQ checkpoints and IntMatrix hold them (sym_int4 8,
  /// sym_int8 128). -1: a zero point per group (asym_int4). 0 otherwise.
  int fixed_zero;
  ActivationBlocks activation_blocks;
  /// What its integer kernels multiply inputs as by default (README, "Activations").
  Activations default_activations;
  /// The ggml type whose blocks this format's rows are (sym_int4 group 32
  /// full range = Q4_0, sym_int8 group 32 = Q8_0, the K-quants), if any.
  std::optional<GgmlType> ggml;
  /// llama.cpp's general.file_type for a model whose linear layers are all
  /// in this format (llama_ftype), if llama.cpp names one.
  std::optional<std::uint32_t> llama_ftype;
  /// Bytes of one row of `cols` weights (cols valid for the format).
  std::int64_t (*row_bytes)(std::int64_t cols);
  /// Encodes x[0, w.cols) (finite) into row storage: data [w.row_bytes],
  /// scales and zeros [w.groups_per_row] (unused by formats without them).
  /// Throws woq::Error when a scale overflows fp16.
  void (*encode_row)(const QuantMatrix& w, const float* x, std::uint8_t* data, std::uint16_t* scales,
                     std::uint8_t* zeros);
  /// out[0, w.cols) from one row's storage (as encode_row writes it), exactly.
  void (*decode_row)(const QuantMatrix& w, const std::uint8_t* data, const std::uint16_t* scales,
                     const std::uint8_t* zeros, float* out);
  /// The round-to-nearest rule of one group (grouped formats; nullptr otherwise; group_rule.h).
  GroupRule (*fit_group)(Int4Range range, const float* x, std::int64_t n);
};

/// Number of LowBit formats (tables indexed by LowBit have this many rows).
inline constexpr std::size_t kFormatCount = 13;

/// Every format, in LowBit order.
std::span<const FormatTraits> weight_formats();
/// The row of `type`. Throws woq::Error for a value outside LowBit.
const FormatTraits& format_traits(LowBit type);
/// The row named `name` (case-insensitive), or nullptr.
const FormatTraits* find_format(std::string_view name);

}  // namespace woq
