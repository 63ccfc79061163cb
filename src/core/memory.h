// How much memory this process may still take.
#pragma once

#include <cstdint>
#include <optional>

namespace woq {

/// Bytes the system can give this process without swapping: MemAvailable of
/// /proc/meminfo, lowered to the room left under the cgroup v2 limit
/// (/sys/fs/cgroup/memory.max minus memory.current) when there is one.
/// nullopt when neither can be read (not Linux).
std::optional<std::int64_t> available_memory_bytes();

/// Size in bytes of the largest CPU cache (L3, else L2) as sysconf reports it
/// (glibc reads it from CPUID); nullopt when it reports none. Under a VM this
/// may be the host's whole shared L3.
std::optional<std::int64_t> last_level_cache_bytes();

/// Peak resident set size of this process so far, in bytes (getrusage).
std::uint64_t peak_rss_bytes();

/// Resident set size of this process now, in bytes (/proc/self/statm); 0 when unknown.
std::uint64_t current_rss_bytes();

}  // namespace woq
