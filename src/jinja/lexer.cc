#include "jinja/lexer.h"

#include <cctype>
#include <cstddef>

#include <fmt/format.h>

#include "jinja/budget.h"

namespace woq::jinja::impl {

namespace {

bool is_digit(char c) { return std::isdigit(static_cast<unsigned char>(c)); }

// The name at `i` ([A-Za-z_][A-Za-z0-9_]*), appended to `out`; returns the position after it.
std::size_t lex_name(const std::string& code, std::size_t i, std::vector<Token>& out) {
  std::size_t j = i;
  while (j < code.size() && (std::isalnum(static_cast<unsigned char>(code[j])) || code[j] == '_')) ++j;
  out.push_back({Tok::kName, code.substr(i, j - i)});
  return j;
}

// The integer or float literal at `i` (digits, '_' separators, a fraction, an exponent).
std::size_t lex_number(const std::string& code, std::size_t i, std::vector<Token>& out) {
  std::size_t j = i;
  bool is_float = false;
  while (j < code.size() && (is_digit(code[j]) || code[j] == '_')) ++j;
  if (j + 1 < code.size() && code[j] == '.' && is_digit(code[j + 1])) {
    is_float = true;
    ++j;
    while (j < code.size() && is_digit(code[j])) ++j;
  }
  if (j < code.size() && (code[j] == 'e' || code[j] == 'E')) {
    std::size_t k = j + 1;
    if (k < code.size() && (code[k] == '+' || code[k] == '-')) ++k;
    if (k < code.size() && is_digit(code[k])) {
      is_float = true;
      j = k;
      while (j < code.size() && is_digit(code[j])) ++j;
    }
  }
  std::string text = code.substr(i, j - i);
  std::erase(text, '_');
  out.push_back({is_float ? Tok::kFloat : Tok::kInt, text});
  return j;
}

// The string literal at `i` (quoted by code[i]), its escapes resolved.
std::size_t lex_string(const std::string& code, std::size_t i, int line, std::vector<Token>& out) {
  const char quote = code[i];
  std::string s;
  std::size_t j = i + 1;
  for (;; ++j) {
    if (j >= code.size()) error(line, "a string literal is not closed");
    if (code[j] == quote) break;
    if (code[j] == '\\' && j + 1 < code.size()) {
      const char e = code[++j];
      switch (e) {
        case 'n': s += '\n'; break;
        case 't': s += '\t'; break;
        case 'r': s += '\r'; break;
        case '\\': s += '\\'; break;
        case '\'': s += '\''; break;
        case '"': s += '"'; break;
        case '\n': break;
        default: s += '\\', s += e;
      }
    } else {
      s += code[j];
    }
  }
  out.push_back({Tok::kString, s});
  return j + 1;
}

// The operator at `i`, the longest that matches.
std::size_t lex_operator(const std::string& code, std::size_t i, int line, std::vector<Token>& out) {
  static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<",
                                     ">",  "=",  "(",  ")",  "[",  "]",  "{", "}", ",", ".", ":", "|"};
  for (const char* op : kOps) {
    const std::size_t n = std::char_traits<char>::length(op);
    if (code.compare(i, n, op) == 0) {
      out.push_back({Tok::kOp, op});
      return i + n;
    }
  }
  error(line, fmt::format("unexpected character '{}'", code[i]));
}

}  // namespace

std::vector<Token> lex(const std::string& code, int line) {
  std::vector<Token> out;
  std::size_t i = 0;
  while (i < code.size()) {
    const char c = code[i];
    if (std::isspace(static_cast<unsigned char>(c))) ++i;
    else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') i = lex_name(code, i, out);
    else if (is_digit(c)) i = lex_number(code, i, out);
    else if (c == '\'' || c == '"') i = lex_string(code, i, line, out);
    else i = lex_operator(code, i, line, out);
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

}  // namespace woq::jinja::impl
