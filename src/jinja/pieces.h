// A template's source split into text and tags, with Jinja2's whitespace rules applied.
#pragma once

#include <string>
#include <vector>

namespace woq::jinja::impl {

struct Piece {
  enum Type { kText, kExpr, kStmt } type;
  std::string text;  // kText: the text; kExpr, kStmt: the code between the delimiters
  int line;
};

/// Splits the source into text, {{ }} and {% %} pieces, dropping comments and
/// applying whitespace control, trim_blocks and lstrip_blocks.
std::vector<Piece> split_pieces(const std::string& src);

}  // namespace woq::jinja::impl
