// Matrix products with weights in any LowBit format, dequantized inside the
// dot product (the weights are never expanded to fp32 in memory).
#pragma once

#include <cstdint>
#include <span>

#include "core/cpu.h"
#include "formats/group_rule.h"
#include "formats/low_bit.h"
#include "kernels/bf16_activations.h"
#include "kernels/q8_activations.h"
#include "kernels/workspace.h"

namespace woq {

class ThreadPool;

/// y = x · Wᵀ: y[i, n] = Σ_k x[i, k] · W[n, k] for i < m, n < W.rows.
///
/// x: [m, W.cols] fp32 row-major; y: [m, W.rows] fp32 row-major (must not
/// alias x). Parallel over output rows n.
///
/// Integer formats with int8 activations (W.activations) whose group_size is
/// a multiple of 32 (or per channel) take the integer path: x is quantized
/// to int8 per block of 32 (q8_activations.h) and each weight block meets it
/// in an integer dot product (AVX2 maddubs, AVX-512 VNNI vpdpbusd, AMX-INT8), scaled by the weight and
/// activation scales; this adds the activation's rounding (~amax/254 per
/// value) to the weights'. With int16 activations (Activations::kInt16) the
/// same kernels take two dot products per block, of the high and the low
/// int8 parts (q8_activations.h), and add them exactly (~amax/65024 per value). With bf16 activations the same matrices take the
/// bf16 path: x rounded to bf16 (bf16_activations.h), each group's products
/// with the weights' integers summed in fp32, then scaled (AVX512_BF16
/// vdpbf16ps, AMX-BF16 tdpbf16ps; emulated in fp32 FMAs on the other ISAs).
/// Both must be row-interleaved first (prepare_for_kernels; woq::Error
/// otherwise). Everything else takes the float path: a weight
/// row is widened to fp32 (quantized ones dequantized exactly, (q - z) · s)
/// and meets x in an fp32 dot product; for m >= 4 (prefill) tiles of widened
/// rows are reused across many inputs. Every output is the same dot product
/// whatever m, so results do not depend on the batch.
///
/// `isa` selects the kernels (the scalar ones are the reference). On the
/// integer path every ISA gives the same bits; on the bf16 path every ISA but
/// amx gives the reference's bits (amx's tiles sum in their own order, and
/// agree to float rounding) — except that avx512_bf16 and amx flush sums that
/// fall below fp32's normal range to zero; on the float path results agree
/// to float rounding. On every path, within one ISA, an output does not
/// depend on m, the other inputs or the thread count.
///
/// `ws` holds the buffers the call reuses (quantized activations, per-thread
/// scratch); the overload without one uses a temporary Workspace.
void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool, Workspace& ws,
            Isa isa = active_isa());
void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
            Isa isa = active_isa());

/// One matrix of matmul_shared_input and where its product goes: y [m, w->rows].
struct MatmulOutput {
  const QuantMatrix* w;
  float* y;
};

/// matmul of one input x [m, K] by several matrices of K columns each (q/k/v,
/// gate/up): the same outputs, bit for bit, as one matmul per matrix, but
/// with the activations quantized once and one parallel pass (one wake-up of
/// the pool) over the rows of all of them when they take the same path and
/// none has an act-order (else one matmul each). Throws woq::Error when the
/// column counts differ.
void matmul_shared_input(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool,
                         Workspace& ws, Isa isa = active_isa());
void matmul_shared_input(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool,
                         Isa isa = active_isa());

/// Σ_i a[i] · b[i] over fp32 vectors of length n (attention scores).
float dot(const float* a, const float* b, std::int64_t n, Isa isa = active_isa());

/// y[i] += a · x[i] for i < n (attention's weighted sum of values).
void axpy(float a, const float* x, float* y, std::int64_t n, Isa isa = active_isa());

