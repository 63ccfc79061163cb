#include "formats/ggml_types.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"
#include "formats/kquant.h"
#include "formats/scale.h"

// The dequantizers repeat ggml's float operations one for one, in ggml's order
// (e.g. q6_K is (d * scale) * q, q4_K is (d * sc) * q - (dmin * m)). The build
// compiles this file with -ffp-contract=off: ggml's reference build (plain
// x86-64) never fuses a * b + c, and Q4_0's x * id + 8.5f fused into one
// rounding gives other quants (tests/data/ggml block 21 shows it). In the
// dequantizers a fused form would happen to agree, since an fp16 scale times
// a small integer is exact in float.

namespace woq {
namespace {

constexpr std::int64_t kQK_K = 256;  // elements per K-quant super-block

std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
std::uint64_t load_u64(const std::uint8_t* p) {
  return static_cast<std::uint64_t>(load_u32(p)) | static_cast<std::uint64_t>(load_u32(p + 4)) << 32;
}
void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v & 0xff);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
float half_at(const std::uint8_t* p) { return fp16_to_fp32(load_u16(p)); }
float f(int v) { return static_cast<float>(v); }

void check_multiple(std::int64_t n, std::int64_t block, std::string_view what) {
  if (n < 0 || n % block != 0) fail("{}: {} elements is not a multiple of the block size {}", what, n, block);
}

// ---- plain types ----------------------------------------------------------

void f32_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = std::bit_cast<float>(load_u32(x + 4 * i));
}
// ggml's fp16 table is computed with float arithmetic, which quiets a
// signaling NaN (sets the top mantissa bit); woq's fp16_to_fp32 keeps it.
void f16_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float v = half_at(x + 2 * i);
    y[i] = std::isnan(v) ? std::bit_cast<float>(std::bit_cast<std::uint32_t>(v) | 0x00400000u) : v;
  }
}
void bf16_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(load_u16(x + 2 * i));
}
void f64_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  // ggml has no f64 to_float; the C conversion (round to nearest even) is what any reader does.
  for (std::int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(std::bit_cast<double>(load_u64(x + 8 * i)));
}

// ---- 32-element blocks (ggml-common.h block_q4_0 ... block_q8_0) -----------

// block_q4_0: fp16 d; qs[16]: element j in the low nibble of qs[j], j + 16 in its high nibble.
void q4_0_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, 32, "q4_0");
  for (std::int64_t b = 0; b < n / 32; ++b, x += 18, y += 32) {
    const float d = half_at(x);
    for (int j = 0; j < 16; ++j) {
      y[j] = f((x[2 + j] & 0x0f) - 8) * d;
      y[j + 16] = f((x[2 + j] >> 4) - 8) * d;
    }
  }
}

// block_q4_1: fp16 d, fp16 m; qs[16] as q4_0; value q * d + m.
void q4_1_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, 32, "q4_1");
  for (std::int64_t b = 0; b < n / 32; ++b, x += 20, y += 32) {
    const float d = half_at(x);
    const float m = half_at(x + 2);
    for (int j = 0; j < 16; ++j) {
      y[j] = f(x[4 + j] & 0x0f) * d + m;
      y[j + 16] = f(x[4 + j] >> 4) * d + m;
    }
  }
}

// Q5 blocks: qh (32 bits, little endian) holds the 5th bit of element j at bit j.
int q5_high(std::uint32_t qh, int j) { return static_cast<int>((qh >> j) & 1u) << 4; }

// block_q5_0: fp16 d; qh[4]; qs[16]; value (q - 16) * d.
void q5_0_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, 32, "q5_0");
  for (std::int64_t b = 0; b < n / 32; ++b, x += 22, y += 32) {
    const float d = half_at(x);
    const std::uint32_t qh = load_u32(x + 2);
    for (int j = 0; j < 16; ++j) {
      y[j] = f(((x[6 + j] & 0x0f) | q5_high(qh, j)) - 16) * d;
      y[j + 16] = f(((x[6 + j] >> 4) | q5_high(qh, j + 16)) - 16) * d;
    }
  }
}

