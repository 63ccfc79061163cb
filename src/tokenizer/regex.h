// Regular expressions of tokenizer.json (Oniguruma syntax as Hugging Face
// tokenizers compiles them: \p{L}, \p{N}, (?i:...), (?!...)) through PCRE2
// with UTF and Unicode properties (PCRE2_UTF | PCRE2_UCP), JIT-compiled.
#pragma once

#include <cstddef>
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
  explicit Regex(const std::string& pattern);
  /// A regex matching `literal` exactly (tokenizer.json's {"String": ...} patterns).
  static Regex literal(std::string_view literal);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  /// Non-overlapping matches [begin, end) of `text`, left to right,
  /// leftmost-first as Oniguruma's find_iter: after an empty match the search
  /// resumes one character later. Ill-formed UTF-8 in `text` never matches.
  /// Throws woq::Error if PCRE2 fails (e.g. its match limit).
  std::vector<std::pair<std::size_t, std::size_t>> find_all(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::string pattern_;
  std::unique_ptr<Code> code_;
};

}  // namespace woq
