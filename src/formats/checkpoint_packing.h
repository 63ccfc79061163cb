// Bit layouts of the integer checkpoint formats woq reads and writes, as
// plain arrays (the safetensors side lives in src/io).
//
// GPTQ (AutoGPTQ / GPTQModel / transformers / vLLM), for bits b in {4, 8},
// p = 32 / b values per int32 word, LSB first:
//   qweight int32 [ceil(K / p), N]: value (k, n) in word [k / p, n] at bit b * (k % p)
//   qzeros  int32 [G, ceil(N / p)]: zero (g, n) in word [g, n / p] at bit b * (n % p);
//           format v1 ("gptq") stores zero - 1 and readers add 1, v2 ("gptq_v2")
//           stores the zero itself
//   scales  fp16  [G, N];  g_idx int32 [K] (k / group_size, or a permuted map with desc_act)
// compressed-tensors "pack-quantized" (Neural Magic / llm-compressor):
//   weight_packed     int32 [N, ceil(K / p)]: value (n, k) at word [n, k / p], bit b * (k % p),
//                     holding the signed value + 2^(b-1)
//   weight_scale      [N, G];  weight_zero_point int32 [ceil(N / p), G] (asymmetric only,
//                     packed along N, signed zero + 2^(b-1));  weight_g_idx int32 [K] (optional)
// Padding values beyond K or N are written as 0 and ignored when read.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/int_matrix.h"

namespace woq {

class ThreadPool;

/// How GPTQ qzeros store the zero point.
enum class GptqZeros {
  kV1,  ///< zero - 1 ("checkpoint_format": "gptq", the classic and most widely read)
  kV2,  ///< zero ("checkpoint_format": "gptq_v2")
};

/// One linear layer in GPTQ layout (see the file comment).
struct GptqTensors {
  int bits = 4;
  std::int64_t k = 0, n = 0, groups = 0;
  std::vector<std::int32_t> qweight;   ///< [qweight_rows(), n]
  std::vector<std::int32_t> qzeros;    ///< [groups, qzeros_cols()]
  std::vector<std::uint16_t> scales;   ///< fp16 bits [groups, n]
  std::vector<std::int32_t> g_idx;     ///< [k]

  std::int64_t qweight_rows() const { return (k + 32 / bits - 1) / (32 / bits); }
  std::int64_t qzeros_cols() const { return (n + 32 / bits - 1) / (32 / bits); }
};

/// Packs `m` in GPTQ layout. Throws woq::Error (naming row and group) when
/// v1 cannot represent a zero: a zero of 0 would be stored as -1, which
/// readers that convert v1 to v2 by adding 0x11111111 carry into the
/// neighbouring zero.
GptqTensors pack_gptq(const IntMatrix& m, GptqZeros zeros);

/// Unpacks GPTQ tensors (sizes must match bits, k, n, groups). With v1,
/// checks the stored zeros: in a symmetric checkpoint where every stored zero
/// is 2^(bits-1) (the v2 value) instead of 2^(bits-1) - 1, the checkpoint
/// mislabels v2 zeros as v1; they are read as v2 and a warning is appended
/// to `warnings`. A stored 2^bits - 1 (a zero of 0 written as -1) is read as
/// 0, as AutoGPTQ does, also with a warning. Throws woq::Error on size
/// mismatches. Columns are unpacked in parallel when `pool` is given.
IntMatrix unpack_gptq(const GptqTensors& t, GptqZeros zeros, bool sym, std::vector<std::string>& warnings,
                      ThreadPool* pool = nullptr);

/// One linear layer in compressed-tensors pack-quantized layout.
struct PackQuantizedTensors {
  int bits = 4;
  std::int64_t n = 0, k = 0, groups = 0;
  std::vector<std::int32_t> weight_packed;      ///< [n, ceil(k / p)]
  std::vector<std::uint16_t> weight_scale;      ///< fp16 bits [n, groups]
  std::vector<std::int32_t> weight_zero_point;  ///< [ceil(n / p), groups]; empty when symmetric
  std::vector<std::int32_t> g_idx;              ///< [k]; empty = k / group_size
};

/// Unpacks pack-quantized tensors; `group_size` (-1 per channel) fills a
/// missing g_idx. Throws woq::Error on size mismatches.
IntMatrix unpack_pack_quantized(const PackQuantizedTensors& t, std::int64_t group_size);

}  // namespace woq
