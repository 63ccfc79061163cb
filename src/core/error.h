// Error type thrown by every woq library function on bad input or a failed
// operation. Messages name the file, tensor or field involved, so a caller can
// print e.what() as-is.
#pragma once

#include <stdexcept>
#include <string>

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

}  // namespace woq