/// out[k] = W[row, k] as stored, k < W.cols: dequantize_row's values (exactly), fp16 / bf16 widened with
/// F16C / shifts where the ISA has them. W must not be interleaved (prepare_for_kernels leaves float
/// matrices and K-quants flat).
void widen_row(const QuantMatrix& w, std::int64_t row, float* out, Isa isa = active_isa());

/// True when `w` takes the integer path of matmul (int8 or int16 activations).
bool uses_q8_path(const QuantMatrix& w);

/// True when `w` takes the bf16 path of matmul (Activations::kBf16 on a
/// matrix the integer path could take).
bool uses_bf16_path(const QuantMatrix& w);

/// Puts `w` in the layout its matmul path reads: matrices that take the
/// integer or the bf16 path are row-interleaved (formats/interleave.h), in parallel when
/// `pool` is given; others are left as they are. Call once after loading
/// and after setting w.activations.
void prepare_for_kernels(QuantMatrix& w, ThreadPool* pool = nullptr);

/// True when `spec` rounds by a group rule (sym_int4, asym_int4, sym_int8 with woq's rounding):
/// what quantize_row_groups takes.
bool has_group_rule(const QuantSpec& spec);

/// One row x[0, cols) fitted and quantized by the group rule of `type` (sym_int4, asym_int4 or sym_int8:
/// fit_group then GroupRule::quantize, formats/group_rule.h) in groups of `group`, in `isa`'s vectors with
/// the same bits on every ISA: q[0, cols) the stored integers, rules[g] each group's rule (its
/// value(q) is the dequantized weight). Returns false, with nothing defined stored, when x holds a NaN or
/// ±inf. Throws woq::Error as fit_group does (a scale that overflows fp16), and for a group below 1 (one
/// group per row is group = cols).
bool quantize_row_groups(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                         std::int32_t* q, GroupRule* rules, Isa isa = active_isa());

/// quantize_matrix(read_row, rows, cols, spec, &pool) with w.activations =
/// `activations`, then prepare_for_kernels: the same bytes, written straight
/// into the interleaved layout where the kernels read one
/// (put_interleaved_row: no row-major copy), rows fitted and rounded by
/// `isa`'s vector code (the same bits on every ISA). Throws
/// woq::Error as quantize_matrix does.
QuantMatrix quantize_for_kernels(const RowReader& read_row, std::int64_t rows, std::int64_t cols,
                                 const QuantSpec& spec, Activations activations, ThreadPool& pool,
                                 Isa isa = active_isa());

