// The weight formats woq stores linear layers in, and the container that
// holds one quantized matrix. Each low-bit format's codec (layout and
// round-to-nearest rule) lives in its own header beside this one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace woq {

class ThreadPool;

/// Storage format of a weight matrix. The quantized ones are group-wise
/// along the input dimension K with one fp16 scale per group.
enum class LowBit {
  kFp32,      ///< IEEE float32, unquantized.
  kFp16,      ///< IEEE binary16, unquantized.
  kBf16,      ///< bfloat16, unquantized.
  kSymInt4,   ///< 4-bit symmetric, ggml Q4_0 rule (see sym_int4.h).
  kAsymInt4,  ///< 4-bit with a zero point per group, GPTQ/AWQ rule (see asym_int4.h).
  kSymInt8,   ///< 8-bit symmetric, per group or per output channel (see sym_int8.h).
  /// ggml's K-quants, kept as a GGUF file stores them: super-blocks of 256
  /// weights that carry their own scales (formats/kquant.h); their integer
  /// kernels take Q8_K activations (kernels/kquant_dot.h).
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  /// ggml's q4_1 and q5_1, kept as a GGUF file stores them: blocks of 32
  /// weights q · d + m with their own fp16 d and m (formats/kquant.h); their
  /// integer kernels take Q8_1 activations (kernels/kquant_dot.h).
  kQ4_1,
  kQ5_1,
};

/// Which integer range sym_int4 uses: ggml Q4_0's full [-8, 7] (scale =
/// signed max / -8), or the clipped [-7, 7] (scale = amax / 7, "S4_Clip").
enum class Int4Range { kFull, kClip };

/// What an integer-format matrix multiplies its inputs as.
enum class Activations {
  /// Inputs quantized to int8 per block of 32 (ggml Q8_0's activations) and
  /// met by integer dot products: fast, and adds the inputs' rounding
  /// (~amax/254 per value) to the weights' (w4a8 / w8a8).
  kInt8,
  /// Inputs as they are; weights dequantized to fp32 inside the dot product:
  /// the weights' error alone (w4a16 / w8a16, as vLLM and transformers run
  /// GPTQ checkpoints), at the cost of float arithmetic.
  kF32,
  /// Inputs rounded to bf16 (nearest even; subnormals to zero), met by the
  /// weights' exact integers (q - zero, which bf16 holds exactly) in products
  /// summed in fp32 per group, then scaled: bf16 dot products on CPUs that
  /// have them (AVX512_BF16 vdpbf16ps, AMX-BF16 tiles). Adds the inputs'
  /// relative rounding (2^-9 per value) to the weights' error: w4a16 / w8a16
  /// at the matrix engines' speed. Integer formats whose groups are whole
  /// blocks of 32 (kernels/matmul.h).
  kBf16,
  /// Inputs quantized to int16 per block of 32 (d = amax / 32512, each value
  /// held as 255·hi + lo with hi, lo int8 in [-127, 127]) and met by the
  /// integer dot products of the int8 path, two per block (hi, lo), summed
  /// exactly in int32: the inputs' rounding is ~amax/65024 per value (about
  /// 256x int8's, and below bf16's 2^-9 of each value unless a block's
  /// values span more than ~100x), at about the integer path's speed
  /// (w8a16 at memory bandwidth on decode, on VNNI and AMX-INT8 on prefill).
  /// Integer formats whose groups are whole blocks of 32 (kernels/matmul.h).
  kInt16,
};

/// "int8", "f32", "bf16" or "int16".
std::string_view activations_name(Activations a);
/// Inverse of activations_name. Throws woq::Error on anything else.
Activations parse_activations(std::string_view name);
/// Each format's default, picked by measurement (README, "Activations").
Activations default_activations(LowBit type);

/// Name as used on the command line: fp32, fp16, bf16, sym_int4, asym_int4, sym_int8, q2_k ... q6_k, q4_1, q5_1.
std::string_view low_bit_name(LowBit type);
/// Inverse of low_bit_name (the K-quants quantize with ggml's reference
/// quantizers, formats/kquant.h). Throws woq::Error listing the valid names.
LowBit parse_low_bit(std::string_view name);
/// True for woq's group-wise integer formats (sym_int4, asym_int4, sym_int8:
/// one fp16 scale per group); false for the K-quants (is_kquant).
bool is_quantized(LowBit type);
/// True for the ggml block formats woq keeps as stored (formats/kquant.h):
/// the K-quants (kQ2_K ... kQ6_K) and kQ4_1 / kQ5_1.
bool is_kquant(LowBit type);
/// True for the float formats (fp32, fp16, bf16): neither is_quantized nor is_kquant.
bool is_float_format(LowBit type);
/// True for the 4-bit formats (sym_int4, asym_int4).
bool is_int4(LowBit type);
/// "full" or "clip".
std::string_view int4_range_name(Int4Range range);
/// Inverse of int4_range_name. Throws woq::Error on anything else.
Int4Range parse_int4_range(std::string_view name);

/// How sym_int4 / sym_int8 values are rounded.
enum class Rounding {
  /// woq's codecs (sym_int4.h, sym_int8.h): the scale rounded to fp16 first,
  /// values divided by it and rounded to nearest even.
  kWoq,
  /// ggml's reference quantizers (quantize_row_q4_0_ref / q8_0_ref; see
  /// formats/ggml_types.h): scale from the unrounded float, Q4_0 truncation
  /// of x/d + 8.5, Q8_0 round half away from zero. About 1 weight in 4000
  /// lands one step away from woq's choice. Needs group 32 (and the full
  /// int4 range) and K a multiple of 32.
  kGgml,
};