// block_q5_1: fp16 d, fp16 m; qh[4]; qs[16]; value q * d + m.
void q5_1_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, 32, "q5_1");
  for (std::int64_t b = 0; b < n / 32; ++b, x += 24, y += 32) {
    const float d = half_at(x);
    const float m = half_at(x + 2);
    const std::uint32_t qh = load_u32(x + 4);
    for (int j = 0; j < 16; ++j) {
      y[j] = f((x[8 + j] & 0x0f) | q5_high(qh, j)) * d + m;
      y[j + 16] = f((x[8 + j] >> 4) | q5_high(qh, j + 16)) * d + m;
    }
  }
}

// block_q8_0: fp16 d; int8 qs[32]; value q * d.
void q8_0_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, 32, "q8_0");
  for (std::int64_t b = 0; b < n / 32; ++b, x += 34, y += 32) {
    const float d = half_at(x);
    for (int j = 0; j < 32; ++j) y[j] = f(static_cast<std::int8_t>(x[2 + j])) * d;
  }
}

// block_iq4_nl: fp16 d; qs[16] as q4_0's, each nibble an index into
// kvalues_iq4nl (ggml-common.h); value d * kvalues_iq4nl[q].
constexpr std::int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

void iq4_nl_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, 32, "iq4_nl");
  for (std::int64_t b = 0; b < n / 32; ++b, x += 18, y += 32) {
    const float d = half_at(x);
    for (int j = 0; j < 16; ++j) {
      y[j] = d * f(kIq4nlValues[x[2 + j] & 0x0f]);
      y[j + 16] = d * f(kIq4nlValues[x[2 + j] >> 4]);
    }
  }
}

// ---- K-quants: super-blocks of 256 ----------------------------------------

// block_q2_K (84 bytes): scales[16] (low nibble: scale, high nibble: min of a
// 16-element group), qs[64] (2-bit quants), fp16 d, fp16 dmin. Each half of
// 128 elements uses 32 bytes of qs; its four 32-element runs are the bit pairs
// 0-1, 2-3, 4-5, 6-7 of those bytes, the run's first 16 from bytes 0..15 and
// the next 16 from bytes 16..31. Value (d * sc) * q - (dmin * m).
void q2_K_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, kQK_K, "q2_K");
  for (std::int64_t b = 0; b < n / kQK_K; ++b, x += 84) {
    const std::uint8_t* scales = x;
    const std::uint8_t* q = x + 16;
    const float d = half_at(x + 80);
    const float dmin = half_at(x + 82);
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const std::uint8_t sc = scales[is++];
          const float dl = d * f(sc & 0x0f);
          const float ml = dmin * f(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * f((q[16 * part + l] >> shift) & 3) - ml;
        }
      }
    }
  }
}

// The 16 six-bit scales of q3_K, packed in 12 bytes: scale s has its low four
// bits in byte s (s < 8, low nibble) or byte s - 8 (s >= 8, high nibble), and
// its top two bits in bits 2*(s/4), 2*(s/4)+1 of byte 8 + s % 4.
int q3_K_scale(const std::uint8_t* packed, int s) {
  const int low = s < 8 ? (packed[s] & 0x0f) : (packed[s - 8] >> 4);
  const int high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
  return (low | (high << 4)) - 32;
}

// block_q3_K (110 bytes): hmask[32] (3rd bit), qs[64] (low 2 bits, laid out
// as q2_K's), scales[12], fp16 d. Element run r (of 8, 32 each) takes its high
// bit from bit r of hmask[l]; a clear bit subtracts 4. Value (d * (sc - 32)) * q.
void q3_K_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, kQK_K, "q3_K");
  for (std::int64_t b = 0; b < n / kQK_K; ++b, x += 110) {
    const std::uint8_t* hm = x;
    const std::uint8_t* q = x + 32;
    const std::uint8_t* scales = x + 96;
    const float d_all = half_at(x + 108);
    int is = 0;
    unsigned m = 1;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m <<= 1) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * f(q3_K_scale(scales, is++));
          for (int l = 0; l < 16; ++l) {
            const int i = 16 * part + l;
            *y++ = dl * f(((q[i] >> shift) & 3) - ((hm[i] & m) ? 0 : 4));
          }
        }
      }
    }
  }
}

