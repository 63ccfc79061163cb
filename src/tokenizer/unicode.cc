#include "tokenizer/unicode.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <vector>

#include "core/error.h"

namespace woq::unicode {

namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// Bytes of the maximal invalid subpart at s[i] (W3C / Unicode "best practice").
std::size_t invalid_subpart(std::string_view s, std::size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  std::size_t need = 0;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) need = 2;
  else if (c >= 0xe0 && c <= 0xef) need = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4) need = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else return 1;
  std::size_t k = 1;
  while (k < need && i + k < s.size()) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xbf)) break;
    ++k;
  }
  return k;
}

std::int32_t category(char32_t cp) { return utf8proc_category(static_cast<utf8proc_int32_t>(cp)); }

}  // namespace

std::string to_valid_utf8(std::string_view text) {
  if (is_valid_utf8(text)) return std::string(text);
  std::string out;
  out.reserve(text.size() + 16);
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence_length(text, i);
    if (n > 0) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out += kReplacement;
      i += invalid_subpart(text, i);
    }
  }
  return out;
}

std::size_t complete_prefix(std::string_view s) {
  std::size_t i = s.size();
  std::size_t back = 0;
  while (i > 0 && back < 4) {
    const auto c = static_cast<unsigned char>(s[i - 1]);
    ++back;
    if ((c & 0xc0) != 0x80) return back >= utf8_lead_length(c) ? s.size() : i - 1;  // lead byte or ASCII
    --i;
  }
  return s.size();
}

char32_t next_code_point(std::string_view s, std::size_t& i) {
  const auto c = static_cast<unsigned char>(s[i]);
  const std::size_t n = std::min(utf8_lead_length(c), s.size() - i);
  char32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3f);
  i += n;
  return cp;
}

std::string encode(char32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
  return out;
}

bool is_whitespace(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0d) || cp == 0x20 || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
         cp == 0x3000;
}

bool is_numeric(char32_t cp) {
  const std::int32_t c = category(cp);
  return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool is_word(char32_t cp) {
  const std::int32_t c = category(cp);
  return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_ME) || c == UTF8PROC_CATEGORY_ND ||
         c == UTF8PROC_CATEGORY_PC || cp == 0x200c || cp == 0x200d;
}

std::string normalize(std::string_view text, Form form) {
  if (text.empty()) return {};
  // Text below U+0300 (every byte < 0xCC) holds no combining marks, and its
  // precomposed characters recompose to themselves: it is already NFC.
  if (form == Form::kNfc &&
      std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0xcc; }))
    return std::string(text);
  int options = UTF8PROC_STABLE;
  switch (form) {
    case Form::kNfc: options |= UTF8PROC_COMPOSE; break;
    case Form::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case Form::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case Form::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  const auto opts = static_cast<utf8proc_option_t>(options);
  // utf8proc_map's canonical ordering is an insertion sort, quadratic in a run of
  // combining marks (100 KB of them took 5 s). The same steps, each linear or n log n:
  // decompose code point by code point, order each run of non-starters by a stable
  // sort on the combining class (what UAX #15's canonical ordering algorithm gives),
  // then compose and encode with utf8proc.
  std::vector<utf8proc_int32_t> buf;
  buf.reserve(text.size() + 1);
  utf8proc_int32_t piece[32];
  for (std::size_t i = 0; i < text.size();) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                                                  static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
    if (len <= 0 || cp < 0) fail("tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(UTF8PROC_ERROR_INVALIDUTF8));
    i += static_cast<std::size_t>(len);
    const utf8proc_ssize_t n = utf8proc_decompose_char(cp, piece, std::size(piece), opts, nullptr);
    if (n < 0 || n > static_cast<utf8proc_ssize_t>(std::size(piece)))
      fail("tokenizer: Unicode normalization failed: {}", n < 0 ? utf8proc_errmsg(n) : "decomposition too long");
    buf.insert(buf.end(), piece, piece + n);
  }
  const auto ccc = [](utf8proc_int32_t c) { return utf8proc_get_property(c)->combining_class; };
  for (std::size_t b = 0; b < buf.size();) {
    if (ccc(buf[b]) == 0) {
      ++b;
      continue;
    }
    std::size_t e = b + 1;
    while (e < buf.size() && ccc(buf[e]) != 0) ++e;
    if (e - b > 1)
      std::stable_sort(buf.begin() + static_cast<std::ptrdiff_t>(b), buf.begin() + static_cast<std::ptrdiff_t>(e),
                       [&](utf8proc_int32_t x, utf8proc_int32_t y) { return ccc(x) < ccc(y); });
    b = e;
  }
  const auto count = static_cast<utf8proc_ssize_t>(buf.size());
  buf.push_back(0);  // utf8proc_reencode writes a terminating NUL
  const utf8proc_ssize_t n = utf8proc_reencode(buf.data(), count, opts);
  if (n < 0) fail("tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n));
  return std::string(reinterpret_cast<const char*>(buf.data()), static_cast<std::size_t>(n));
}

std::string lowercase(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();)
    out += encode(static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(next_code_point(text, i)))));
  return out;
}

}  // namespace woq::unicode
