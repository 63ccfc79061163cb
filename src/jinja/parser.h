// The statement parser: a template's pieces to a tree of nodes, the
// expressions in them parsed by ExprParser.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "jinja/expr_parser.h"
#include "jinja/node.h"
#include "jinja/pieces.h"

namespace woq::jinja::impl {

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  /// The template: a kBody node. Throws TemplateError for syntax errors and unsupported tags.
  NodePtr parse();

 private:
  // Parses nodes until a statement whose first word is in `ends` (returned
  // in `end`, with the rest of that tag left in last_).
  std::vector<NodePtr> body(const std::vector<std::string>& ends, std::string& end);
  // The {% word ... %} tag at `line` (`ep` after its word) and the blocks it opens.
  NodePtr statement(const std::string& word, ExprParser& ep, int line);
  // The rest of an if tag, its elif and else branches, through endif.
  void if_tag(Node& n, ExprParser& ep);
  // The rest of a for tag, its body and else branch, through endfor.
  void for_tag(Node& n, ExprParser& ep);
  // The rest of a set tag: "name = expr", "ns.attr = expr", or a block through endset.
  void set_tag(Node& n, ExprParser& ep);

  std::vector<Piece> p_;
  std::size_t pos_ = 0;
  std::unique_ptr<ExprParser> last_;
  int depth_ = 0;  // blocks open
};

}  // namespace woq::jinja::impl
