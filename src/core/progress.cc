#include "core/progress.h"

#include <unistd.h>

#include <chrono>
#include <utility>

#include <fmt/core.h>

namespace woq {

Progress terminal_progress(std::string what) {
  if (isatty(STDERR_FILENO) == 0) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  return [start, what = std::move(what), shown = false](std::int64_t done, std::int64_t total) mutable {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!shown && s < kTerminalProgressDelaySeconds) return;  // quick work shows no line
    shown = true;
    fmt::print(stderr, "\rwoq: {} {}/{} ({:.0f} s, ETA {:.0f} s)   {}", what, done, total, s,
               s / static_cast<double>(done) * static_cast<double>(total - done), done == total ? "\n" : "");
  };
}

}  // namespace woq
