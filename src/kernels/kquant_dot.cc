#include "kernels/kquant_dot.h"

#include <cmath>
#include <cstring>
#include <utility>

#include "core/error.h"
#include "core/half.h"
#include "formats/kquant.h"

// Compiled with -ffp-contract=off: the fused operations are the std::fma calls.

namespace woq {
namespace {

using kquant::kSuperBlock;
using kquant::kQ8KBytes;

float half_at(const std::uint8_t* p) {
  std::uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// The float8 horizontal sum of ggml's x86 kernels (hsum_float_8).
float hsum8(const float* acc) {
  float r[4];
  for (int i = 0; i < 4; ++i) r[i] = acc[4 + i] + acc[i];
  return (r[0] + r[2]) + (r[1] + r[3]);
}

template <LowBit T>
float dot_reference(const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  const std::int64_t bytes = kquant::find(T)->block_bytes;
  float acc[8] = {}, acc_m[4] = {}, summs = 0.0f;
  kquant::Unpacked u;
  for (std::int64_t b = 0; b < blocks; ++b, w += bytes, a += kQ8KBytes) {
    kquant::unpack(T, w, u);
    float da;
    std::memcpy(&da, a, 4);
    const auto* q8 = reinterpret_cast<const std::int8_t*>(a + 4);
    std::int16_t bsums[16];
    std::memcpy(bsums, a + 4 + kSuperBlock, sizeof bsums);
    const float d = da * u.d;
    const float dmin = -da * u.dmin;
    if constexpr (T == LowBit::kQ2_K) {
      for (int l = 0; l < 8; ++l) {
        const int prod = u.min[2 * l] * bsums[2 * l] + u.min[2 * l + 1] * bsums[2 * l + 1];
        acc[l] = std::fma(dmin, static_cast<float>(prod), acc[l]);
      }
    }
    if constexpr (T == LowBit::kQ4_K || T == LowBit::kQ5_K) {
      // mins per 32 elements (u.min[4 i] and u.min[4 i + 2]) times the activations' sums per 32.
      int prod[4];
      for (int i = 0; i < 4; ++i) {
        const int s0 = bsums[4 * i] + bsums[4 * i + 1], s1 = bsums[4 * i + 2] + bsums[4 * i + 3];
        prod[i] = u.min[4 * i] * s0 + u.min[4 * i + 2] * s1;
      }
      if constexpr (T == LowBit::kQ4_K) {
        for (int i = 0; i < 4; ++i) acc_m[i] = std::fma(dmin, static_cast<float>(prod[i]), acc_m[i]);
      } else {
        summs = std::fma(dmin, static_cast<float>((prod[0] + prod[1]) + (prod[2] + prod[3])), summs);
      }
    }
    int sumi[8] = {};
    for (int p = 0; p < kSuperBlock; ++p) sumi[p % 32 / 4] += u.scale[p / 16] * u.q[p] * q8[p];
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  if constexpr (T == LowBit::kQ4_K) return hsum8(acc) + ((acc_m[0] + acc_m[2]) + (acc_m[1] + acc_m[3]));
  if constexpr (T == LowBit::kQ5_K) return hsum8(acc) + summs;
  return hsum8(acc);
}

// q4_1 / q5_1 (blocks of 32: fp16 d, m, q5_1's qh[4], qs[16]) with Q8_1 activations, ggml's
// ggml_vec_dot_q<4|5>_1_q8_1 (x86 __AVX2__ branch): per block, eight exact int32 sums of four
// consecutive products each, acc[l] = fma(d_w · d_a, sum, acc[l]), the mins' term m · s in one
// running float (fma: GCC contracts ggml's summs += m * s); then the float8 sum plus it.
template <LowBit T>
float dot_reference_q8_1(const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  constexpr bool kFive = T == LowBit::kQ5_1;
  float acc[8] = {}, summs = 0.0f;
  for (std::int64_t b = 0; b < blocks; ++b, w += kFive ? 24 : 20, a += kquant::kQ8_1Bytes) {
    summs = std::fma(half_at(w + 2), half_at(a + 2), summs);
    std::uint32_t qh = 0;
    if constexpr (kFive) std::memcpy(&qh, w + 4, 4);
    const std::uint8_t* qs = w + (kFive ? 8 : 4);
    const auto* q8 = reinterpret_cast<const std::int8_t*>(a + 4);
    int sumi[8] = {};
    for (int p = 0; p < 32; ++p) {
      const int q = ((p < 16 ? qs[p] : qs[p - 16] >> 4) & 0x0f) | static_cast<int>((qh >> p) & 1) << 4;
      sumi[p / 4] += q * q8[p];
    }
    const float d = half_at(w) * half_at(a);
    for (int l = 0; l < 8; ++l) acc[l] = std::fma(d, static_cast<float>(sumi[l]), acc[l]);
  }
  return hsum8(acc) + summs;
}

// The reference for several tokens: one after another.
template <float (*Reference)(const std::uint8_t*, const std::uint8_t*, std::int64_t)>
void dot_tokens(const std::uint8_t* w, const std::uint8_t* a, std::int64_t stride, int tokens, std::int64_t blocks,
                float* out) {
  for (int j = 0; j < tokens; ++j) out[j] = Reference(w, a + j * stride, blocks);
}

using Reference = float (*)(const std::uint8_t*, const std::uint8_t*, std::int64_t);

template <Reference R>
std::pair<Reference, KQuantDot> pair() {
  return {R, dot_tokens<R>};
}

std::pair<Reference, KQuantDot> reference_of(LowBit type) {
  switch (type) {
    case LowBit::kQ2_K: return pair<dot_reference<LowBit::kQ2_K>>();
    case LowBit::kQ3_K: return pair<dot_reference<LowBit::kQ3_K>>();
    case LowBit::kQ4_K: return pair<dot_reference<LowBit::kQ4_K>>();
    case LowBit::kQ5_K: return pair<dot_reference<LowBit::kQ5_K>>();
    case LowBit::kQ6_K: return pair<dot_reference<LowBit::kQ6_K>>();
    case LowBit::kQ4_1: return pair<dot_reference_q8_1<LowBit::kQ4_1>>();
    case LowBit::kQ5_1: return pair<dot_reference_q8_1<LowBit::kQ5_1>>();
    default: fail("kquant_dot: {} is not a block format kept as stored", low_bit_name(type));
  }
}

}  // namespace

float kquant_dot_reference(LowBit type, const std::uint8_t* w, const std::uint8_t* a, std::int64_t blocks) {
  return reference_of(type).first(w, a, blocks);
}

KQuantDot kquant_dot(LowBit type, Isa isa) {
  const KQuantDot reference = reference_of(type).second;
  if (isa == Isa::kScalar) return reference;
  const KQuantDot kernel = isa == Isa::kAvx2 ? detail::kquant_dot_avx2(type) : detail::kquant_dot_avx512(type);
  return kernel != nullptr ? kernel : reference;
}

}  // namespace woq
