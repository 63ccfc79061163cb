// What the bf16-path tile kernels of avx512_bf16 (matmul_avx512_bf16.cc) and
// amx (matmul_amx.cc) share. Internal to src/kernels.
#pragma once

#include <cstdint>

#include "formats/low_bit.h"

namespace woq::detail {

/// Bytes of one block (32 inputs) of 16 weight rows in the bf16 pair layout.
inline constexpr std::int64_t kBf16PairBlockBytes = 16 * 64;

/// Blocks [b0, b1) of row groups g and g2 (g2 == g: the odd last group; rows 8..15 are then a copy)
/// of an interleaved integer matrix (formats/interleave.h) as bf16 in the layout AMX-BF16's B operand and
/// vdpbf16ps with one weight row per lane read: per block, 16 rows of 64 bytes, row p holding for each
/// of the 16 weight rows n the pair (q - z)[n][32 b + 2p], (q - z)[n][32 b + 2p + 1] (low half first),
/// into `out` ((b1 - b0) * kBf16PairBlockBytes bytes); `blocks` is the row's block count. The integers
/// are exact in bf16. Runs AVX-512 code: only on ISAs from avx512_bf16 up.
void unpack_bf16_pairs(const QuantMatrix& w, std::int64_t g, std::int64_t g2, std::int64_t blocks, std::int64_t b0,
                       std::int64_t b1, std::uint8_t* out);


}  // namespace woq::detail
