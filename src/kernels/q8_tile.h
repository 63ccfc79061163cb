// Helpers shared by the integer- and bf16-path tile kernels of every SIMD ISA
// (matmul_avx2.cc, matmul_avx512.cc, matmul_avx512_bf16.cc, matmul_amx.cc). Internal to src/kernels.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

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

/// Whether block b of a row ends a scale unit: the blocks that share both the weights' group (group_of)
/// and the activations' scale (a.scale_blocks, a power of two); with int8 activations every block does.
/// A unit's exact integer sums meet the scales once (matmul.cc's reference).
inline bool unit_ends(const GroupOf& group_of, const Q8Activations& a, std::int64_t b) {
  return b + 1 == a.blocks || ((b + 1) & (a.scale_blocks - 1)) == 0 || group_of(b + 1) != group_of(b);
}

/// Software prefetch distance ahead of a row group's weight stream, in bytes
/// (chosen by measurement on lm_head-sized matrices, out of cache).
/// Prefetching past the end of the weights is harmless (prefetches do not fault).
inline constexpr std::int64_t kPrefetchBytes = 1024;

/// fn(std::integral_constant<LowBit, T>{}) for the integer format T of `type`; nothing for a float format
/// (those never take the integer path).
template <typename Fn>
inline void for_integer_format(LowBit type, const Fn& fn) {
  switch (type) {
    case LowBit::kSymInt4: return fn(std::integral_constant<LowBit, LowBit::kSymInt4>{});
    case LowBit::kAsymInt4: return fn(std::integral_constant<LowBit, LowBit::kAsymInt4>{});
    case LowBit::kSymInt8: return fn(std::integral_constant<LowBit, LowBit::kSymInt8>{});
    default: break;
  }
}

}  // namespace woq::detail
