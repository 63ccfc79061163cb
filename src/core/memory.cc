#include "core/memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

namespace woq {

namespace {

std::optional<std::int64_t> read_number(const char* path) {
  std::ifstream in(path);
  std::int64_t v = 0;
  if (in >> v) return v;
  return std::nullopt;  // also "max" (no limit)
}

}  // namespace

std::optional<std::int64_t> available_memory_bytes() {
  std::optional<std::int64_t> available;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);)
    if (line.rfind("MemAvailable:", 0) == 0) {
      available = std::stoll(line.substr(13)) * 1024;  // "MemAvailable:   123456 kB"
      break;
    }
  const auto limit = read_number("/sys/fs/cgroup/memory.max"), used = read_number("/sys/fs/cgroup/memory.current");
  if (limit && used) available = std::min(available.value_or(*limit - *used), *limit - *used);
  return available;
}

std::optional<std::int64_t> last_level_cache_bytes() {
  for (const int level : {_SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long bytes = sysconf(level);
    if (bytes > 0) return bytes;
  }
  return std::nullopt;
}

std::uint64_t peak_rss_bytes() {
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  return static_cast<std::uint64_t>(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

std::uint64_t current_rss_bytes() {
  std::ifstream in("/proc/self/statm");
  std::uint64_t size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return resident * static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace woq
