// The tokens of the code inside one {{ }} or {% %} tag.
#pragma once

#include <string>
#include <vector>

namespace woq::jinja::impl {

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type;
  std::string text;
};

/// The tokens of `code` (a tag's, at `line`), ending with a kEnd token. Throws
/// TemplateError for an unclosed string literal or an unexpected character.
std::vector<Token> lex(const std::string& code, int line);

}  // namespace woq::jinja::impl