// block_q4_K (144 bytes): fp16 d, fp16 dmin, scales[12], qs[128]. Each 64
// elements use 32 bytes: the first 32 the low nibbles, the next 32 the high
// nibbles. Value (d * sc) * q - (dmin * m).
void q4_K_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, kQK_K, "q4_K");
  for (std::int64_t b = 0; b < n / kQK_K; ++b, x += 144) {
    const float d = half_at(x);
    const float dmin = half_at(x + 2);
    const std::uint8_t* scales = x + 4;
    const std::uint8_t* q = x + 16;
    for (int is = 0; is < 8; is += 2, q += 32) {
      int sc = 0, m = 0;
      ggml::scale_min_k4(is, scales, sc, m);
      const float d1 = d * f(sc), m1 = dmin * f(m);
      ggml::scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * f(sc), m2 = dmin * f(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * f(q[l] & 0x0f) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * f(q[l] >> 4) - m2;
    }
  }
}

// block_q5_K (176 bytes): fp16 d, fp16 dmin, scales[12], qh[32], qs[128]. As
// q4_K, plus a 5th bit: bit 2*i (low-nibble run) or 2*i + 1 (high-nibble run)
// of qh[l] in the i-th 64 elements.
void q5_K_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, kQK_K, "q5_K");
  for (std::int64_t b = 0; b < n / kQK_K; ++b, x += 176) {
    const float d = half_at(x);
    const float dmin = half_at(x + 2);
    const std::uint8_t* scales = x + 4;
    const std::uint8_t* qh = x + 16;
    const std::uint8_t* ql = x + 48;
    unsigned u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32, u1 <<= 2, u2 <<= 2) {
      int sc = 0, m = 0;
      ggml::scale_min_k4(is, scales, sc, m);
      const float d1 = d * f(sc), m1 = dmin * f(m);
      ggml::scale_min_k4(is + 1, scales, sc, m);
      const float d2 = d * f(sc), m2 = dmin * f(m);
      for (int l = 0; l < 32; ++l) *y++ = d1 * f((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * f((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
  }
}

// block_q6_K (210 bytes): ql[128] (low 4 bits), qh[64] (high 2 bits),
// int8 scales[16], fp16 d. Per 128 elements (64 ql, 32 qh, 8 scales): element
// l + 32 * r (r = 0..3) is ql[l + 32 * (r % 2)] nibble r / 2 with bits 2r, 2r+1
// of qh[l] on top, minus 32, scaled by scales[l / 16 + 2 * r]. Value (d * sc) * q.
void q6_K_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, kQK_K, "q6_K");
  for (std::int64_t b = 0; b < n / kQK_K; ++b, x += 210) {
    const std::uint8_t* ql = x;
    const std::uint8_t* qh = x + 128;
    const std::uint8_t* sc = x + 192;
    const float d = half_at(x + 208);
    for (int h = 0; h < 2; ++h, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * f(static_cast<std::int8_t>(sc[is])) * f(q1);
        y[l + 32] = d * f(static_cast<std::int8_t>(sc[is + 2])) * f(q2);
        y[l + 64] = d * f(static_cast<std::int8_t>(sc[is + 4])) * f(q3);
        y[l + 96] = d * f(static_cast<std::int8_t>(sc[is + 6])) * f(q4);
      }
    }
  }
}

// block_q8_K (292 bytes): fp32 d, int8 qs[256], int16 bsums[16] (unused here).
void q8_K_to_float(const std::uint8_t* x, float* y, std::int64_t n) {
  check_multiple(n, kQK_K, "q8_K");
  for (std::int64_t b = 0; b < n / kQK_K; ++b, x += 292) {
    const float d = std::bit_cast<float>(load_u32(x));
    for (int j = 0; j < 256; ++j) *y++ = d * f(static_cast<std::int8_t>(x[4 + j]));
  }
}

