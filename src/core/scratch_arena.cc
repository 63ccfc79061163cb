#include "core/scratch_arena.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

#include "core/error.h"

namespace woq {
namespace {
constexpr std::align_val_t kAlign{64};
}

void ScratchArena::Free::operator()(std::byte* p) const { ::operator delete[](p, kAlign); }

std::byte* ScratchArena::bytes_of(int slot, std::int64_t count, std::size_t size) {
  if (slot < 0 || slot >= kSlots) fail("scratch slot {} is outside [0, {})", slot, kSlots);
  if (count < 0) fail("scratch slot {}: a negative count ({})", slot, count);
  if (static_cast<std::uint64_t>(count) > SIZE_MAX / size) fail("scratch slot {}: {} items do not fit in memory", slot, count);
  const auto i = static_cast<std::size_t>(slot);
  const std::size_t want = static_cast<std::size_t>(count) * size;
  if (want > size_[i] || !data_[i]) {
    data_[i].reset();  // free before allocating the larger buffer (contents are not kept)
    size_[i] = 0;
    const std::size_t bytes = std::max<std::size_t>(want, 64);
    data_[i].reset(static_cast<std::byte*>(::operator new[](bytes, kAlign)));
    size_[i] = bytes;
#ifndef NDEBUG
    std::memset(data_[i].get(), 0xff, bytes);  // NaNs as floats: a kernel that reads before writing shows
#endif
  }
  return data_[i].get();
}

std::int64_t ScratchArena::bytes() const {
  std::int64_t total = 0;
  for (std::size_t s : size_) total += static_cast<std::int64_t>(s);
  return total;
}

}  // namespace woq
