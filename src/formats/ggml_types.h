// ggml's tensor types as GGUF files store them: one traits row per type
// (ggml's type_traits[]: name, elements per block, bytes per block, a
// dequantizer), and the conversions between ggml's Q4_0/Q8_0 blocks and
// woq's sym_int4/sym_int8 rows. Block layouts and rounding rules follow
// ggml-quants.c (https://github.com/ggml-org/llama.cpp, ggml/src/ggml-quants.c)
// and the GGUF specification (ggml/docs/gguf.md).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "formats/low_bit.h"

namespace woq {

/// ggml_type numbers as written in a GGUF tensor info.
enum class GgmlType : std::uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21, kIQ2_S = 22,
  kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28, kIQ1_M = 29, kBF16 = 30,
  kTQ1_0 = 34, kTQ2_0 = 35,
};

/// Dequantizes n elements (a multiple of the block size; woq::Error otherwise)
/// from `blocks` into out[0, n).
using GgmlToFloat = void (*)(const std::uint8_t* blocks, float* out, std::int64_t n);
/// A block type whose values are integers in [-127, 127] times one fp16 scale
/// per 32 (q8_0, q5_0, iq4_nl): n elements as int8 q[n] and fp16 bits
/// scales[n / 32], exactly. Returns false when a value is -128 (a q8_0 block
/// ggml's quantizer never writes), which woq's sym_int8 cannot hold.
using GgmlToInt8 = bool (*)(const std::uint8_t* blocks, std::int64_t n, std::int8_t* q, std::uint16_t* scales);
/// Quantizes n finite values x[0, n) (n a multiple of the block size) into
/// `blocks`. Throws woq::Error on a NaN/Inf input, a partial block, or a scale
/// beyond fp16 (where ggml's output is meaningless).
using GgmlFromFloat = void (*)(const float* x, std::int64_t n, std::uint8_t* blocks);

/// One ggml type: how its elements are laid out, and what woq does with it.
struct GgmlTypeTraits {
  GgmlType type;
  std::string_view name;    ///< ggml's name: "q4_0", "q6_K", "f16", ...
  std::int64_t block_size;  ///< elements per block (1 for plain types)
  std::int64_t type_size;   ///< bytes per block
  /// ggml's dequantize_row_<type> (f16/bf16: ggml's *_to_fp32_row; f32 and
  /// f64, which ggml has none for: plain conversion), bit for bit.
  /// nullptr: woq cannot decode it (IQ*, TQ*, q8_1, integer types).
  GgmlToFloat to_float;
  /// What llama-quantize writes without an importance matrix, byte for byte:
  /// ggml's from_float_ref (quantize_row_<type>_ref; iq4_nl: quantize_iq4_nl,
  /// whose search differs from its _ref; f16/bf16 round to nearest even).
  /// nullptr: woq does not write this type.
  GgmlFromFloat from_float;
  /// The type as woq's sym_int8 group 32, losslessly (GgmlToInt8); nullptr
  /// for the other types.
  GgmlToInt8 to_int8;
  /// The woq format a weight of this type becomes when it is not used as
  /// stored (Q4_0 and Q8_0 are used as stored: sym_int4 g32 full range /
  /// sym_int8 g32; so are the K-quants, q4_1 and q5_1: formats/kquant.h).
  /// Rule, by the width of the type's quants rather than its bits per weight
  /// (q4_1 spends 5, q5_0 5.5): quants of at most 4 bits (q4_*, q2_K, q3_K,
  /// q4_K, every IQ and TQ type) -> sym_int4; 5 bits or more (q5_*, q5_K, q6_K, q8_*) -> sym_int8, since 4 bits would lose what
  /// they hold; f16 -> fp16, bf16 -> bf16, f32 / f64 / integer types -> fp32.
  LowBit closest;
};

/// The row for ggml type number `type`, or nullptr for a number ggml lacks.
const GgmlTypeTraits* find_ggml_type(std::uint32_t type);
/// The row for `type` (which must exist).
const GgmlTypeTraits& ggml_type_traits(GgmlType type);
/// Every known type, in type-number order.
std::span<const GgmlTypeTraits> ggml_types();

/// Bytes of n elements of `t` (n a multiple of t.block_size).
inline std::int64_t ggml_row_bytes(const GgmlTypeTraits& t, std::int64_t n) { return n / t.block_size * t.type_size; }

namespace ggml {

constexpr std::int64_t kQK = 32;            ///< elements per Q4_0 / Q8_0 block
constexpr std::int64_t kQ4_0Bytes = 18;     ///< fp16 d + 16 bytes of nibbles
constexpr std::int64_t kQ8_0Bytes = 34;     ///< fp16 d + 32 int8

/// ggml's reference Q4_0 quantizer (quantize_row_q4_0_ref): per block of 32,
/// m = the value of largest magnitude, d = m / -8 (unrounded float),
/// q = min(15, (int8)(x * (1/d) + 8.5)); d stored as fp16 (round to nearest
/// even, as ggml's GGML_FP32_TO_FP16). Of equal magnitudes the first is m.
/// k % 32 == 0. Throws woq::Error on a NaN/Inf input or a d beyond fp16
/// (where ggml's output is meaningless or undefined).
void quantize_q4_0_ggml(const float* x, std::int64_t k, std::uint8_t* blocks);
/// ggml's reference Q8_0 quantizer (quantize_row_q8_0_ref): d = amax / 127,
/// q = roundf(x * (1/d)) (half away from zero, unlike woq's sym_int8, which
/// rounds half to even and divides by the fp16 d). k % 32 == 0. Throws as
/// quantize_q4_0_ggml.
void quantize_q8_0_ggml(const float* x, std::int64_t k, std::uint8_t* blocks);

/// The j-th (scale, min) pair (j < 8, six bits each) of q4_K / q5_K's 12
/// packed scale bytes `q` (ggml's get_scale_min_k4).
void scale_min_k4(int j, const std::uint8_t* q, int& sc, int& m);

/// woq sym_int4 row (nibble j of byte j/2, low nibble first; fp16 scale per
/// group of 32) -> Q4_0 blocks (block b: d, then qs[i] = element i in the low
/// nibble, element i + 16 in the high nibble). k % 32 == 0. Lossless.
void q4_0_from_sym_int4(const std::uint8_t* q, const std::uint16_t* scales, std::int64_t k, std::uint8_t* blocks);
/// Inverse of q4_0_from_sym_int4. Lossless.
void sym_int4_from_q4_0(const std::uint8_t* blocks, std::int64_t k, std::uint8_t* q, std::uint16_t* scales);
/// woq sym_int8 row (k int8, fp16 scale per group of 32) -> Q8_0 blocks. Lossless.
void q8_0_from_sym_int8(const std::int8_t* q, const std::uint16_t* scales, std::int64_t k, std::uint8_t* blocks);
/// Inverse of q8_0_from_sym_int8. Returns false when a block holds -128,
/// which woq's sym_int8 (range [-127, 127]) cannot represent; q is then
/// still written (with -128).
bool sym_int8_from_q8_0(const std::uint8_t* blocks, std::int64_t k, std::int8_t* q, std::uint16_t* scales);

}  // namespace ggml

}  // namespace woq
