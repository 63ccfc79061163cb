// ggml's K-quants (q2_K ... q6_K) as woq keeps them: the super-blocks of 256
// weights exactly as a GGUF file stores them (block layouts of ggml-common.h,
// https://github.com/ggml-org/llama.cpp, ggml/src/ggml-common.h), one traits
// row per format, and ggml's Q8_K activations (block_q8_K) that their integer
// dot products take.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string_view>

#include "formats/ggml_types.h"
#include "formats/low_bit.h"

namespace woq::kquant {

constexpr std::int64_t kSuperBlock = 256;  ///< weights per super-block (ggml's QK_K)

/// ggml's nearest_int (ggml-quants.c), the rounding of every K-quant and Q8_K
/// quantizer: v + 1.5 * 2^23 rounds half to even and leaves the integer in the
/// low mantissa bits. ggml asserts |v| <= 4194303 in debug builds only; beyond
/// that this gives what its release build gives.
constexpr float kNearestIntShift = 12582912.0f;
inline int nearest_int(float v) {
  return static_cast<int>(std::bit_cast<std::uint32_t>(v + kNearestIntShift) & 0x007fffff) - 0x00400000;
}
constexpr std::int64_t kQ8KBytes = 292;    ///< block_q8_K: fp32 d, int8 qs[256], int16 bsums[16]

/// One K-quant format: the woq LowBit that holds it and ggml's type.
struct Format {
  LowBit type;
  GgmlType ggml;
  std::string_view name;    ///< woq's name on the command line: "q4_k"
  std::int64_t block_bytes;  ///< bytes per super-block (ggml's type_size)
  std::int64_t d_offset;     ///< byte offset of the fp16 super-block scale d
  std::int64_t dmin_offset;  ///< byte offset of the fp16 super-block min scale dmin; -1 when there is none
};

/// Every K-quant format, q2_K to q6_K.
std::span<const Format> formats();
/// The row of `type`, or nullptr when it is not a K-quant.
const Format* find(LowBit type);
/// The row of ggml type `type`, or nullptr when it is not one woq runs as stored.
const Format* find(GgmlType type);

/// Index of the first of `count` super-blocks of format `f` whose fp16 d or
/// dmin is NaN or infinite, or -1 when all are finite.
std::int64_t first_nonfinite_scale(const Format& f, const std::uint8_t* blocks, std::int64_t count);

/// ggml's quantize_row_q8_K_ref, bit for bit: per super-block of 256, max =
/// the value of largest magnitude (the first of equals), iscale = -127 / max,
/// q = min(127, round-half-even(iscale · x)), d = 1 / iscale, bsums[i] = the
/// sum of q over elements [16 i, 16 i + 16). An all-zero block gets d = 0 and
/// zero quants and sums; a block holding a NaN or infinity gets d = NaN (so
/// that every dot product with it is NaN, as woq's other paths give, where
/// ggml's output is meaningless). k % 256 == 0 (woq::Error otherwise).
void quantize_q8_k(const float* x, std::int64_t k, std::uint8_t* blocks);

/// ggml's reference K-quant quantizers (quantize_row_q<N>_K_ref of
/// ggml-quants.c, what llama-quantize writes without an importance matrix),
/// byte for byte: k finite values (k % 256 == 0) into k / 256 super-blocks.
/// Throws woq::Error on a NaN/Inf value, a partial super-block, or an fp16
/// super-block scale that overflows. Reached through ggml_type_traits(t).from_float.
void quantize_q2_K(const float* x, std::int64_t k, std::uint8_t* blocks);
void quantize_q3_K(const float* x, std::int64_t k, std::uint8_t* blocks);  ///< see quantize_q2_K
void quantize_q4_K(const float* x, std::int64_t k, std::uint8_t* blocks);  ///< see quantize_q2_K
void quantize_q5_K(const float* x, std::int64_t k, std::uint8_t* blocks);  ///< see quantize_q2_K
void quantize_q6_K(const float* x, std::int64_t k, std::uint8_t* blocks);  ///< see quantize_q2_K

/// One super-block's contents as integers: weight p is
/// d · scale[p / 16] · q[p] - dmin · min[p / 16] (q4_K/q5_K repeat each
/// 32-element scale and min twice; q3_K/q6_K have no min and signed q).
struct Unpacked {
  float d = 0.0f;
  float dmin = 0.0f;
  std::int8_t q[kSuperBlock];
  std::int16_t scale[16];
  std::int16_t min[16];
};

/// Decodes one super-block of format `type` (a K-quant; woq::Error otherwise).
void unpack(LowBit type, const std::uint8_t* block, Unpacked& out);

}  // namespace woq::kquant
