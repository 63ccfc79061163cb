// Stop strings for streamed generation (lm-eval's `until`, OpenAI's `stop`).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace woq {

/// Holds back generated text that could be the start of a stop string and
/// finds the first stop string in it, so that streamed text never contains
/// (part of) a stop string that later completes.
class StopStringFilter {
 public:
  /// Empty strings in `stops` are ignored. Throws woq::Error for a stop
  /// string that is not valid UTF-8.
  explicit StopStringFilter(const std::vector<std::string>& stops);

  /// Appends `piece`; returns the text now safe to emit. Once a stop string
  /// appears, stopped() is true and the returned text ends just before it.
  std::string push(std::string_view piece);
  /// The text still held back (call at the end of generation).
  std::string flush();
  bool stopped() const { return !matched_.empty(); }
  /// The stop string that appeared first in the text, if stopped().
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
};

}  // namespace woq