using L = LowBit;
using T = GgmlType;

// ggml's from_float_ref quantizers (defined below, and in kquant_quantize.cc).
void q4_0_from_float(const float* x, std::int64_t k, std::uint8_t* y) { ggml::quantize_q4_0_ggml(x, k, y); }
void q8_0_from_float(const float* x, std::int64_t k, std::uint8_t* y) { ggml::quantize_q8_0_ggml(x, k, y); }
void q4_1_from_float(const float* x, std::int64_t k, std::uint8_t* y);
void q5_0_from_float(const float* x, std::int64_t k, std::uint8_t* y);
void q5_1_from_float(const float* x, std::int64_t k, std::uint8_t* y);
void iq4_nl_from_float(const float* x, std::int64_t k, std::uint8_t* y);
bool q8_0_to_int8(const std::uint8_t* b, std::int64_t k, std::int8_t* q, std::uint16_t* s) {
  return ggml::sym_int8_from_q8_0(b, k, q, s);
}
bool q5_0_to_int8(const std::uint8_t* b, std::int64_t k, std::int8_t* q, std::uint16_t* s);
bool iq4_nl_to_int8(const std::uint8_t* b, std::int64_t k, std::int8_t* q, std::uint16_t* s);
void f32_from_float(const float* x, std::int64_t k, std::uint8_t* y) { std::memcpy(y, x, static_cast<std::size_t>(k) * 4); }
void f16_from_float(const float* x, std::int64_t k, std::uint8_t* y) {
  for (std::int64_t i = 0; i < k; ++i) store_u16(y + 2 * i, fp32_to_fp16(x[i]));
}
void bf16_from_float(const float* x, std::int64_t k, std::uint8_t* y) {
  for (std::int64_t i = 0; i < k; ++i) store_u16(y + 2 * i, fp32_to_bf16(x[i]));
}

// Type-number order; names, block sizes and bytes per block as ggml.c's type_traits[].
constexpr std::array<GgmlTypeTraits, 31> kTypes{{
    {T::kF32, "f32", 1, 4, f32_to_float, f32_from_float, nullptr, L::kFp32},
    {T::kF16, "f16", 1, 2, f16_to_float, f16_from_float, nullptr, L::kFp16},
    {T::kQ4_0, "q4_0", 32, 18, q4_0_to_float, q4_0_from_float, nullptr, L::kSymInt4},
    {T::kQ4_1, "q4_1", 32, 20, q4_1_to_float, q4_1_from_float, nullptr, L::kSymInt4},
    {T::kQ5_0, "q5_0", 32, 22, q5_0_to_float, q5_0_from_float, q5_0_to_int8, L::kSymInt8},
    {T::kQ5_1, "q5_1", 32, 24, q5_1_to_float, q5_1_from_float, nullptr, L::kSymInt8},
    {T::kQ8_0, "q8_0", 32, 34, q8_0_to_float, q8_0_from_float, q8_0_to_int8, L::kSymInt8},
    {T::kQ8_1, "q8_1", 32, 36, nullptr, nullptr, nullptr, L::kSymInt8},
    {T::kQ2_K, "q2_K", 256, 84, q2_K_to_float, kquant::quantize_q2_K, nullptr, L::kSymInt4},
    {T::kQ3_K, "q3_K", 256, 110, q3_K_to_float, kquant::quantize_q3_K, nullptr, L::kSymInt4},
    {T::kQ4_K, "q4_K", 256, 144, q4_K_to_float, kquant::quantize_q4_K, nullptr, L::kSymInt4},
    {T::kQ5_K, "q5_K", 256, 176, q5_K_to_float, kquant::quantize_q5_K, nullptr, L::kSymInt8},
    {T::kQ6_K, "q6_K", 256, 210, q6_K_to_float, kquant::quantize_q6_K, nullptr, L::kSymInt8},
    {T::kQ8_K, "q8_K", 256, 292, q8_K_to_float, nullptr, nullptr, L::kSymInt8},
    {T::kIQ2_XXS, "iq2_xxs", 256, 66, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kIQ2_XS, "iq2_xs", 256, 74, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kIQ3_XXS, "iq3_xxs", 256, 98, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kIQ1_S, "iq1_s", 256, 50, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kIQ4_NL, "iq4_nl", 32, 18, iq4_nl_to_float, iq4_nl_from_float, iq4_nl_to_int8, L::kSymInt4},
    {T::kIQ3_S, "iq3_s", 256, 110, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kIQ2_S, "iq2_s", 256, 82, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kIQ4_XS, "iq4_xs", 256, 136, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kI8, "i8", 1, 1, nullptr, nullptr, nullptr, L::kFp32},
    {T::kI16, "i16", 1, 2, nullptr, nullptr, nullptr, L::kFp32},
    {T::kI32, "i32", 1, 4, nullptr, nullptr, nullptr, L::kFp32},
    {T::kI64, "i64", 1, 8, nullptr, nullptr, nullptr, L::kFp32},
    {T::kF64, "f64", 1, 8, f64_to_float, nullptr, nullptr, L::kFp32},
    {T::kIQ1_M, "iq1_m", 256, 56, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kBF16, "bf16", 1, 2, bf16_to_float, bf16_from_float, nullptr, L::kBf16},
    {T::kTQ1_0, "tq1_0", 256, 54, nullptr, nullptr, nullptr, L::kSymInt4},
    {T::kTQ2_0, "tq2_0", 256, 66, nullptr, nullptr, nullptr, L::kSymInt4},
}};

