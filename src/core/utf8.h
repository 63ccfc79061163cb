// UTF-8 well-formedness (Unicode 15, Table 3-7), for validating strings read
// from files before they reach messages, JSON or tokenizers.
#pragma once

#include <cstddef>
#include <string_view>

namespace woq {

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

}  // namespace woq
