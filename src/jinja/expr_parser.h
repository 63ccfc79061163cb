// The expression parser: a tag's tokens to an Expr tree, by precedence
// climbing (conditional, or, and, not, comparisons, + -, ~, * / // %, **,
// unary -, filters and tests, postfix . [] (), primaries).
#pragma once

#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/expr.h"
#include "jinja/lexer.h"

namespace woq::jinja::impl {

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, int line) : t_(std::move(tokens)), line_(line) {}

  ExprPtr expression() { return conditional(); }
  /// An expression without a trailing "x if c else y" (a for tag's iterable,
  /// which may be followed by a loop filter "if cond").
  ExprPtr without_conditional() { return or_expr(); }
  const Token& peek(std::size_t ahead = 0) const { return t_[std::min(pos_ + ahead, t_.size() - 1)]; }
  bool at_end() const { return peek().type == Tok::kEnd; }
  bool accept_op(const char* op) {
    if (peek().type == Tok::kOp && peek().text == op) return ++pos_, true;
    return false;
  }
  bool accept_name(const char* name) {
    if (peek().type == Tok::kName && peek().text == name) return ++pos_, true;
    return false;
  }
  void expect_op(const char* op);
  std::string expect_name();
  void expect_end();

 private:
  // Nesting guard: deeply nested input ("((((...") must not exhaust the stack.
  struct Depth {
    ExprParser& p;
    explicit Depth(ExprParser& parser);
    ~Depth() { --p.depth_; }
  };

  // A new node of kind `k` at this tag's line.
  std::shared_ptr<Expr> make(ExprKind k);
  // A literal node of `v`.
  std::shared_ptr<Expr> literal(Value v);
  // `e`, complete, with its height: loops such as "a + b + c ..." build trees that
  // recursive evaluation (and destruction) must not find too deep.
  ExprPtr done(std::shared_ptr<Expr> e);
  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, ExprKind k = ExprKind::kBinary);
  [[noreturn]] void too_deep() const;

  ExprPtr conditional();
  ExprPtr or_expr();
  ExprPtr and_expr();
  ExprPtr not_expr();
  ExprPtr compare();
  // One left-associative level: operands from `next`, joined by any of `ops`.
  ExprPtr left_assoc(ExprPtr (ExprParser::*next)(), std::initializer_list<const char*> ops);
  ExprPtr math1() { return left_assoc(&ExprParser::concat, {"+", "-"}); }
  ExprPtr concat() { return left_assoc(&ExprParser::math2, {"~"}); }
  ExprPtr math2() { return left_assoc(&ExprParser::power, {"*", "/", "//", "%"}); }
  ExprPtr power() { return left_assoc(&ExprParser::unary, {"**"}); }
  ExprPtr unary();
  // The arguments of a call, filter or test after its "(", through the ")".
  void call_args(Expr& e);
  // `e` followed by any filters ("| f(args)") and tests ("is [not] t args").
  ExprPtr filters(ExprPtr e);
  // `e` followed by any attributes, subscripts and calls.
  ExprPtr postfix(ExprPtr e);
  // `e[...]` after its "[": an item or a slice.
  ExprPtr subscript(ExprPtr e);
  ExprPtr primary();
  // An integer or float literal token as a literal node.
  ExprPtr number(const Token& tok);
  // After "(": (), a parenthesized expression or a tuple.
  ExprPtr parenthesized();
  // After "[": a list display.
  ExprPtr list_display();
  // After "{": a dict display.
  ExprPtr dict_display();

  std::vector<Token> t_;
  std::size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

}  // namespace woq::jinja::impl
