#include "generate/stop_strings.h"

#include <algorithm>
#include <utility>

namespace woq {

StopStringFilter::StopStringFilter(const std::vector<std::string>& stops) {
  for (const auto& s : stops)
    if (!s.empty()) stops_.push_back(s);
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
