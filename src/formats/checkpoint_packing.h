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
// AWQ (AutoAWQ's awq/modules/linear/gemm.py and gemv.py; read by vLLM,
// transformers, TGI), 4-bit, zero points stored as they are (w = (q - z) * s):
//   GEMM: qweight int32 [K, N/8]: value (k, n) in word [k, n/8] at nibble j, where
//         kAwqOrder[j] = n % 8 (AutoAWQ's order_map 0, 2, 4, 6, 1, 3, 5, 7)
//         qzeros int32 [G, N/8], the same packing;  scales fp16 [G, N]
//   GEMV: qweight int32 [N, K/8]: value (n, k) in word [n, k/8] at nibble k % 8
//         qzeros int32 [N, W]: zero (n, g) in word [n, g/8] at nibble g % 8, where W =
//         awq_gemv_zeros_width (padded);  scales fp16 [N, 8 W], groups beyond G zero
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
/// neighbouring zero. Rows are packed in parallel (octets of rows) when `pool` is given.
GptqTensors pack_gptq(const IntMatrix& m, GptqZeros zeros, ThreadPool* pool = nullptr);

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

/// AutoAWQ's packed checkpoint layouts ("version" in quantization_config).
enum class AwqVersion { kGemm, kGemv };

/// AutoAWQ's nibble order within a GEMM word: nibble j holds column 8 w + kAwqOrder[j].
inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

/// One linear layer in an AWQ layout (see the file comment); 4-bit.
struct AwqTensors {
  AwqVersion version = AwqVersion::kGemm;
  std::int64_t n = 0, k = 0, groups = 0;  ///< groups = K / group_size
  std::int64_t zeros_width = 0;            ///< GEMV: W; 0 for GEMM
  std::vector<std::int32_t> qweight;
  std::vector<std::int32_t> qzeros;
  std::vector<std::uint16_t> scales;  ///< fp16 bits

  std::vector<std::int64_t> qweight_shape() const;
  std::vector<std::int64_t> qzeros_shape() const;
  std::vector<std::int64_t> scales_shape() const;
};

/// AutoAWQ's calculate_zeros_width for GEMV: ceil(groups / 8) rounded up to a
/// multiple of 1 (group_size >= 128), 2 (64) or 4 (32). Throws woq::Error for
/// another group size (AutoAWQ's GEMV has none).
std::int64_t awq_gemv_zeros_width(std::int64_t k, std::int64_t group_size);

/// The empty tensors of an [n, k] layer in `version`'s layout with
/// `group_size` (-1 = K): sizes set, values zero. Throws woq::Error naming
/// the constraint when N is not a multiple of 8, K not a multiple of the
/// group size, or (GEMV) K not a multiple of 8.
AwqTensors awq_layout(AwqVersion version, std::int64_t n, std::int64_t k, std::int64_t group_size);

/// Packs 4-bit `m` (groups contiguous: g_idx = k / group_size) in `version`'s
/// layout. Throws woq::Error for other bits, act-order g_idx, or the shapes
/// awq_layout refuses. Rows are packed in parallel (octets of rows) when `pool` is given.
AwqTensors pack_awq(const IntMatrix& m, AwqVersion version, std::int64_t group_size, ThreadPool* pool = nullptr);

/// Unpacks AWQ tensors into 4-bit integers with their zeros (g_idx =
/// k / group_size). Throws woq::Error on size mismatches. Rows are unpacked
/// in parallel when `pool` is given.
IntMatrix unpack_awq(const AwqTensors& t, ThreadPool* pool = nullptr);

}  // namespace woq
