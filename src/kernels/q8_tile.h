// Helpers shared by the integer-path tile kernels of every SIMD ISA
// (matmul_avx2.cc, matmul_avx512.cc). Internal to src/kernels.
#pragma once

#include <bit>
#include <cstdint>

#include "formats/low_bit.h"
#include "kernels/q8_activations.h"

namespace woq::detail {

/// Group of activation block b of a row: a shift when blocks per group is a
/// power of two (group sizes 32/64/128, per channel with such a block count),
/// else a division.
class GroupOf {
 public:
  GroupOf(const QuantMatrix& w, std::int64_t blocks)
      : bpg_(w.groups_per_row == 1 ? blocks : w.group_size / kQ8Block),
        shift_(std::has_single_bit(static_cast<std::uint64_t>(bpg_))
                   ? std::countr_zero(static_cast<std::uint64_t>(bpg_))
                   : -1) {}
  std::int64_t operator()(std::int64_t b) const { return shift_ >= 0 ? b >> shift_ : b / bpg_; }

 private:
  std::int64_t bpg_;
  int shift_;
};

/// Software prefetch distance ahead of a row group's weight stream, in bytes
/// (chosen by measurement on lm_head-sized matrices, out of cache).
/// Prefetching past the end of the weights is harmless (prefetches do not fault).
inline constexpr std::int64_t kPrefetchBytes = 1024;

}  // namespace woq::detail
