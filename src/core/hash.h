// FNV-1a, 64 bits (Fowler, Noll, Vo; http://www.isthe.com/chongo/tech/comp/fnv/): the digest woq uses to tell
// files and texts apart (resume manifests, calibration text, an MPI job's binaries and inputs). Not a
// cryptographic hash: it detects accidents, not adversaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <fmt/core.h>

namespace woq {

/// An FNV-1a 64 digest fed in pieces: add() in any split gives the digest of the concatenation.
struct Fnv1a64 {
  std::uint64_t h = 0xcbf29ce484222325ull;
  Fnv1a64& add(const void* bytes, std::size_t size) {
    const auto* p = static_cast<const unsigned char*>(bytes);
    for (std::size_t i = 0; i < size; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
    return *this;
  }
  Fnv1a64& add(std::string_view s) { return add(s.data(), s.size()); }
  /// 16 lower-case hex digits.
  std::string hex() const { return fmt::format("{:016x}", h); }
};

/// FNV-1a 64 of `bytes`, as 16 hex digits.
inline std::string fnv1a64_hex(const void* bytes, std::size_t size) { return Fnv1a64{}.add(bytes, size).hex(); }

}  // namespace woq