namespace detail {

/// Rows one dot_rows call covers at most.
inline constexpr std::int64_t kDotRows = 8;

/// dot_rows by DotRow, one row after another (the ISAs without a multi-row kernel).
template <float (*DotRow)(const QuantMatrix&, std::int64_t, const float*, float*)>
void dot_rows_by_row(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* out,
                     float* scratch) {
  for (std::int64_t i = 0; i < rows; ++i) out[i] = DotRow(w, r0 + i, x, scratch);
}

/// quantize_row_groups of one ISA (see there).
using QuantizeGroups = bool (*)(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                                std::int32_t* q, GroupRule* rules);
/// QuantizeGroups by fit_group and GroupRule::quantize themselves.
bool quantize_groups_scalar(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                            std::int32_t* q, GroupRule* rules);

/// Rows [r0, r1) of x [out.m, out.k] quantized into `out` (sized and zeroed by the caller).
using QuantizeActivationRows = void (*)(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1);
/// quantize_activations_int16's rows by quantize_int16_unit.
void quantize_int16_scalar(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1);

/// One ISA's kernels. Internal to the kernels library.
struct RowKernels {
  /// Σ_k W[row, k] · x[k], equal bit for bit to dot_f32 of the row widened by
  /// widen_row; `scratch` has room for W.cols floats.
  float (*dot_row)(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch);
  /// out[i] = dot_row(w, r0 + i, x) for i < rows (at most kDotRows), bit for bit: ISAs may walk
  /// several rows at once (one pass over x, independent accumulator chains).
  void (*dot_rows)(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const float* x, float* out,
                   float* scratch);
  /// Σ_k a[k] · b[k].
  float (*dot_f32)(const float* a, const float* b, std::int64_t k);
  /// y[k] += a · x[k].
  void (*axpy)(float a, const float* x, float* y, std::int64_t k);
  /// y[t, r] = Σ_k W[r, k] · A[t, k] for the rows of row groups [g0, g1) of
  /// an interleaved W (rows [8 g0, min(8 g1, W.rows))) and t in [t0, t0 + tokens),
  /// with A the int8 activations (or int16 ones, a.wide); y is [a.m, W.rows].
  /// `scratch` is the calling thread's arena (slots kSlotTile*).
  void (*tile_q8)(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a,
                  std::int64_t t0, std::int64_t tokens, float* y, ScratchArena& scratch);
  /// tile_q8 of the bf16 path: the bf16 activations `a` (tokens [t0, t0 + tokens)) against the weights' integers, summed per group (matmul.cc's reference order;
  /// amx's tiles sum in their own order, the same for every batch).
  void (*tile_bf16)(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Bf16Activations& a,
                    std::int64_t t0, std::int64_t tokens, float* y, ScratchArena& scratch);
  /// out[k] = W[row, k] as stored (dequantize_stored_row; fp16/bf16 widened with F16C on AVX2).
  void (*widen_row)(const QuantMatrix& w, std::int64_t row, float* out);
  /// Fills rows [r0, r1) of `out` (sized and zeroed, see quantize_activations) from x [out.m, out.k].
  QuantizeActivationRows quantize_q8;
  /// One row of the bf16 path's activations (bf16_activations.h; the same bits on every ISA).
  RoundRowBf16 round_bf16 = round_row_bf16;
  /// Bytes of activations (int8 or bf16) one tile_q8 or tile_bf16 call's tokens may occupy (to stay in L2 while a thread's
  /// weight rows pass over them; 96 KiB by measurement at 2 threads on Zen 3: 192 KiB left the
  /// K = 11008 down projection at 1.1x its one-thread speed, 96 KiB at 1.4x), and the multiple of
  /// tokens a call gets (but the last).
  std::int64_t tile_chunk_bytes = 96 * 1024;
  std::int64_t tile_chunk_tokens = 4;
  /// y[t · ldy + r] = dot_f32(w + r · ldw, x + t · k, k) for r < rows, t < m, bit for bit: register tiles of
  /// several rows and tokens (each load serves several products), each product's fused multiply-adds in
  /// dot_f32's order. Null: dot_f32 pair by pair (the scalar table).
  void (*dot_f32_tile)(const float* w, std::int64_t ldw, std::int64_t rows, const float* x, std::int64_t m,
                       std::int64_t k, float* y, std::int64_t ldy) = nullptr;
  /// The group rule's quantization of one row (quantize_for_kernels): the same bits on every ISA.
  QuantizeGroups quantize_groups = quantize_groups_scalar;
  /// quantize_q8's int16 twin (quantize_activations_int16; `out` wide): the same bits on every ISA.
  QuantizeActivationRows quantize_int16 = quantize_int16_scalar;
};

/// The kernels of `isa` (one table row per ISA; each ISA's in its own file:
/// matmul.cc, matmul_avx2.cc, matmul_avx512.cc, matmul_avx512_bf16.cc, matmul_amx.cc; avx512's table
/// is avx2's with its own tile_q8 and dot_rows, avx512_bf16's is avx512's with its own tile_bf16, amx's
/// is avx512_bf16's with its own tile_q8 and tile_bf16).
const RowKernels& kernels(Isa isa);
const RowKernels& scalar_kernels();
const RowKernels& avx2_kernels();
const RowKernels& avx512_kernels();
const RowKernels& avx512_bf16_kernels();
const RowKernels& amx_kernels();

}  // namespace detail
}  // namespace woq