constexpr bool sorted_by_number() {
  for (std::size_t i = 1; i < kTypes.size(); ++i)
    if (static_cast<std::uint32_t>(kTypes[i - 1].type) >= static_cast<std::uint32_t>(kTypes[i].type)) return false;
  return true;
}
static_assert(sorted_by_number(), "kTypes must be in type-number order");

// ---- ggml's reference quantizers ------------------------------------------

void check_finite(const float* x, std::int64_t k, std::string_view what) {
  for (std::int64_t i = 0; i < k; ++i)
    if (!std::isfinite(x[i])) fail("{}: element {} is {}, which cannot be quantized", what, i, x[i]);
}

// 1 / d as ggml computes it (0 for d == 0). When d is so small (|d| < 2^-128)
// that 1 / d overflows, ggml goes on to convert inf/NaN to an integer, which is
// undefined behaviour; d is stored as fp16 zero there, so the block decodes to
// zeros whatever its quants, and woq uses 0 to write the quants of a zero block.
float inverse_scale(float d) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  return std::isfinite(id) ? id : 0.0f;
}

// Per block of 32: min, max; d = (max - min) / nmax. ggml's asymmetric
// quantize_row_q4_1_ref / q5_1_ref up to the packing of the quants.
void asymmetric_blocks(const float* x, std::int64_t k, int nmax, std::int64_t block_bytes, std::string_view what,
                       std::uint8_t* y, void (*pack)(const int* q, std::uint8_t* y)) {
  check_multiple(k, 32, what);
  check_finite(x, k, what);
  for (std::int64_t b = 0; b < k / 32; ++b, x += 32, y += block_bytes) {
    float min = std::numeric_limits<float>::max(), max = -std::numeric_limits<float>::max();
    for (int j = 0; j < 32; ++j) {
      if (x[j] < min) min = x[j];
      if (x[j] > max) max = x[j];
    }
    const float d = (max - min) / static_cast<float>(nmax);
    const float id = inverse_scale(d);
    store_u16(y, codec::encode_scale(d));
    store_u16(y + 2, codec::encode_scale(min));
    int q[32];
    // q4_1: min(15, (int8_t)(v + 0.5f)); q5_1: (uint8_t)(v + 0.5f), no clamp. v >= 0, so both truncate.
    for (int j = 0; j < 32; ++j) q[j] = static_cast<int>((x[j] - min) * id + 0.5f);
    if (nmax == 15)
      for (int& v : q) v = std::min(15, v);
    pack(q, y);
  }
}

