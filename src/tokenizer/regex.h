// Regular expressions of tokenizer.json (Oniguruma syntax as Hugging Face
// tokenizers compiles them: \p{L}, \p{N}, (?i:...), (?!...)) through PCRE2
// with UTF and Unicode properties (PCRE2_UTF | PCRE2_UCP), JIT-compiled.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace woq {

class Regex {
 public:
  /// Compiles `pattern`. Throws woq::Error "cannot compile regex 'P': MESSAGE
  /// at offset N" when PCRE2 rejects it (\C, one byte inside a character, is refused).
  /// `source` (e.g. "PATH: pre_tokenizer.pattern") prefixes matching errors.
  explicit Regex(const std::string& pattern, std::string source = {});
  /// A regex matching `literal` exactly (tokenizer.json's {"String": ...} patterns).
  static Regex literal(std::string_view literal);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  /// Non-overlapping matches [begin, end) of `text`, left to right,
  /// leftmost-first as Oniguruma's find_iter: after an empty match the search
  /// resumes one character later. Ill-formed UTF-8 in `text` never matches.
  /// Work is bounded for the whole text, not per position: PCRE2's match
  /// limit is charged to a budget of kBudgetBase + kBudgetPerByte steps per
  /// byte of `text` (each search starts with a small limit, doubled when it is
  /// reached), so a pattern that backtracks a lot at every position (e.g.
  /// `(a|aa)*b|.`) fails fast instead of taking minutes. Throws woq::Error,
  /// naming `source`, when the budget or PCRE2's depth or heap limit is
  /// exhausted, or PCRE2 fails otherwise.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

  /// Matching steps (PCRE2 match-limit units) every text may spend, plus per byte.
  static constexpr std::uint64_t kBudgetBase = 1'000'000, kBudgetPerByte = 256;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::string source_;
  std::unique_ptr<Code> code_;
};

}  // namespace woq
