// The row-interleaved layout of integer matrices that the int8-activation
// kernels read: eight output rows side by side per block of 32 inputs, so that
// one 32-byte vector holds four consecutive weights of each of eight rows and
// one integer multiply-add yields eight rows' partial sums in eight lanes (the
// idea of llama.cpp's Q4_0_8x8 and ik_llama.cpp's Q4_0_R8 run-time repacking).
//
// Layout (QuantMatrix::interleave == kInterleaveRows): rows are taken in
// groups of 8 (the last one padded with all-zero rows of scale 0); K in
// blocks of 32 (the last padded with zero values). Group G's blocks lie one
// after the other at data[G * blocks * block_bytes], block b holding:
//   sym_int4 / asym_int4 (128 bytes): chunk c in 0..3 is 32 bytes, byte
//     4r + j = q[r][32b + 4c + j] | q[r][32b + 16 + 4c + j] << 4 (stored nibbles);
//   sym_int8 (256 bytes): chunk c in 0..7, byte 4r + j = q[r][32b + 4c + j].
// Scales (and asym_int4 zero points) go [G][group][8 rows].
#pragma once

#include <cstdint>

#include "formats/group_rule.h"
#include "formats/low_bit.h"

namespace woq {

/// Rows per group of the interleaved layout.
inline constexpr std::int64_t kInterleaveRows = 8;
/// Inputs per block of the interleaved layout.
inline constexpr std::int64_t kInterleaveBlock = 32;

/// True when `w` can be interleaved: an integer format whose groups are whole
/// blocks of 32 (group_size a multiple of 32, or one group per row).
bool can_interleave(const QuantMatrix& w);

/// Bytes of one 8-row block of 32 inputs (128 for 4-bit formats, 256 for 8-bit).
std::int64_t interleaved_block_bytes(LowBit type);

/// Rewrites a row-major matrix into the interleaved layout (no-op when it is
/// already), in parallel over row groups when `pool` is given. Throws
/// woq::Error unless can_interleave(w).
void interleave_rows(QuantMatrix& w, ThreadPool* pool = nullptr);

/// An all-zero interleaved [rows, cols] matrix in `spec`'s format, every
/// buffer sized (padding rows of scale 0 included), for put_interleaved_row to
/// fill. Throws woq::Error unless the layout can be interleaved.
QuantMatrix allocate_interleaved(std::int64_t rows, std::int64_t cols, const QuantSpec& spec);

/// Stores row `row` of an interleaved matrix from its stored integers
/// q[0, 32 · ceil(cols / 32)) (nibbles 0..15 for the 4-bit formats, -127..127
/// for sym_int8; zero past cols) and its groups' rules[0, groups_per_row)
/// (their scales and, for asym_int4, zero points): the bytes interleave_rows gives.
void put_interleaved_row(QuantMatrix& w, std::int64_t row, const std::int32_t* q, const GroupRule* rules);

/// Rewrites an interleaved matrix back into the row-major layout (no-op when
/// it is already row-major): the exact inverse of interleave_rows.
void deinterleave_rows(QuantMatrix& w);

/// Row `row` of an interleaved matrix in the row-major layout: its packed
/// bytes into data[0, row_bytes), its scales into scales[0, groups_per_row)
/// and, for asym_int4, its zero points into zeros[0, groups_per_row).
void gather_row(const QuantMatrix& w, std::int64_t row, std::uint8_t* data, std::uint16_t* scales,
                std::uint8_t* zeros);

}  // namespace woq