// Low nibbles of element j and j + 16 in qs[j] at `qs`; with qh, their 5th bits at bits j and j + 16.
void pack_nibbles(const int* q, std::uint8_t* qs, std::uint8_t* qh) {
  std::uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<std::uint8_t>((q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4));
    high |= ((static_cast<std::uint32_t>(q[j]) & 0x10u) >> 4) << j;
    high |= ((static_cast<std::uint32_t>(q[j + 16]) & 0x10u) >> 4) << (j + 16);
  }
  if (qh != nullptr)
    for (int i = 0; i < 4; ++i) qh[i] = static_cast<std::uint8_t>(high >> (8 * i));
}

void q4_1_from_float(const float* x, std::int64_t k, std::uint8_t* y) {
  asymmetric_blocks(x, k, 15, 20, "quantize_q4_1", y, [](const int* q, std::uint8_t* b) { pack_nibbles(q, b + 4, nullptr); });
}

void q5_1_from_float(const float* x, std::int64_t k, std::uint8_t* y) {
  asymmetric_blocks(x, k, 31, 24, "quantize_q5_1", y, [](const int* q, std::uint8_t* b) { pack_nibbles(q, b + 8, b + 4); });
}

// Q5_0 and IQ4_NL blocks as int8 values under the same fp16 d per 32: q - 16
// and kvalues_iq4nl[q] are in [-127, 127], so sym_int8 group 32 holds them exactly.
bool q5_0_to_int8(const std::uint8_t* b, std::int64_t k, std::int8_t* q, std::uint16_t* s) {
  check_multiple(k, 32, "q5_0");
  for (std::int64_t i = 0; i < k / 32; ++i, b += 22, q += 32) {
    s[i] = load_u16(b);
    const std::uint32_t qh = load_u32(b + 2);
    for (int j = 0; j < 16; ++j) {
      q[j] = static_cast<std::int8_t>(((b[6 + j] & 0x0f) | q5_high(qh, j)) - 16);
      q[j + 16] = static_cast<std::int8_t>(((b[6 + j] >> 4) | q5_high(qh, j + 16)) - 16);
    }
  }
  return true;
}

bool iq4_nl_to_int8(const std::uint8_t* b, std::int64_t k, std::int8_t* q, std::uint16_t* s) {
  check_multiple(k, 32, "iq4_nl");
  for (std::int64_t i = 0; i < k / 32; ++i, b += 18, q += 32) {
    s[i] = load_u16(b);
    for (int j = 0; j < 16; ++j) {
      q[j] = kIq4nlValues[b[2 + j] & 0x0f];
      q[j + 16] = kIq4nlValues[b[2 + j] >> 4];
    }
  }
  return true;
}

// ggml's best_index_int8: the index of the kvalues_iq4nl entry nearest x (the lower one on a tie).
int iq4_nl_index(float x) {
  if (x <= f(kIq4nlValues[0])) return 0;
  if (x >= f(kIq4nlValues[15])) return 15;
  int ml = 0, mu = 15;
  while (mu - ml > 1) {
    const int mav = (ml + mu) / 2;
    if (x < f(kIq4nlValues[mav])) mu = mav;
    else ml = mav;
  }
  return x - f(kIq4nlValues[mu - 1]) < f(kIq4nlValues[mu]) - x ? mu - 1 : mu;
}

