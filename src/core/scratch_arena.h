// Reusable scratch memory of one thread.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>

namespace woq {

/// Growable scratch buffers of one thread, kept from call to call so that hot
/// loops do not allocate (STYLE.md "device buffers"): buffer `slot` (< kSlots)
/// holds at least the largest count asked of it so far, 64-byte aligned,
/// contents unspecified. Callers own fixed slot numbers (kernels/workspace.h
/// lists them); a pointer stays valid until the next get of a larger count
/// from the same slot. Not thread-safe: one arena per thread (Workspace).
class ScratchArena {
 public:
  static constexpr int kSlots = 8;

  /// At least `count` Ts of buffer `slot`. Throws woq::Error for a bad slot
  /// or a negative count; std::bad_alloc when memory runs out.
  template <typename T>
  T* get(int slot, std::int64_t count) {
    return reinterpret_cast<T*>(bytes_of(slot, count, sizeof(T)));
  }

  /// Bytes held by all slots.
  std::int64_t bytes() const;

 private:
  std::byte* bytes_of(int slot, std::int64_t count, std::size_t size);
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::array<std::unique_ptr<std::byte[], Free>, kSlots> data_;
  std::array<std::size_t, kSlots> size_{};
};

}  // namespace woq
