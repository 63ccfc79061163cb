#include "jinja/parser.h"

#include <algorithm>

#include <fmt/format.h>

#include "jinja/budget.h"
#include "jinja/lexer.h"

namespace woq::jinja::impl {

NodePtr Parser::parse() {
  auto root = std::make_shared<Node>();
  std::string end;
  root->body = body({}, end);
  return root;
}

std::vector<NodePtr> Parser::body(const std::vector<std::string>& ends, std::string& end) {
  std::vector<NodePtr> nodes;
  while (pos_ < p_.size()) {
    const Piece& piece = p_[pos_++];
    if (piece.type == Piece::kText) {
      auto n = std::make_shared<Node>();
      n->kind = NodeKind::kText;
      n->line = piece.line;
      n->text = piece.text;
      nodes.push_back(n);
      continue;
    }
    ExprParser ep(lex(piece.text, piece.line), piece.line);
    if (piece.type == Piece::kExpr) {
      auto n = std::make_shared<Node>();
      n->kind = NodeKind::kOutput;
      n->line = piece.line;
      n->expr = ep.expression();
      ep.expect_end();
      nodes.push_back(n);
      continue;
    }
    if (ep.at_end()) error(piece.line, "an empty {% %} tag");
    const std::string word = ep.expect_name();
    if (std::find(ends.begin(), ends.end(), word) != ends.end()) {
      end = word;
      last_ = std::make_unique<ExprParser>(std::move(ep));
      return nodes;
    }
    nodes.push_back(statement(word, ep, piece.line));
  }
  if (!ends.empty()) error(p_.empty() ? 1 : p_.back().line, fmt::format("missing {{% {} %}}", ends.back()));
  return nodes;
}

NodePtr Parser::statement(const std::string& word, ExprParser& ep, int line) {
  if (depth_ >= kMaxTemplateDepth)
    error(line, fmt::format("'{}': blocks are nested deeper than {} levels", word, kMaxTemplateDepth));
  struct Guard {
    int& d;
    ~Guard() { --d; }
  } guard{++depth_};
  auto n = std::make_shared<Node>();
  n->line = line;
  if (word == "if") {
    if_tag(*n, ep);
  } else if (word == "for") {
    for_tag(*n, ep);
  } else if (word == "set") {
    set_tag(*n, ep);
  } else if (word == "break" || word == "continue") {
    ep.expect_end();
    n->kind = word == "break" ? NodeKind::kBreak : NodeKind::kContinue;
  } else if (word == "generation") {  // transformers' assistant-mask marker: renders its body
    ep.expect_end();
    n->kind = NodeKind::kBody;
    std::string end;
    n->body = body({"endgeneration"}, end);
    last_->expect_end();
  } else {
    error(line, fmt::format("unsupported tag '{}'", word));
  }
  return n;
}

void Parser::if_tag(Node& n, ExprParser& ep) {
  n.kind = NodeKind::kIf;
  ExprPtr cond = ep.expression();
  ep.expect_end();
  std::string end;
  for (;;) {
    auto nodes = body({"elif", "else", "endif"}, end);
    n.branches.emplace_back(cond, std::move(nodes));
    if (end == "elif") {
      cond = last_->expression();
      last_->expect_end();
      continue;
    }
    last_->expect_end();
    if (end == "else") {
      n.branches.emplace_back(nullptr, body({"endif"}, end));
      last_->expect_end();
    }
    break;
  }
}

void Parser::for_tag(Node& n, ExprParser& ep) {
  n.kind = NodeKind::kFor;
  do n.targets.push_back(ep.expect_name());
  while (ep.accept_op(","));
  if (!ep.accept_name("in")) error(n.line, "expected 'in' in a for tag");
  n.expr = ep.without_conditional();
  if (ep.accept_name("if")) n.filter = ep.expression();
  if (ep.accept_name("recursive")) error(n.line, "recursive loops are not supported");
  ep.expect_end();
  std::string end;
  n.body = body({"else", "endfor"}, end);
  last_->expect_end();
  if (end == "else") {
    n.else_body = body({"endfor"}, end);
    last_->expect_end();
  }
}

void Parser::set_tag(Node& n, ExprParser& ep) {
  n.targets.push_back(ep.expect_name());
  if (ep.accept_op(".")) n.targets.push_back(ep.expect_name());
  if (ep.accept_op("=")) {
    n.kind = NodeKind::kSet;
    n.expr = ep.expression();
    ep.expect_end();
  } else {
    ep.expect_end();
    n.kind = NodeKind::kSetBlock;
    std::string end;
    n.body = body({"endset"}, end);
    last_->expect_end();
  }
}

}  // namespace woq::jinja::impl
