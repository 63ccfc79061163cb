#include "jinja/text.h"

#include <algorithm>

namespace woq::jinja::impl {

std::size_t code_point_count(std::string_view s) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++i) n += starts_code_point(s, i);
  return n;
}

std::string reverse_code_points(const std::string& s) {
  std::string out(s.rbegin(), s.rend());
  auto continuation = [&](std::size_t i) { return (static_cast<unsigned char>(out[i]) & 0xC0) == 0x80; };
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!continuation(i)) continue;
    std::size_t j = i;  // the lead byte after the continuation bytes (or the end)
    while (j + 1 < out.size() && continuation(j)) ++j;
    std::reverse(out.begin() + static_cast<std::ptrdiff_t>(i), out.begin() + static_cast<std::ptrdiff_t>(j) + 1);
    i = j;
  }
  return out;
}

std::string slice_code_points(const std::string& s, std::int64_t start, std::int64_t stop, std::int64_t step) {
  std::string out;
  if (step == 1) {  // one substring
    std::size_t b = 0, from = 0;
    for (std::int64_t cp = 0; b < s.size() && cp < stop; ++cp) {
      if (cp == start) from = b;
      for (++b; b < s.size() && !starts_code_point(s, b);) ++b;
    }
    return start < stop ? s.substr(from, b - from) : out;
  }
  if (step > 0) {
    std::int64_t cp = 0;
    for (std::size_t b = 0; b < s.size() && cp < stop; ++cp) {
      std::size_t e = b + 1;
      while (e < s.size() && !starts_code_point(s, e)) ++e;
      if (cp >= start && (cp - start) % step == 0) out.append(s, b, e - b);
      b = e;
    }
  } else {
    auto cp = static_cast<std::int64_t>(code_point_count(s)) - 1;
    for (std::size_t e = s.size(); e > 0 && cp > stop; --cp) {
      std::size_t b = e - 1;
      while (!starts_code_point(s, b)) --b;
      if (cp <= start && (cp - start) % step == 0) out.append(s, b, e - b);
      e = b;
    }
  }
  return out;
}

std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
  std::size_t b = 0, e = s.size();
  if (left) b = s.find_first_not_of(chars);
  if (b == std::string::npos) return {};
  if (right) e = s.find_last_not_of(chars) + 1;
  return s.substr(b, e - b);
}

std::string change_case(std::string s, bool upper) {
  for (char& c : s)
    if (upper ? c >= 'a' && c <= 'z' : c >= 'A' && c <= 'Z') c = static_cast<char>(c ^ 0x20);
  return s;
}

std::string title_case(const std::string& s, bool only_first) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool lower = c >= 'a' && c <= 'z', upper = c >= 'A' && c <= 'Z';
    if (start ? lower : upper) c = static_cast<char>(c ^ 0x20);
    start = !only_first && !lower && !upper;
  }
  return out;
}

}  // namespace woq::jinja::impl
