// Dot products of K-quant weight rows (formats/kquant.h) with Q8_K
// activations: what llama.cpp computes for the same GGUF file.
//
// Every ISA returns the bits of the scalar reference, which performs the
// operations of ggml's x86 kernels (ggml_vec_dot_q<N>_K_q8_K, the __AVX2__
// branch of ggml-cpu-quants.c, llama.cpp c392e5094; the branch every x86-64
// build with AVX2 runs, AVX-512 ones included) in their order: per
// super-block, eight exact int32 sums, sum l over the elements p with
// (p mod 32) / 4 == l of scale · q · a, each met by acc[l] = fma(d, sum, acc[l])
// with d = d_a · d_w; the mins' term of q2_K in acc, of q4_K in four lanes,
// of q5_K in one running float (fma); then the float8 horizontal sum
// ((l + l+4) pairs, then (0+2) + (1+3)).
//
// q4_1 / q5_1 rows (blocks of 32) meet Q8_1 activations (kquant::quantize_q8_1)
// the same way (ggml_vec_dot_q<4|5>_1_q8_1, __AVX2__ branch): per block,
// eight int32 sums of four consecutive products, acc[l] = fma(d_w · d_a, sum,
// acc[l]), the min's term m · s in one running float (fma), then the float8
// sum plus it.
#pragma once

#include <cstdint>

#include "core/cpu.h"
#include "formats/low_bit.h"

namespace woq {

/// Most tokens one KQuantDot call takes.
inline constexpr int kKQuantTokens = 4;

/// out[j] = Σ over `blocks` super-blocks of one K-quant weight row `w` times
/// the activations of token j (the format's kquant::quantize_activations
/// blocks of the same length, at a + j · stride bytes), for j < tokens
/// (1 ... kKQuantTokens); `blocks` counts the format's blocks.
/// Each out[j] has the same bits whatever `tokens` (the prefill kernels unpack
/// a row's weights once for several tokens).
using KQuantDot = void (*)(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, int tokens,
                           std::int64_t blocks, float* out);

/// The kernel of `type` (a kquant::formats() row; woq::Error otherwise) for `isa`: every
/// ISA gives the scalar reference's bits.
KQuantDot kquant_dot(LowBit type, Isa isa = active_isa());

/// The scalar reference of `type`.
float kquant_dot_reference(LowBit type, const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks);

namespace detail {
/// The AVX2 and AVX-512 (VL + VNNI) kernels of `type`, or nullptr (kquant_dot_avx2.cc, kquant_dot_avx512.cc).
KQuantDot kquant_dot_avx2(LowBit type);
KQuantDot kquant_dot_avx512(LowBit type);
}  // namespace detail

}  // namespace woq
