// ggml's block formats that woq keeps as a GGUF file stores them, blocks that
// carry their own scales: the K-quants (q2_K ... q6_K, super-blocks of 256)
// and q4_1 / q5_1 (blocks of 32 with a scale and a min). Block layouts of
// ggml-common.h (https://github.com/ggml-org/llama.cpp, ggml/src/ggml-common.h),
// one traits row per format, and the activations their integer dot products
// take (ggml's vec_dot_type): Q8_K (block_q8_K) for the K-quants, Q8_1
// (block_q8_1) for q4_1 / q5_1.
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
constexpr std::int64_t kQ8_1Bytes = 36;    ///< block_q8_1: fp16 d, fp16 s (= d · Σ qs), int8 qs[32]

/// One block format: the woq LowBit that holds it and ggml's type.
struct Format {
  LowBit type;
  GgmlType ggml;
  std::string_view name;    ///< woq's name on the command line: "q4_k"
  std::int64_t block_bytes;  ///< bytes per block (ggml's type_size)
  std::int64_t d_offset;     ///< byte offset of the fp16 (super-)block scale d
  std::int64_t dmin_offset;  ///< byte offset of the fp16 min scale dmin (q4_1/q5_1: the min m); -1 when there is none
  std::int64_t block;        ///< weights per block (ggml's blck_size): 256 (K-quants) or 32
  GgmlType activation;       ///< the activation blocks of its integer kernels (ggml's vec_dot_type): kQ8_K or kQ8_1
};

/// Every block format woq keeps as stored: q2_K to q6_K, then q4_1 and q5_1.
std::span<const Format> formats();
/// The row of `type`, or nullptr when it is not a block format kept as stored.
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

/// ggml's quantize_row_q8_1 as its x86 build runs it (the __AVX2__ branch of
/// ggml-cpu-quants.c, llama.cpp c392e5094), bit for bit: per block of 32,
/// amax = max |x|, d = amax / 127, id = 127 / amax (0 when amax is 0),
/// q = round-half-even(x · id), d stored as fp16, s = fp16(d · Σ q) with the
/// unrounded d. A block holding a NaN or infinity gets d = s = NaN and zero
/// quants (every product with it is NaN, as quantize_q8_k). k % 32 == 0
/// (woq::Error otherwise).
void quantize_q8_1(const float* x, std::int64_t k, std::uint8_t* blocks);

/// Bytes of the activation blocks (f.activation) of one token of k inputs (k % f.block == 0).
inline std::int64_t activation_bytes(const Format& f, std::int64_t k) {
  return k / f.block * (f.activation == GgmlType::kQ8_K ? kQ8KBytes : kQ8_1Bytes);
}
/// What a matrix of format `type` multiplies its inputs as, by name: ggml's
/// "q8_K" / "q8_1" for a block format's int8 activations, else activations_name(a).
std::string_view activations_label(LowBit type, Activations a);

/// One token's k inputs as f's activation blocks: quantize_q8_k or quantize_q8_1.
void quantize_activations(const Format& f, const float* x, std::int64_t k, std::uint8_t* blocks);

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
