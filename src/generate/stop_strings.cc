#include "generate/stop_strings.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace woq {

namespace {

// Whether `s` is well-formed UTF-8 (no stray continuation bytes, no truncated sequences).
bool valid_utf8(std::string_view s) {
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (std::size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    i += n;
  }
  return true;
}

}  // namespace

StopStringFilter::StopStringFilter(const std::vector<std::string>& stops) {
  for (const auto& s : stops) {
    if (!valid_utf8(s)) fail("a stop string is not valid UTF-8 (it could match inside a character)");
    if (!s.empty()) stops_.push_back(s);
  }
}

std::string StopStringFilter::push(std::string_view piece) {
  if (stopped()) return {};
  pending_ += piece;
  std::size_t first = std::string::npos;
  for (const auto& s : stops_) {
    const std::size_t at = pending_.find(s);
    if (at < first) {
      first = at;
      matched_ = s;
    }
  }
  if (first != std::string::npos) {
    std::string out = pending_.substr(0, first);
    pending_.clear();
    return out;
  }
  std::size_t hold = 0;  // the longest suffix of pending_ that is a proper prefix of a stop string
  for (const auto& s : stops_)
    for (std::size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n)
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringFilter::flush() { return std::exchange(pending_, {}); }

}  // namespace woq
