#include "tokenizer/regex.h"

#include <algorithm>
#include <cstdint>
#include <optional>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "core/utf8.h"
#include "tokenizer/unicode.h"

namespace woq {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof buffer);
  return reinterpret_cast<const char*>(buffer);
}

}  // namespace

Regex::Regex(const std::string& pattern, std::string source)
    : pattern_(pattern), source_(std::move(source)), code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // MATCH_INVALID_UTF: subjects may hold ill-formed UTF-8 (raw bytes from a byte-level decoder),
  // which then never matches instead of being undefined behaviour; \C (one code unit) is refused.
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | PCRE2_NEVER_BACKSLASH_C, &error,
                              &offset, nullptr);
  if (code_->code == nullptr)
    fail("cannot compile regex '{}': {} at offset {}", printable(pattern), pcre2_message(error), offset);
  code_->jit = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex Regex::literal(std::string_view literal) {
  std::string quoted;
  for (const char c : literal) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) quoted += '\\';
    quoted += c;
  }
  return Regex(quoted);
}

Regex::~Regex() = default;
Regex::Regex(Regex&&) noexcept = default;
Regex& Regex::operator=(Regex&&) noexcept = default;

namespace {

// The first match limit of a search; doubled each time PCRE2 reports reaching it. The pre-tokenizer
// patterns of real tokenizers need 2-4 (JIT) or 16 (interpreter) at every position, even for a match of
// 200 000 letters or spaces.
constexpr std::uint64_t kFirstLimit = 64;
// PCRE2's interpreter keeps backtracking frames on the heap: at most this many KiB.
constexpr std::uint32_t kHeapLimitKib = 64 * 1024;

// One find_all's matching state and its work budget.
class Matcher {
 public:
  Matcher(const Regex& re, pcre2_code* code, bool jit, std::string_view text, std::string_view source)
      : re_(re), code_(code), jit_(jit), text_(text), source_(source),
        subject_(reinterpret_cast<PCRE2_SPTR>(text.data())),
        budget_(Regex::kBudgetBase + Regex::kBudgetPerByte * static_cast<std::uint64_t>(text.size())) {
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    if (data_ == nullptr || context_ == nullptr) failure("out of memory");
    pcre2_set_heap_limit(context_, kHeapLimitKib);
  }
  ~Matcher() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
  }
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // The leftmost match at or after `start`: {begin, end}, or nullopt.
  //
  // PCRE2 resets its match limit at every start position a search tries, so a search under limit L that
  // tries P positions does up to L * P steps, and that is what is charged. A search first runs under
  // kFirstLimit; if some position needs more, the positions are tried one by one (anchored), each with a
  // limit doubled until it matches or fails by itself, every attempt charged its limit. Work is thus at
  // most twice the budget (the first search's positions are tried again), whatever the pattern and text.
  std::optional<std::pair<std::size_t, std::size_t>> next(std::size_t start) {
    const std::uint64_t positions = text_.size() - start + 1;
    if (kFirstLimit * positions <= budget_ - spent_) {
      const int rc = match(start, 0, kFirstLimit);
      if (rc != PCRE2_ERROR_MATCHLIMIT) {
        const auto found = result(rc);
        spent_ += kFirstLimit * (found ? found->first - start + 1 : positions);
        return found;
      }
      spent_ += kFirstLimit;  // at least one position reached the limit
    }
    for (std::size_t p = start; p <= text_.size();) {
      int rc = PCRE2_ERROR_MATCHLIMIT;
      for (std::uint64_t limit = kFirstLimit; rc == PCRE2_ERROR_MATCHLIMIT; limit *= 2) {
        const std::uint64_t tried = std::min<std::uint64_t>({limit, budget_ - spent_, UINT32_MAX});
        if (tried <= limit / 2)  // no more than the attempt before
          failure(fmt::format("matching {} bytes of text needs more than {} steps; the pattern backtracks too much",
                              text_.size(), budget_));
        rc = match(p, PCRE2_ANCHORED, tried);
        spent_ += tried;
      }
      if (auto found = result(rc)) return found;
      if (p == text_.size()) break;
      const std::size_t n = utf8_sequence_length(text_, p);
      p += n > 0 ? n : 1;
    }
    return std::nullopt;
  }

 private:
  int match(std::size_t start, std::uint32_t options, std::uint64_t limit) {
    pcre2_set_match_limit(context_, static_cast<std::uint32_t>(limit));
    int rc = jit_ ? pcre2_jit_match(code_, subject_, text_.size(), start, options, data_, context_)
                  : PCRE2_ERROR_JIT_STACKLIMIT;
    // The interpreter keeps its backtracking state on the heap: it takes over when the JIT stack is too small.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_, subject_, text_.size(), start, options | PCRE2_NO_JIT, data_, context_);
    return rc;
  }

  std::optional<std::pair<std::size_t, std::size_t>> result(int rc) {
    if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
    if (rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
      failure(fmt::format("matching needs more than {} MiB of backtracking memory", kHeapLimitKib / 1024));
    if (rc < 0) failure(fmt::format("matching failed: {}", pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
    if (ov[0] > ov[1] || ov[1] > text_.size()) failure("a match outside the text");
    return std::pair<std::size_t, std::size_t>(ov[0], ov[1]);
  }

  [[noreturn]] void failure(const std::string& what) const {
    fail("{}{}regex '{}': {}", source_, source_.empty() ? "" : ": ", printable(re_.pattern()), what);
  }

  const Regex& re_;
  pcre2_code* code_;
  bool jit_;
  std::string_view text_, source_;
  PCRE2_SPTR subject_;
  std::uint64_t budget_, spent_ = 0;
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
};

}  // namespace

std::vector<std::pair<std::size_t, std::size_t>> Regex::find_all(std::string_view text) const {
  std::vector<std::pair<std::size_t, std::size_t>> out;
  if (text.empty()) return out;
  Matcher m(*this, code_->code, code_->jit, text, source_);
  std::size_t start = 0;
  std::size_t last_end = std::string_view::npos;
  while (start <= text.size()) {
    const auto found = m.next(start);
    if (!found) break;
    const auto [b, e] = *found;
    if (b == e) {
      // An empty match: kept unless it touches the previous match, then one character on.
      if (b != last_end) out.emplace_back(b, e);
      if (b >= text.size()) break;
      start = std::min(text.size(), b + unicode::sequence_length(static_cast<unsigned char>(text[b])));
    } else {
      out.emplace_back(b, e);
      start = e;
    }
    last_end = e;
  }
  return out;
}

}  // namespace woq
