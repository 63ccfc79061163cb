// Error type thrown by every woq library function on bad input or a failed
// operation. Messages name the file, tensor or field involved, so a caller can
// print e.what() as-is.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

namespace woq {

/// The one exception type of the woq library. Thrown for malformed files,
/// unsupported dtypes or shapes, invalid options and I/O failures.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Throws woq::Error with a fmt-formatted message.
template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

/// `text` as it may appear in an error message or a log line: bytes outside
/// printable ASCII escaped as \xNN and cut to `max_bytes` with "..." (inputs
/// may be binary or megabytes long, and must not forge log lines).
inline std::string printable(std::string_view text, std::size_t max_bytes = 60) {
  std::string out;
  for (const char c : text.substr(0, max_bytes)) {
    const auto u = static_cast<unsigned char>(c);
    out += u < 0x20 || u >= 0x7f ? fmt::format("\\x{:02x}", u) : std::string(1, c);
  }
  return text.size() > max_bytes ? out + "..." : out;
}

}  // namespace woq
