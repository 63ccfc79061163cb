// Progress of long work (loading, quantizing, evaluating), as a callback the
// library calls and the engine's own terminal line.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace woq {

/// Called with (done, total) after each unit of work (a layer, a chunk, an
/// item); done runs from 1 to total.
using Progress = std::function<void(std::int64_t done, std::int64_t total)>;

/// Work that finishes sooner shows no progress line.
inline constexpr double kTerminalProgressDelaySeconds = 1.0;

/// A line "woq: WHAT done/total (s, ETA s)" rewritten in place on stderr
/// when stderr is a terminal, from the first call after
/// kTerminalProgressDelaySeconds (ends with a newline at done == total);
/// null (no output) when stderr is not a terminal.
Progress terminal_progress(std::string what);

}  // namespace woq
