// UTF-8 well-formedness (Unicode 15, Table 3-7), for validating strings read
// from files before they reach messages, JSON or tokenizers.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>

namespace woq {

/// Byte length of the UTF-8 sequence led by `lead` (1 for a stray byte).
inline std::size_t utf8_lead_length(unsigned char lead) {
  return lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xe ? 3 : (lead >> 3) == 0x1e ? 4 : 1;
}

/// Length of the well-formed UTF-8 sequence at s[i] (i < s.size()), or 0
/// when the bytes there are ill-formed (overlong, surrogate, beyond U+10FFFF,
/// truncated).
inline std::size_t utf8_sequence_length(std::string_view s, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  const std::size_t n = s.size() - i;
  auto cont = [&](std::size_t k, unsigned char lo = 0x80, unsigned char hi = 0xbf) {
    return k < n && b(k) >= lo && b(k) <= hi;
  };
  if (c >= 0xc2 && c <= 0xdf) return cont(1) ? 2 : 0;
  if (c == 0xe0) return cont(1, 0xa0) && cont(2) ? 3 : 0;
  if ((c >= 0xe1 && c <= 0xec) || c == 0xee || c == 0xef) return cont(1) && cont(2) ? 3 : 0;
  if (c == 0xed) return cont(1, 0x80, 0x9f) && cont(2) ? 3 : 0;
  if (c == 0xf0) return cont(1, 0x90) && cont(2) && cont(3) ? 4 : 0;
  if (c >= 0xf1 && c <= 0xf3) return cont(1) && cont(2) && cont(3) ? 4 : 0;
  if (c == 0xf4) return cont(1, 0x80, 0x8f) && cont(2) && cont(3) ? 4 : 0;
  return 0;
}

/// True when `text` is well-formed UTF-8.
inline bool is_valid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence_length(text, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

/// `text` made safe to print on a terminal inside a label or message: at most
/// `max_bytes` bytes of whole characters ("..." appended when cut), and every
/// ill-formed byte, C0/C1 control character, DEL, line/paragraph separator
/// (U+2028/9) and bidirectional control (U+061C, U+200E/F, U+202A-E,
/// U+2066-9, which reorder what a terminal shows) is '?'.
inline std::string printable_text(std::string_view text, std::size_t max_bytes = 64) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t n = utf8_sequence_length(text, i);
    if (out.size() + std::max<std::size_t>(n, 1) > max_bytes) return out + "...";
    if (n == 0) {
      out += '?';
      ++i;
      continue;
    }
    const auto b = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
    const bool control = (n == 1 && (b(0) < 0x20 || b(0) == 0x7f)) || (n == 2 && b(0) == 0xc2 && b(1) < 0xa0);
    const bool bidi = (n == 2 && b(0) == 0xd8 && b(1) == 0x9c) ||  // U+061C ARABIC LETTER MARK
                      (n == 3 && b(0) == 0xe2 &&
                       ((b(1) == 0x80 && (b(2) == 0x8e || b(2) == 0x8f || (b(2) >= 0xa8 && b(2) <= 0xae))) ||
                        (b(1) == 0x81 && b(2) >= 0xa6 && b(2) <= 0xa9)));
    if (control || bidi)
      out += '?';
    else
      out.append(text.substr(i, n));
    i += n;
  }
  return out;
}

}  // namespace woq
