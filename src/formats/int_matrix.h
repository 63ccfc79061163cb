// The form every integer checkpoint format shares (GPTQ, compressed-tensors):
// one unsigned integer per weight, and per (row, group) a zero point and an
// fp16 scale, with a map from input feature to group:
//   W[n, k] = (q[n, k] - zero[n, g_idx[k]]) * scale[n, g_idx[k]].
// Converting to and from woq's QuantMatrix is exact in both directions.
#pragma once

#include <cstdint>
#include <vector>

#include "formats/low_bit.h"

namespace woq {

/// A [rows = N, cols = K] low-bit matrix as plain integers (see above).
struct IntMatrix {
  int bits = 4;                      ///< 4 or 8
  std::int64_t rows = 0;             ///< N, output features
  std::int64_t cols = 0;             ///< K, input features
  std::int64_t groups = 0;           ///< groups per row
  std::vector<std::uint8_t> q;       ///< [rows, cols], each in [0, 2^bits)
  std::vector<std::uint16_t> zero;   ///< [rows, groups], the true zero (GPTQ v2 meaning)
  std::vector<std::uint16_t> scale;  ///< fp16 bits [rows, groups]
  std::vector<std::int32_t> g_idx;   ///< [cols], group of each input feature
};

/// The integers of a quantized `w`: sym_int4 as 4-bit with zero 8, asym_int4
/// as 4-bit with its zeros, sym_int8 as 8-bit with zero 128 (q = value + 128).
/// g_idx is k / group_size, or follows w.input_order for act-order matrices.
/// Throws woq::Error for float formats. Rows in parallel when `pool` is given.
IntMatrix to_int_matrix(const QuantMatrix& w, ThreadPool* pool = nullptr);

/// The QuantMatrix holding `m` exactly. `group_size` is the checkpoint's
/// (-1 = per channel); `sym` picks sym_int4/sym_int8 (every zero must then be
/// 2^(bits-1)) or asym_int4. A g_idx other than k / group_size (GPTQ act
/// order) becomes input_order: columns are stored grouped, and every group
/// must hold exactly group_size features (the last one the remainder).
/// Throws woq::Error, naming the offending row/group/feature, for bits other
/// than 4 and 8, 8-bit asymmetric (woq has no asym_int8), zeros out of range,
/// and g_idx values out of [0, groups) or groups of the wrong size. Rows are
/// converted in parallel when `pool` is given.
QuantMatrix from_int_matrix(const IntMatrix& m, std::int64_t group_size, bool sym, ThreadPool* pool = nullptr);

}  // namespace woq