// What llama-quantize writes for IQ4_NL without an importance matrix: ggml's
// quantize_iq4_nl (quantize_row_iq4_nl_impl with ntry 7 and weights x^2; its
// from_float_ref uses ntry -1 instead). Per block of 32: d = max / 127, the
// weighted least-squares scale of the nearest table entries, then 15 more trial
// scales (itry - 127) / max, keeping the best; quants against the final d.
void iq4_nl_from_float(const float* x, std::int64_t k, std::uint8_t* y) {
  check_multiple(k, 32, "quantize_iq4_nl");
  check_finite(x, k, "quantize_iq4_nl");
  constexpr float kGroupMaxEps = 1e-15f;
  for (std::int64_t b = 0; b < k / 32; ++b, x += 32, y += 18) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    float scale = 0.0f;
    if (amax >= kGroupMaxEps) {
      // sums of w q x and w q^2 (w = x^2) for the nearest entries to id * x
      const auto sums = [&](float id, float& sumqx, float& sumq2) {
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < 32; ++j) {
          const float q = f(kIq4nlValues[iq4_nl_index(id * x[j])]);
          const float w = x[j] * x[j];
          sumqx += w * q * x[j];
          sumq2 += w * q * q;
        }
      };
      float d = -max / f(kIq4nlValues[0]);
      float sumqx = 0.0f, sumq2 = 0.0f;
      sums(1.0f / d, sumqx, sumq2);
      d = sumqx / sumq2;
      float best = d * sumqx;
      for (int itry = -7; itry <= 7; ++itry) {
        sums(f(itry + kIq4nlValues[0]) / max, sumqx, sumq2);
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
          d = sumqx / sumq2;
          best = d * sumqx;
        }
      }
      scale = d;
    }
    store_u16(y, codec::encode_scale(scale));
    const float id = scale != 0.0f ? 1.0f / scale : 0.0f;
    std::uint8_t index[32];
    for (int j = 0; j < 32; ++j) index[j] = static_cast<std::uint8_t>(iq4_nl_index(id * x[j]));
    for (int j = 0; j < 16; ++j) y[2 + j] = static_cast<std::uint8_t>(index[j] | (index[j + 16] << 4));
  }
}

// ggml's symmetric quantize_row_q4_0_ref / q5_0_ref up to the packing: per
// block of 32, d = max / -half (max: the value of largest magnitude, the first
// of equals), q = min(2 half - 1, (int8_t)(x * (1/d) + half + 0.5)); the cast
// truncates toward zero, and x / d + half + 0.5 is in [0.5, 2 half + 0.5].
void symmetric_blocks(const float* x, std::int64_t k, int half, std::int64_t block_bytes, std::string_view what,
                      std::uint8_t* y, void (*pack)(const int* q, std::uint8_t* y)) {
  check_multiple(k, 32, what);
  check_finite(x, k, what);
  for (std::int64_t b = 0; b < k / 32; ++b, x += 32, y += block_bytes) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (amax < std::fabs(x[j])) {  // strict: the first of equal magnitudes wins
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -static_cast<float>(half);
    const float id = inverse_scale(d);
    store_u16(y, codec::encode_scale(d));
    const float offset = static_cast<float>(half) + 0.5f;
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = std::min(2 * half - 1, static_cast<int>(x[j] * id + offset));
    pack(q, y);
  }
}

// ggml's quantize_row_q5_0_ref: the 5th bits in qh (4 bytes after d).
void q5_0_from_float(const float* x, std::int64_t k, std::uint8_t* y) {
  symmetric_blocks(x, k, 16, 22, "quantize_q5_0", y, [](const int* q, std::uint8_t* b) { pack_nibbles(q, b + 6, b + 2); });
}

}  // namespace

const GgmlTypeTraits* find_ggml_type(std::uint32_t type) {
  for (const GgmlTypeTraits& t : kTypes)
    if (static_cast<std::uint32_t>(t.type) == type) return &t;
  return nullptr;
}

const GgmlTypeTraits& ggml_type_traits(GgmlType type) {
  const GgmlTypeTraits* t = find_ggml_type(static_cast<std::uint32_t>(type));
  if (t == nullptr) fail("ggml type {} is not a known ggml type", static_cast<std::uint32_t>(type));
  return *t;
}

