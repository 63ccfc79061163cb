// Regular expressions through PCRE2 with UTF and Unicode properties
// (PCRE2_UTF | PCRE2_UCP), JIT-compiled: tokenizer.json's patterns (Oniguruma
// syntax as Hugging Face tokenizers compiles them: \p{L}, \p{N}, (?i:...),
// (?!...)) and the module-name rules of GPTQ checkpoints (Python's re).
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
  /// Work is bounded for the whole text, not only per position: besides
  /// PCRE2's match limit at each position, all searches of one call together
  /// may take kBudgetSeconds + kBudgetSecondsPerByte per byte of `text` of
  /// this thread's CPU time (at least 1 MB/s; the real tokenizers' patterns
  /// run at 50-500 MB/s), so a pattern that backtracks a lot at every
  /// position (`(a|aa)*b|.`) or rescans the rest of the text from every
  /// position (`\p{L}*\d|.`) fails within about a second instead of taking
  /// minutes. Throws woq::Error, naming `source`, when the budget or PCRE2's
  /// match, depth or heap limit is exhausted, or PCRE2 fails otherwise.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

  /// True when a match begins at the start of `text` (it may end anywhere):
  /// Python's re.match, which GPTQModel's and vLLM's `dynamic` rules use.
  /// Bounded by kPrefixMatchLimit backtracking steps (about a millisecond)
  /// and PCRE2's depth and heap limits (throws woq::Error naming `source`
  /// when one is exhausted): for short texts such as module names.
  bool match_at_start(std::string_view text) const;
  static constexpr std::uint32_t kPrefixMatchLimit = 100000;

  /// CPU time one find_all may take: this much, plus the next per byte of text.
  static constexpr double kBudgetSeconds = 0.5, kBudgetSecondsPerByte = 1e-6;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::string source_;
  std::unique_ptr<Code> code_;
};

}  // namespace woq
