#include "core/regex.h"

#include <algorithm>
#include <ctime>
#include <cstdint>
#include <optional>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "core/utf8.h"

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

// PCRE2's interpreter keeps backtracking frames on the heap: at most this many KiB (its default is 20 GB).
constexpr std::uint32_t kHeapLimitKib = 512 * 1024;
// The JIT's stack grows up to this many bytes; a search that needs more runs in the interpreter.
constexpr std::size_t kJitStackBytes = 4 << 20;

// CPU seconds this thread has used (what other threads and processes do not change).
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// One find_all's matching state and its work budget.
class Matcher {
 public:
  Matcher(const Regex& re, pcre2_code* code, bool jit, std::string_view text, std::string_view source,
          std::uint32_t match_limit = 0)
      : re_(re), code_(code), jit_(jit), text_(text), source_(source),
        subject_(reinterpret_cast<PCRE2_SPTR>(text.data())),
        budget_s_(Regex::kBudgetSeconds + Regex::kBudgetSecondsPerByte * static_cast<double>(text.size())),
        start_s_(thread_cpu_seconds()) {
    data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    context_ = pcre2_match_context_create(nullptr);
    if (jit_) stack_ = pcre2_jit_stack_create(32 * 1024, kJitStackBytes, nullptr);
    if (data_ == nullptr || context_ == nullptr || (jit_ && stack_ == nullptr)) failure("out of memory");
    pcre2_set_heap_limit(context_, kHeapLimitKib);
    if (match_limit != 0) pcre2_set_match_limit(context_, match_limit);
    if (stack_ != nullptr) pcre2_jit_stack_assign(context_, nullptr, stack_);
  }
  ~Matcher() {
    pcre2_match_data_free(data_);
    pcre2_match_context_free(context_);
    pcre2_jit_stack_free(stack_);
  }
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // The leftmost match at or after `start`: {begin, end}, or nullopt. PCRE2's own match limit bounds one
  // search at one position; the CPU time of all searches together is checked between them, which bounds
  // patterns that rescan the rest of the text from every position (\p{L}*\d|. over letters) and those that
  // backtrack to just under the match limit at every position ((a|aa)*b|.).
  // `anchored`: only a match that begins at `start` (the JIT does not take PCRE2_ANCHORED at match time).
  std::optional<std::pair<std::size_t, std::size_t>> next(std::size_t start, bool anchored = false) {
    int rc = jit_ && !anchored ? pcre2_jit_match(code_, subject_, text_.size(), start, 0, data_, context_)
                               : PCRE2_ERROR_JIT_STACKLIMIT;
    // The interpreter keeps its backtracking state on the heap: it takes over when the JIT stack is too small.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
      rc = pcre2_match(code_, subject_, text_.size(), start, PCRE2_NO_JIT | (anchored ? PCRE2_ANCHORED : 0u), data_,
                       context_);
    // Every 32 searches (reading a thread's CPU clock is a system call): one search is bounded by the match
    // limit or by one pass over the text.
    if (++searches_ % 32 == 0 && thread_cpu_seconds() - start_s_ > budget_s_)
      failure(fmt::format("matching {} bytes of text took more than {:.2f} s of CPU time; the pattern backtracks or "
                          "rescans too much", text_.size(), budget_s_));
    if (rc == PCRE2_ERROR_NOMATCH) return std::nullopt;
    if (rc == PCRE2_ERROR_MATCHLIMIT)
      failure("matching backtracks too much: more than PCRE2's match limit at one position");
    if (rc == PCRE2_ERROR_HEAPLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT)
      failure(fmt::format("matching needs more than {} MiB of backtracking memory", kHeapLimitKib / 1024));
    if (rc < 0) failure(fmt::format("matching failed: {}", pcre2_message(rc)));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
    if (ov[0] > ov[1] || ov[1] > text_.size() || ov[0] < start) failure("a match outside the text");
    return std::pair<std::size_t, std::size_t>(ov[0], ov[1]);
  }

 private:
  [[noreturn]] void failure(const std::string& what) const {
    fail("{}{}regex '{}': {}", source_, source_.empty() ? "" : ": ", printable(re_.pattern()), what);
  }

  const Regex& re_;
  pcre2_code* code_;
  bool jit_;
  std::string_view text_, source_;
  PCRE2_SPTR subject_;
  double budget_s_, start_s_;
  std::uint64_t searches_ = 0;
  pcre2_match_data* data_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* stack_ = nullptr;
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
      start = std::min(text.size(), b + utf8_lead_length(static_cast<unsigned char>(text[b])));
    } else {
      out.emplace_back(b, e);
      start = e;
    }
    last_end = e;
  }
  return out;
}

bool Regex::match_at_start(std::string_view text) const {
  Matcher m(*this, code_->code, code_->jit, text, source_, kPrefixMatchLimit);
  return m.next(0, true).has_value();
}

}  // namespace woq