std::span<const GgmlTypeTraits> ggml_types() { return kTypes; }

namespace ggml {

void scale_min_k4(int j, const std::uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}


void quantize_q4_0_ggml(const float* x, std::int64_t k, std::uint8_t* blocks) {
  symmetric_blocks(x, k, 8, kQ4_0Bytes, "quantize_q4_0_ggml", blocks,
                   [](const int* q, std::uint8_t* b) { pack_nibbles(q, b + 2, nullptr); });
}

void quantize_q8_0_ggml(const float* x, std::int64_t k, std::uint8_t* blocks) {
  check_multiple(k, kQK, "quantize_q8_0_ggml");
  check_finite(x, k, "quantize_q8_0_ggml");
  for (std::int64_t b = 0; b < k / kQK; ++b, x += kQK, blocks += kQ8_0Bytes) {
    float amax = 0.0f;
    for (std::int64_t j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = inverse_scale(d);
    store_u16(blocks, codec::encode_scale(d));
    for (std::int64_t j = 0; j < kQK; ++j) {
      // roundf: half away from zero (woq's own sym_int8 rounds half to even).
      blocks[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(x[j] * id)));
    }
  }
}

void q4_0_from_sym_int4(const std::uint8_t* q, const std::uint16_t* scales, std::int64_t k, std::uint8_t* blocks) {
  check_multiple(k, kQK, "q4_0_from_sym_int4");
  for (std::int64_t b = 0; b < k / kQK; ++b, q += kQK / 2, blocks += kQ4_0Bytes) {
    store_u16(blocks, scales[b]);
    // woq byte t holds elements 2t (low) and 2t + 1 (high); Q4_0 byte i holds i and i + 16.
    for (int i = 0; i < 16; ++i) {
      const int lo = (i % 2 == 0) ? (q[i / 2] & 0x0f) : (q[i / 2] >> 4);
      const int hi = (i % 2 == 0) ? (q[8 + i / 2] & 0x0f) : (q[8 + i / 2] >> 4);
      blocks[2 + i] = static_cast<std::uint8_t>(lo | (hi << 4));
    }
  }
}

void sym_int4_from_q4_0(const std::uint8_t* blocks, std::int64_t k, std::uint8_t* q, std::uint16_t* scales) {
  check_multiple(k, kQK, "sym_int4_from_q4_0");
  for (std::int64_t b = 0; b < k / kQK; ++b, q += kQK / 2, blocks += kQ4_0Bytes) {
    scales[b] = load_u16(blocks);
    const std::uint8_t* qs = blocks + 2;
    for (int t = 0; t < 16; ++t) {
      // elements 2t and 2t + 1 of the block
      const auto element = [qs](int e) { return e < 16 ? (qs[e] & 0x0f) : (qs[e - 16] >> 4); };
      q[t] = static_cast<std::uint8_t>(element(2 * t) | (element(2 * t + 1) << 4));
    }
  }
}

void q8_0_from_sym_int8(const std::int8_t* q, const std::uint16_t* scales, std::int64_t k, std::uint8_t* blocks) {
  check_multiple(k, kQK, "q8_0_from_sym_int8");
  for (std::int64_t b = 0; b < k / kQK; ++b, q += kQK, blocks += kQ8_0Bytes) {
    store_u16(blocks, scales[b]);
    std::memcpy(blocks + 2, q, kQK);
  }
}

bool sym_int8_from_q8_0(const std::uint8_t* blocks, std::int64_t k, std::int8_t* q, std::uint16_t* scales) {
  check_multiple(k, kQK, "sym_int8_from_q8_0");
  bool representable = true;
  for (std::int64_t b = 0; b < k / kQK; ++b, q += kQK, blocks += kQ8_0Bytes) {
    scales[b] = load_u16(blocks);
    std::memcpy(q, blocks + 2, kQK);
    for (std::int64_t j = 0; j < kQK; ++j) representable = representable && q[j] != -128;
  }
  return representable;
}

}  // namespace ggml

}  // namespace woq
