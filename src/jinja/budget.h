// The sandbox's limits (jinja.h) and the steps a render has taken.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace woq::jinja::impl {

// The sandbox's limits (jinja.h), each reached in well under a second.
constexpr int kMaxDepth = 512;                 // nesting of a value: the input's, or one the template builds
constexpr int kMaxTemplateDepth = 128;         // nesting of blocks, and of an expression's operators and brackets
constexpr std::size_t kMaxSize = 16u << 20;    // bytes of the output, and of any one string or list (Value::size)
constexpr std::size_t kMaxLength = 1'000'000;  // elements of any one list (range() included)
// Steps per render. A step is about one expression node's work (some 50 ns); a loop
// iteration costs 4, a list element built or copied 2, a string built, copied, compared
// or scanned one more per 64 bytes, and a dict lookup one more per 16 keys it scans.
constexpr std::int64_t kMaxSteps = 5'000'000;
constexpr std::int64_t kIterationSteps = 4, kElementSteps = 2, kBytesPerStep = 64, kKeysPerStep = 16;

/// Throws TemplateError "chat template line `line`: `what`".
[[noreturn]] void error(int line, const std::string& what);

/// Throws unless a list of `n` elements (or a string of `n` bytes) fits `limit`: kMaxLength (kMaxSize).
void room(std::size_t n, std::size_t limit, int line, std::string_view what);

// The steps one render has taken.
class Budget {
 public:
  /// Takes `n` more steps; false once the render has taken more than kMaxSteps.
  bool spend(std::int64_t n) { return (steps_ += n) <= kMaxSteps; }
  /// spend(n), or the error naming `what` (the construct) and the line.
  void charge(std::int64_t n, int line, std::string_view what) {
    if (!spend(n)) exhausted(line, what);
  }
  [[noreturn]] static void exhausted(int line, std::string_view what);

 private:
  std::int64_t steps_ = 0;
};

}  // namespace woq::jinja::impl
