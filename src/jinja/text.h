// Python's str operations on UTF-8 strings: indexing by code point (as Python
// does) without building an index, stripping, and ASCII case changes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace woq::jinja::impl {

/// The characters Python's str.strip() and str.split() take for whitespace.
constexpr const char* kWhitespace = " \t\n\r\v\f";

/// Whether byte `i` of a UTF-8 string starts a code point (Python indexes strings by code point).
inline bool starts_code_point(std::string_view s, std::size_t i) {
  return i == 0 || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80;
}

std::size_t code_point_count(std::string_view s);

/// The code points of `s` in reverse order: its bytes reversed, then each code point's put back in order.
std::string reverse_code_points(const std::string& s);

/// Python's s[start:stop:step] by code point, `start` and `stop` clamped as for a
/// list of code_point_count(s) elements; no index is built (s may be long).
std::string slice_code_points(const std::string& s, std::int64_t start, std::int64_t stop, std::int64_t step);

/// s.strip(chars), or lstrip (`left` only) or rstrip (`right` only).
std::string strip(const std::string& s, const std::string& chars, bool left, bool right);

/// s.upper() or s.lower() for ASCII letters (as std::toupper in the "C" locale; UTF-8 stays intact).
std::string change_case(std::string s, bool upper);

/// s.title(), or s.capitalize() if `only_first` (ASCII letters, like change_case).
std::string title_case(const std::string& s, bool only_first);

}  // namespace woq::jinja::impl
