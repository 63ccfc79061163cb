#include "formats/interleave.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/scale.h"

namespace woq {

namespace {

std::int64_t blocks_of(const QuantMatrix& w) { return (w.cols + kInterleaveBlock - 1) / kInterleaveBlock; }
std::int64_t row_groups(const QuantMatrix& w) { return (w.rows + kInterleaveRows - 1) / kInterleaveRows; }

// Copies row `row` between the row-major bytes `flat` and its interleaved
// blocks: into them (kToBlocks) or out of them. Values past K are zero in
// the blocks.
template <bool kToBlocks>
void copy_row_values(const QuantMatrix& w, std::int64_t row,
                     std::conditional_t<kToBlocks, const std::uint8_t*, std::uint8_t*> flat,
                     std::conditional_t<kToBlocks, std::uint8_t*, const std::uint8_t*> blocks) {
  const std::int64_t nb = blocks_of(w), bb = interleaved_block_bytes(w.type), k = w.cols;
  const std::int64_t base = (row / kInterleaveRows) * nb * bb + 4 * (row % kInterleaveRows);
  for (std::int64_t b = 0; b < nb; ++b) {
    auto* dst = blocks + base + b * bb;
    const std::int64_t c0 = b * kInterleaveBlock;
    if (is_int4(w.type)) {
      for (std::int64_t v = 0; v < 16; ++v) {
        auto& byte = dst[(v / 4) * 32 + v % 4];
        const std::int64_t lo = c0 + v, hi = c0 + 16 + v;
        if constexpr (kToBlocks) {
          byte = static_cast<std::uint8_t>((lo < k ? codec::get_nibble(flat, lo) : 0) |
                                           (hi < k ? codec::get_nibble(flat, hi) : 0) << 4);
        } else {
          if (lo < k) codec::put_nibble(flat, lo, byte & 0x0f);
          if (hi < k) codec::put_nibble(flat, hi, byte >> 4);
        }
      }
    } else {
      for (std::int64_t i = 0; i < kInterleaveBlock && c0 + i < k; ++i) {
        auto& byte = dst[(i / 4) * 32 + i % 4];
        if constexpr (kToBlocks) {
          byte = flat[c0 + i];
        } else {
          flat[c0 + i] = byte;
        }
      }
    }
  }
}

// Index of row `row`'s group `grp` in the interleaved scales / zeros.
std::size_t group_slot(const QuantMatrix& w, std::int64_t row, std::int64_t grp) {
  return static_cast<std::size_t>(((row / kInterleaveRows) * w.groups_per_row + grp) * kInterleaveRows +
                                  row % kInterleaveRows);
}

}  // namespace

bool can_interleave(const QuantMatrix& w) {
  return is_quantized(w.type) && (w.groups_per_row == 1 || w.group_size % kInterleaveBlock == 0);
}

std::int64_t interleaved_block_bytes(LowBit type) { return is_int4(type) ? 128 : 256; }

void interleave_rows(QuantMatrix& w, ThreadPool* pool) {
  if (w.interleave == kInterleaveRows) return;
  if (!can_interleave(w))
    fail("interleave_rows: {} with group_size {} cannot be interleaved (needs an integer format with groups of "
         "whole 32-blocks)",
         low_bit_name(w.type), w.group_size);
  const std::int64_t groups = row_groups(w);
  std::vector<std::uint8_t> data(static_cast<std::size_t>(groups * blocks_of(w) * interleaved_block_bytes(w.type)));
  std::vector<std::uint16_t> scales(static_cast<std::size_t>(groups * w.groups_per_row * kInterleaveRows));
  std::vector<std::uint8_t> zeros(w.zeros.empty() ? 0 : scales.size());
  auto convert = [&](std::int64_t g0, std::int64_t g1) {
    for (std::int64_t n = g0 * kInterleaveRows; n < std::min(w.rows, g1 * kInterleaveRows); ++n) {
      copy_row_values<true>(w, n, w.data.data() + n * w.row_bytes, data.data());
      for (std::int64_t g = 0; g < w.groups_per_row; ++g) {
        const std::size_t from = static_cast<std::size_t>(n * w.groups_per_row + g);
        scales[group_slot(w, n, g)] = w.scales[from];
        if (!zeros.empty()) zeros[group_slot(w, n, g)] = w.zeros[from];
      }
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(groups, convert, 4);
  } else {
    convert(0, groups);
  }
  w.data = std::move(data);
  w.scales = std::move(scales);
  w.zeros = std::move(zeros);
  w.interleave = kInterleaveRows;
}

QuantMatrix allocate_interleaved(std::int64_t rows, std::int64_t cols, const QuantSpec& spec) {
  QuantMatrix w = matrix_layout(rows, cols, spec);
  if (!can_interleave(w))
    fail("{} with group_size {} cannot be interleaved (needs an integer format with groups of whole 32-blocks)",
         low_bit_name(w.type), w.group_size);
  w.data.assign(static_cast<std::size_t>(row_groups(w) * blocks_of(w) * interleaved_block_bytes(w.type)), 0);
  w.scales.assign(static_cast<std::size_t>(row_groups(w) * w.groups_per_row * kInterleaveRows), 0);
  if (w.type == LowBit::kAsymInt4) w.zeros.assign(w.scales.size(), 0);
  w.interleave = kInterleaveRows;
  return w;
}

void put_interleaved_row(QuantMatrix& w, std::int64_t row, const std::int32_t* q, const GroupRule* rules) {
  const std::int64_t nb = blocks_of(w), bb = interleaved_block_bytes(w.type);
  // Block b, chunk c, this row's 4 bytes at 4 (row % 8) of the chunk (interleave.h).
  std::uint8_t* dst = w.data.data() + (row / kInterleaveRows) * nb * bb + 4 * (row % kInterleaveRows);
  for (std::int64_t b = 0; b < nb; ++b, dst += bb) {
    const std::int32_t* v = q + b * kInterleaveBlock;
    if (is_int4(w.type)) {
      for (std::int64_t i = 0; i < 16; ++i) dst[(i / 4) * 32 + i % 4] = static_cast<std::uint8_t>(v[i] | v[16 + i] << 4);
    } else {
      for (std::int64_t i = 0; i < kInterleaveBlock; ++i)
        dst[(i / 4) * 32 + i % 4] = static_cast<std::uint8_t>(static_cast<std::int8_t>(v[i]));
    }
  }
  for (std::int64_t g = 0; g < w.groups_per_row; ++g) {
    w.scales[group_slot(w, row, g)] = rules[g].scale;
    if (!w.zeros.empty()) w.zeros[group_slot(w, row, g)] = static_cast<std::uint8_t>(rules[g].zero);
  }
}

void gather_row(const QuantMatrix& w, std::int64_t row, std::uint8_t* data, std::uint16_t* scales,
                std::uint8_t* zeros) {
  copy_row_values<false>(w, row, data, w.data.data());
  for (std::int64_t g = 0; g < w.groups_per_row; ++g) {
    scales[g] = w.scales[group_slot(w, row, g)];
    if (w.type == LowBit::kAsymInt4) zeros[g] = w.zeros[group_slot(w, row, g)];
  }
}

void deinterleave_rows(QuantMatrix& w) {
  if (w.interleave == 1) return;
  std::vector<std::uint8_t> data(static_cast<std::size_t>(w.rows * w.row_bytes));
  std::vector<std::uint16_t> scales(static_cast<std::size_t>(w.rows * w.groups_per_row));
  std::vector<std::uint8_t> zeros(w.zeros.empty() ? 0 : scales.size());
  for (std::int64_t n = 0; n < w.rows; ++n)
    gather_row(w, n, data.data() + n * w.row_bytes, scales.data() + n * w.groups_per_row,
               zeros.empty() ? nullptr : zeros.data() + n * w.groups_per_row);
  w.data = std::move(data);
  w.scales = std::move(scales);
  w.zeros = std::move(zeros);
  w.interleave = 1;
}

}  // namespace woq
