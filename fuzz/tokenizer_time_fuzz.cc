// Tokenizing time against text length (issue 29): the first byte picks one of
// the repository's real tokenizers, the second is the length h of a head (at most
// 16 bytes), then the head, then a unit of text: the head once and the unit
// repeated to 4 KB and to 32 KB (e.g. head "a", unit two combining marks: one
// long run of marks). A tokenizer whose time grows faster than linearly (a quadratic
// normalizer, a regex that rescans the rest of a run at every position, BPE on a
// long word) takes far more than 8x as long for the long text: more than 32x
// (with 4 ms as the least short time, against timer noise) is a finding. Crashes
// and broken API promises are the other targets' job; here an exception is fine.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/error.h"
#include "fuzz_common.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_check.h"

namespace {

// `head`, then `unit` repeated to at least `bytes` bytes.
std::string repeat(std::string_view head, std::string_view unit, std::size_t bytes) {
  std::string s(head);
  s.reserve(bytes + unit.size());
  while (s.size() < bytes) s += unit;
  return s;
}

// Milliseconds encode(text) takes, the best of two; -1 when it throws (a refused text, e.g. a regex budget).
double encode_ms(const woq::Tokenizer& tok, const std::string& text) {
  double best = 1e300;
  for (int rep = 0; rep < 2; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    try {
      (void)tok.encode(text, false);
    } catch (const woq::Error&) {
      return -1;
    }
    best = std::min(best, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  return best;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  woq_fuzz::bundled_tokenizers();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 3) return 0;
  const auto& all = woq_fuzz::bundled_tokenizers();
  const woq::Tokenizer& tok = *all[data[0] % all.size()].tok;
  const std::size_t h = std::min<std::size_t>(data[1] % 17, size - 3);
  const std::string_view head(reinterpret_cast<const char*>(data) + 2, h);
  const std::string_view unit(reinterpret_cast<const char*>(data) + 2 + h, std::min<std::size_t>(size - 2 - h, 256));
  const double short_ms = encode_ms(tok, repeat(head, unit, 4 << 10));
  const double long_ms = encode_ms(tok, repeat(head, unit, 32 << 10));
  if (short_ms < 0 || long_ms < 0) return 0;
  WOQ_FUZZ_CHECK(long_ms <= 32 * std::max(short_ms, 4.0),
                 "tokenizer " + std::to_string(data[0] % all.size()) + ": '" + woq::printable(head) + "' then 4 KB of '" +
                     woq::printable(unit) + "' in " +
                     std::to_string(short_ms) + " ms, 32 KB in " + std::to_string(long_ms) + " ms (more than linear)");
  return 0;
}