/// "woq" or "ggml".
std::string_view rounding_name(Rounding r);
/// Inverse of rounding_name. Throws woq::Error on anything else.
Rounding parse_rounding(std::string_view name);

/// How to store one matrix.
struct QuantSpec {
  LowBit type = LowBit::kSymInt4;
  /// Elements sharing one scale along K; -1 = one group per row (per output
  /// channel). Ignored for fp32/fp16/bf16. For 4-bit types it must be even
  /// so that groups start on a byte boundary.
  std::int64_t group_size = 32;
  Int4Range int4_range = Int4Range::kFull;
  Rounding rounding = Rounding::kWoq;  ///< sym_int4 / sym_int8 only
};

/// A weight matrix W of shape [rows = N output features, cols = K input
/// features], stored row by row in one of the LowBit formats. K-quant rows
/// are K / 256 ggml super-blocks (row_bytes = K / 256 · bytes per block;
/// group_size 256, scales and zeros empty, never interleaved). Row n starts at
/// data[n * row_bytes]; its groups are [g*group_size, min((g+1)*group_size, K)),
/// so the last group of a row may be shorter. Rows never share a byte.
/// Integer matrices may instead be stored row-interleaved for the kernels
/// (interleave == 8, formats/interleave.h); row_bytes keeps its row-major
/// meaning and dequantize_row / to_int_matrix read either layout.
struct QuantMatrix {
  LowBit type = LowBit::kFp32;
  Int4Range int4_range = Int4Range::kFull;  ///< meaningful for kSymInt4 only
  std::int64_t rows = 0;
  std::int64_t cols = 0;
  std::int64_t group_size = 0;      ///< effective group length (K when per channel); 0 for float types
  std::int64_t groups_per_row = 0;  ///< ceil(K / group_size); 0 for float types
  std::int64_t row_bytes = 0;       ///< bytes of one packed row in the row-major layout
  std::vector<std::uint8_t> data;   ///< [rows, row_bytes], or interleaved blocks
  std::vector<std::uint16_t> scales;  ///< fp16 bits [rows, groups_per_row]; empty for float types
  std::vector<std::uint8_t> zeros;    ///< asym_int4 zero points in [0, 15], [rows, groups_per_row]
  /// 1: row-major; kInterleaveRows (8): rows interleaved by 8 (formats/interleave.h).
  std::int64_t interleave = 1;
  /// Act-order (GPTQ desc_act) matrices: stored column k multiplies input
  /// x[input_order[k]], so that each group is contiguous in storage although
  /// its input features are scattered. Empty = identity (the usual case).
  std::vector<std::int32_t> input_order;
  /// Integer formats: what the inputs are multiplied as (ignored for float types).
  Activations activations = Activations::kInt8;

  /// Bytes of weight storage (data + scales + zeros).
  std::size_t bytes() const;
};

/// Throws woq::Error unless spec.group_size is -1 or positive (and even for
/// the 4-bit types, so that groups start on a byte boundary), and unless
/// ggml rounding comes with sym_int4 (full range) or sym_int8 at group 32.
/// Float types accept any group size (it is ignored).
void validate(const QuantSpec& spec);
/// "sym_int4 (group_size 32, full range)", "sym_int8 (per channel)", "fp16".
std::string describe(const QuantSpec& spec);

/// Supplies row `row` of a source matrix as fp32 into out[0, cols).
/// Called concurrently from several threads for different rows.
using RowReader = std::function<void(std::int64_t row, float* out)>;

/// Stores a [rows, cols] matrix read row by row from `read_row` in `spec`'s
/// format by round-to-nearest, holding only one fp32 row per thread. Rows are
/// processed in parallel when `pool` is given. Throws woq::Error on an invalid
/// group size, on a NaN/Inf input (naming the row and column) or when a
/// group's scale overflows fp16.
QuantMatrix quantize_matrix(const RowReader& read_row, std::int64_t rows, std::int64_t cols,
                            const QuantSpec& spec, ThreadPool* pool = nullptr);

/// Throws woq::Error naming `row` and the column of the first NaN or ±inf in
/// x[0, cols): what quantize_matrix refuses.
void require_finite_row(const float* x, std::int64_t cols, std::int64_t row);

/// quantize_matrix of the row-major fp32 matrix `src`.
QuantMatrix quantize_matrix(const float* src, std::int64_t rows, std::int64_t cols,
                            const QuantSpec& spec, ThreadPool* pool = nullptr);

/// The fields allocate_matrix(rows, cols, spec) sets (type, shape,
/// group_size, groups_per_row, row_bytes), with empty buffers: the layout a
/// stored matrix must have. Throws woq::Error as allocate_matrix does.
QuantMatrix matrix_layout(std::int64_t rows, std::int64_t cols, const QuantSpec& spec);

/// An all-zero [rows, cols] matrix in `spec`'s format with every buffer
/// sized (scales and zeros zeroed): for importers that fill in stored
/// integers. Throws woq::Error on an empty shape or an invalid spec.
QuantMatrix allocate_matrix(std::int64_t rows, std::int64_t cols, const QuantSpec& spec);

/// Reference dequantization of row `row` of `w` into out[0, cols), in input
/// feature order (input_order applied).
void dequantize_row(const QuantMatrix& w, std::int64_t row, float* out);

/// Dequantization of row `row` in storage order (input_order ignored): what
/// kernels that also gather their input by input_order need.
void dequantize_stored_row(const QuantMatrix& w, std::int64_t row, float* out);

}  // namespace woq
