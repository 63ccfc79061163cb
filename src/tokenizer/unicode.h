// UTF-8 and Unicode helpers for the tokenizers: validation, code point
// iteration, character classes and normalization forms (through utf8proc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/utf8.h"

namespace woq::unicode {

/// `text` with every ill-formed UTF-8 sequence replaced by U+FFFD (one per
/// maximal invalid subpart, as Python's errors="replace" and Rust's
/// from_utf8_lossy do). Valid input is returned unchanged.
std::string to_valid_utf8(std::string_view text);

/// True when `text` is well-formed UTF-8.
using woq::is_valid_utf8;

/// Byte length of the UTF-8 sequence led by `lead` (1 for a stray byte).
using woq::utf8_lead_length;

/// Length of the longest prefix of `s` that does not end inside a UTF-8
/// sequence (a streamed text can be printed up to there).
std::size_t complete_prefix(std::string_view s);

/// The code point starting at s[i] of valid UTF-8 `s`; advances i past it.
char32_t next_code_point(std::string_view s, std::size_t& i);

/// UTF-8 encoding of `cp`.
std::string encode(char32_t cp);

/// Unicode White_Space (what regex \s matches with Unicode semantics).
bool is_whitespace(char32_t cp);
/// General category N* (Rust's char::is_numeric).
bool is_numeric(char32_t cp);
/// Letters, marks, decimal digits, connector punctuation and joiners: regex \w.
bool is_word(char32_t cp);

/// Unicode normalization forms (UAX #15) of valid UTF-8 text.
enum class Form { kNfc, kNfd, kNfkc, kNfkd };
std::string normalize(std::string_view text, Form form);
/// Simple lowercase mapping of every code point.
std::string lowercase(std::string_view text);

}  // namespace woq::unicode
