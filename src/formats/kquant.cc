#include "formats/kquant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"
#include "core/half.h"

namespace woq::kquant {
namespace {

constexpr GgmlType kQ8_K = GgmlType::kQ8_K, kQ8_1 = GgmlType::kQ8_1;
constexpr std::array<Format, 7> kFormats{{
    {LowBit::kQ2_K, GgmlType::kQ2_K, "q2_k", 84, 80, 82, kSuperBlock, kQ8_K},
    {LowBit::kQ3_K, GgmlType::kQ3_K, "q3_k", 110, 108, -1, kSuperBlock, kQ8_K},
    {LowBit::kQ4_K, GgmlType::kQ4_K, "q4_k", 144, 0, 2, kSuperBlock, kQ8_K},
    {LowBit::kQ5_K, GgmlType::kQ5_K, "q5_k", 176, 0, 2, kSuperBlock, kQ8_K},
    {LowBit::kQ6_K, GgmlType::kQ6_K, "q6_k", 210, 208, -1, kSuperBlock, kQ8_K},
    // block_q4_1: fp16 d, m, qs[16]; block_q5_1: fp16 d, m, qh[4], qs[16]
    {LowBit::kQ4_1, GgmlType::kQ4_1, "q4_1", 20, 0, 2, 32, kQ8_1},
    {LowBit::kQ5_1, GgmlType::kQ5_1, "q5_1", 24, 0, 2, 32, kQ8_1},
}};

float half_at(const std::uint8_t* p) { return fp16_to_fp32(static_cast<std::uint16_t>(p[0] | (p[1] << 8))); }

// q2_K: scales[16] (scale low nibble, min high nibble per 16 elements), qs[64], d, dmin.
// Elements 128 h + 32 s + 16 part + l are bits 2s, 2s+1 of qs[32 h + 16 part + l].
void unpack_q2_K(const std::uint8_t* x, Unpacked& u) {
  for (int i = 0; i < 16; ++i) {
    u.scale[i] = static_cast<std::int16_t>(x[i] & 0x0f);
    u.min[i] = static_cast<std::int16_t>(x[i] >> 4);
  }
  for (int p = 0; p < 256; ++p) {
    const int h = p / 128, s = p % 128 / 32, rest = p % 32;
    u.q[p] = static_cast<std::int8_t>((x[16 + 32 * h + rest] >> (2 * s)) & 3);
  }
  u.d = half_at(x + 80);
  u.dmin = half_at(x + 82);
}

// q3_K: hmask[32], qs[64] (as q2_K), 12 bytes of 6-bit scales (offset 32), d.
// Run r = p / 32 takes its high bit from bit r of hmask[p % 32]; a clear bit subtracts 4.
void unpack_q3_K(const std::uint8_t* x, Unpacked& u) {
  const std::uint8_t* packed = x + 96;
  for (int s = 0; s < 16; ++s) {
    const int low = s < 8 ? (packed[s] & 0x0f) : (packed[s - 8] >> 4);
    const int high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
    u.scale[s] = static_cast<std::int16_t>((low | (high << 4)) - 32);
    u.min[s] = 0;
  }
  for (int p = 0; p < 256; ++p) {
    const int h = p / 128, s = p % 128 / 32, rest = p % 32;
    const int low = (x[32 + 32 * h + rest] >> (2 * s)) & 3;
    const bool high = (x[rest] >> (p / 32)) & 1;
    u.q[p] = static_cast<std::int8_t>(low - (high ? 0 : 4));
  }
  u.d = half_at(x + 108);
  u.dmin = 0.0f;
}

// q4_K / q5_K: d, dmin, scales[12], (q5_K: qh[32]), qs[128]. Element 64 i + l (l < 32) is the low
// nibble of qs[32 i + l], element 64 i + 32 + l its high nibble; q5_K's 5th bit is bit 2 i (low) or
// 2 i + 1 (high) of qh[l].
void unpack_q45_K(const std::uint8_t* x, bool five, Unpacked& u) {
  u.d = half_at(x);
  u.dmin = half_at(x + 2);
  for (int j = 0; j < 8; ++j) {
    int sc = 0, m = 0;
    ggml::scale_min_k4(j, x + 4, sc, m);
    u.scale[2 * j] = u.scale[2 * j + 1] = static_cast<std::int16_t>(sc);
    u.min[2 * j] = u.min[2 * j + 1] = static_cast<std::int16_t>(m);
  }
  const std::uint8_t* qh = x + 16;
  const std::uint8_t* qs = x + (five ? 48 : 16);
  for (int p = 0; p < 256; ++p) {
    const int i = p / 64, hi = p % 64 / 32, l = p % 32;
    int v = (qs[32 * i + l] >> (4 * hi)) & 0x0f;
    if (five && ((qh[l] >> (2 * i + hi)) & 1)) v += 16;
    u.q[p] = static_cast<std::int8_t>(v);
  }
}

// q6_K: ql[128], qh[64], int8 scales[16], d. Per 128 elements h: element l + 32 r (r < 4) is
// nibble r / 2 of ql[64 h + l + 32 (r % 2)] with bits 2r, 2r+1 of qh[32 h + l] on top, minus 32.
void unpack_q6_K(const std::uint8_t* x, Unpacked& u) {
  for (int s = 0; s < 16; ++s) {
    u.scale[s] = static_cast<std::int8_t>(x[192 + s]);
    u.min[s] = 0;
  }
  for (int p = 0; p < 256; ++p) {
    const int h = p / 128, r = p % 128 / 32, l = p % 32;
    const int low = (x[64 * h + l + 32 * (r % 2)] >> (4 * (r / 2))) & 0x0f;
    const int high = (x[128 + 32 * h + l] >> (2 * r)) & 3;
    u.q[p] = static_cast<std::int8_t>((low | (high << 4)) - 32);
  }
  u.d = half_at(x + 208);
  u.dmin = 0.0f;
}

}  // namespace

std::span<const Format> formats() { return kFormats; }

const Format* find(LowBit type) {
  for (const Format& f : kFormats)
    if (f.type == type) return &f;
  return nullptr;
}

const Format* find(GgmlType type) {
  for (const Format& f : kFormats)
    if (f.ggml == type) return &f;
  return nullptr;
}

std::int64_t first_nonfinite_scale(const Format& f, const std::uint8_t* blocks, std::int64_t count) {
  for (std::int64_t b = 0; b < count; ++b, blocks += f.block_bytes) {
    if (!std::isfinite(half_at(blocks + f.d_offset))) return b;
    if (f.dmin_offset >= 0 && !std::isfinite(half_at(blocks + f.dmin_offset))) return b;
  }
  return -1;
}

void quantize_q8_k(const float* x, std::int64_t k, std::uint8_t* blocks) {
  if (k < 0 || k % kSuperBlock != 0) fail("Q8_K activations: {} values is not a multiple of 256", k);
  for (std::int64_t b = 0; b < k / kSuperBlock; ++b, x += kSuperBlock, blocks += kQ8KBytes) {
    float amax = 0.0f, max = 0.0f;
    bool finite = true;
    for (int j = 0; j < kSuperBlock; ++j) {
      finite = finite && std::isfinite(x[j]);
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    std::int8_t q[kSuperBlock] = {};
    std::int16_t sums[16] = {};
    float d = 0.0f;
    if (!finite) {
      d = std::numeric_limits<float>::quiet_NaN();  // every product with the block is NaN
    } else if (amax != 0.0f) {
      const float iscale = -127.0f / max;
      for (int j = 0; j < kSuperBlock; ++j) {
        const int v = nearest_int(iscale * x[j]);  // |iscale · x| <= 127 here
        q[j] = static_cast<std::int8_t>(v < 127 ? v : 127);
      }
      for (int i = 0; i < 16; ++i) {
        int s = 0;
        for (int j = 0; j < 16; ++j) s += q[16 * i + j];
        sums[i] = static_cast<std::int16_t>(s);
      }
      d = 1.0f / iscale;
    }
    std::memcpy(blocks, &d, 4);
    std::memcpy(blocks + 4, q, kSuperBlock);
    std::memcpy(blocks + 4 + kSuperBlock, sums, sizeof sums);
  }
}

void quantize_q8_1(const float* x, std::int64_t k, std::uint8_t* blocks) {
  constexpr std::int64_t kBlock = 32;
  if (k < 0 || k % kBlock != 0) fail("Q8_1 activations: {} values is not a multiple of 32", k);
  for (std::int64_t b = 0; b < k / kBlock; ++b, x += kBlock, blocks += kQ8_1Bytes) {
    float amax = 0.0f;
    bool finite = true;
    for (int j = 0; j < kBlock; ++j) {
      finite = finite && std::isfinite(x[j]);
      amax = std::max(amax, std::fabs(x[j]));
    }
    std::int8_t q[kBlock] = {};
    std::uint16_t d16 = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN()), s16 = d16;
    if (finite) {
      const float d = amax / 127.0f;
      const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
      int sum = 0;
      for (int j = 0; j < kBlock; ++j) {
        // The default mode rounds half to even (vroundps). For 0 < amax < 127 / FLT_MAX, id is infinite and
        // ggml's vcvtps2dq gives INT_MIN for inf and NaN (every value then), saturated to -128 by its packs;
        // its sum of the 32 int32 values wraps to 0.
        const float v = x[j] * id;
        q[j] = std::isfinite(v) ? static_cast<std::int8_t>(std::nearbyint(v)) : std::int8_t{-128};
        sum += std::isfinite(v) ? q[j] : 0;
      }
      d16 = fp32_to_fp16(d);
      s16 = fp32_to_fp16(d * static_cast<float>(sum));
    }
    std::memcpy(blocks, &d16, 2);
    std::memcpy(blocks + 2, &s16, 2);
    std::memcpy(blocks + 4, q, kBlock);
  }
}

std::string_view activations_label(LowBit type, Activations a) {
  const Format* f = find(type);
  return f != nullptr && a == Activations::kInt8 ? ggml_type_traits(f->activation).name : activations_name(a);
}

void quantize_activations(const Format& f, const float* x, std::int64_t k, std::uint8_t* blocks) {
  if (f.activation == GgmlType::kQ8_K) return quantize_q8_k(x, k, blocks);
  quantize_q8_1(x, k, blocks);
}

void unpack(LowBit type, const std::uint8_t* block, Unpacked& out) {
  switch (type) {
    case LowBit::kQ2_K: return unpack_q2_K(block, out);
    case LowBit::kQ3_K: return unpack_q3_K(block, out);
    case LowBit::kQ4_K: return unpack_q45_K(block, false, out);
    case LowBit::kQ5_K: return unpack_q45_K(block, true, out);
    case LowBit::kQ6_K: return unpack_q6_K(block, out);
    default: fail("kquant::unpack: {} is not a K-quant", low_bit_name(type));
  }
}

}  // namespace woq::kquant
