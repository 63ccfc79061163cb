#include "jinja/expr_parser.h"

#include <charconv>
#include <cstdint>
#include <system_error>

#include <fmt/format.h>

#include "jinja/budget.h"

namespace woq::jinja::impl {

void ExprParser::expect_op(const char* op) {
  if (!accept_op(op)) error(line_, fmt::format("expected '{}', found '{}'", op, peek().text));
}

std::string ExprParser::expect_name() {
  if (peek().type != Tok::kName) error(line_, fmt::format("expected a name, found '{}'", peek().text));
  return t_[pos_++].text;
}

void ExprParser::expect_end() {
  if (!at_end()) error(line_, fmt::format("unexpected '{}'", peek().text));
}

ExprParser::Depth::Depth(ExprParser& parser) : p(parser) {
  if (++p.depth_ > kMaxTemplateDepth) p.too_deep();
}

std::shared_ptr<Expr> ExprParser::make(ExprKind k) {
  auto e = std::make_shared<Expr>();
  e->kind = k;
  e->line = line_;
  return e;
}

std::shared_ptr<Expr> ExprParser::literal(Value v) {
  auto e = make(ExprKind::kLiteral);
  e->literal = std::move(v);
  return e;
}

ExprPtr ExprParser::done(std::shared_ptr<Expr> e) {
  int h = 0;
  for (const ExprPtr* x : {&e->a, &e->b, &e->c})
    if (*x) h = std::max(h, (*x)->height);
  for (const ExprPtr& x : e->args)
    if (x) h = std::max(h, x->height);
  for (const auto& [k, x] : e->kwargs) h = std::max(h, x->height);
  e->height = h + 1;
  if (e->height > kMaxTemplateDepth) too_deep();
  return e;
}

ExprPtr ExprParser::binary(const std::string& op, ExprPtr l, ExprPtr r, ExprKind k) {
  auto e = make(k);
  e->name = op;
  e->a = std::move(l);
  e->b = std::move(r);
  return done(std::move(e));
}

void ExprParser::too_deep() const {
  error(line_, fmt::format("the expression is nested deeper than {} levels", kMaxTemplateDepth));
}

ExprPtr ExprParser::conditional() {
  const Depth guard(*this);
  ExprPtr e = or_expr();
  while (accept_name("if")) {
    auto c = make(ExprKind::kCond);
    c->b = or_expr();  // condition
    c->a = e;          // value when true
    if (accept_name("else")) c->c = conditional();
    e = done(std::move(c));
  }
  return e;
}

ExprPtr ExprParser::or_expr() {
  ExprPtr e = and_expr();
  while (accept_name("or")) e = binary("or", e, and_expr(), ExprKind::kOr);
  return e;
}

ExprPtr ExprParser::and_expr() {
  ExprPtr e = not_expr();
  while (accept_name("and")) e = binary("and", e, not_expr(), ExprKind::kAnd);
  return e;
}

ExprPtr ExprParser::not_expr() {
  const Depth guard(*this);
  if (peek().type == Tok::kName && peek().text == "not" && !(peek(1).type == Tok::kName && peek(1).text == "in")) {
    ++pos_;
    auto e = make(ExprKind::kNot);
    e->a = not_expr();
    return done(std::move(e));
  }
  return compare();
}

ExprPtr ExprParser::compare() {
  ExprPtr e = math1();
  for (;;) {
    if (peek().type == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                    peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
      const std::string op = t_[pos_++].text;
      e = binary(op, e, math1());
    } else if (accept_name("in")) {
      e = binary("in", e, math1());
    } else if (peek().type == Tok::kName && peek().text == "not" && peek(1).type == Tok::kName &&
               peek(1).text == "in") {
      pos_ += 2;
      e = binary("not in", e, math1());
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::left_assoc(ExprPtr (ExprParser::*next)(), std::initializer_list<const char*> ops) {
  ExprPtr e = (this->*next)();
  for (;;) {
    const char* op = nullptr;
    for (const char* o : ops)
      if (peek().type == Tok::kOp && peek().text == o) op = o;
    if (op == nullptr) return e;
    ++pos_;
    e = binary(op, e, (this->*next)());
  }
}

ExprPtr ExprParser::unary() {
  const Depth guard(*this);
  if (accept_op("-")) {
    auto e = make(ExprKind::kNeg);
    e->a = unary();
    return filters(done(std::move(e)));
  }
  if (accept_op("+")) return unary();
  return filters(postfix(primary()));
}

void ExprParser::call_args(Expr& e) {
  if (accept_op(")")) return;
  do {
    if (peek().type == Tok::kName && peek(1).type == Tok::kOp && peek(1).text == "=") {
      const std::string key = t_[pos_].text;
      pos_ += 2;
      e.kwargs.emplace_back(key, expression());
    } else {
      e.args.push_back(expression());
    }
  } while (accept_op(","));
  expect_op(")");
}

ExprPtr ExprParser::filters(ExprPtr e) {
  for (;;) {
    if (accept_op("|")) {
      auto f = make(ExprKind::kFilter);
      f->name = expect_name();
      f->a = e;
      if (accept_op("(")) call_args(*f);
      e = done(std::move(f));
    } else if (accept_name("is")) {
      auto t = make(ExprKind::kTest);
      t->negated = accept_name("not");
      t->name = expect_name();
      t->a = e;
      if (accept_op("(")) {
        call_args(*t);
      } else if (peek().type == Tok::kString || peek().type == Tok::kInt || peek().type == Tok::kFloat ||
                 (peek().type == Tok::kName && peek().text != "and" && peek().text != "or" && peek().text != "else" &&
                  peek().text != "if" && peek().text != "in" && peek().text != "not" && peek().text != "is")) {
        t->args.push_back(postfix(primary()));  // "is divisibleby 3", "is equalto 'x'"
      }
      e = done(std::move(t));
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::postfix(ExprPtr e) {
  for (;;) {
    if (accept_op(".")) {
      auto a = make(ExprKind::kAttr);
      if (peek().type == Tok::kInt) a->name = t_[pos_++].text;
      else a->name = expect_name();
      a->a = e;
      e = done(std::move(a));
    } else if (accept_op("[")) {
      e = subscript(e);
    } else if (accept_op("(")) {
      auto call = make(ExprKind::kCall);
      call->a = e;
      call_args(*call);
      e = done(std::move(call));
    } else {
      return e;
    }
  }
}

ExprPtr ExprParser::subscript(ExprPtr e) {
  ExprPtr start, stop, step;
  bool slice = false;
  if (!(peek().type == Tok::kOp && peek().text == ":")) start = expression();
  if (accept_op(":")) {
    slice = true;
    if (!(peek().type == Tok::kOp && (peek().text == "]" || peek().text == ":"))) stop = expression();
    if (accept_op(":") && !(peek().type == Tok::kOp && peek().text == "]")) step = expression();
  }
  expect_op("]");
  auto x = make(slice ? ExprKind::kSlice : ExprKind::kItem);
  x->a = e;
  x->b = start;
  if (slice) {
    x->c = stop;
    x->args.push_back(step);
  }
  return done(std::move(x));
}

ExprPtr ExprParser::primary() {
  const Token tok = peek();
  ++pos_;
  switch (tok.type) {
    case Tok::kString: {
      std::string s = tok.text;
      while (peek().type == Tok::kString) s += t_[pos_++].text;  // adjacent literals concatenate
      return literal(Value::string(s));
    }
    case Tok::kInt:
    case Tok::kFloat: return number(tok);
    case Tok::kName:
      if (tok.text == "true" || tok.text == "True") return literal(Value::boolean(true));
      if (tok.text == "false" || tok.text == "False") return literal(Value::boolean(false));
      if (tok.text == "none" || tok.text == "None") return literal(Value::none());
      {
        auto e = make(ExprKind::kName);
        e->name = tok.text;
        return e;
      }
    case Tok::kOp:
      if (tok.text == "(") return parenthesized();
      if (tok.text == "[") return list_display();
      if (tok.text == "{") return dict_display();
      break;
    case Tok::kEnd: error(line_, "unexpected end of expression");
  }
  error(line_, fmt::format("unexpected '{}'", tok.text));
}

ExprPtr ExprParser::number(const Token& tok) {
  const char* begin = tok.text.data();
  const char* end = begin + tok.text.size();
  if (tok.type == Tok::kInt) {
    std::int64_t v = 0;
    const auto [stop, ec] = std::from_chars(begin, end, v);
    if (ec != std::errc() || stop != end)
      error(line_, fmt::format("the integer literal {} is out of the 64-bit range", tok.text));
    return literal(Value::integer(v));
  }
  double v = 0;
  const auto [stop, ec] = std::from_chars(begin, end, v);
  if (ec != std::errc() || stop != end) error(line_, fmt::format("the float literal {} is out of range", tok.text));
  return literal(Value::number(v));
}

ExprPtr ExprParser::parenthesized() {
  if (accept_op(")")) return literal(Value::of_list({}));
  ExprPtr first = expression();
  if (accept_op(")")) return first;
  auto tuple = make(ExprKind::kList);
  tuple->args.push_back(first);
  while (accept_op(",")) {
    if (peek().type == Tok::kOp && peek().text == ")") break;
    tuple->args.push_back(expression());
  }
  expect_op(")");
  return done(std::move(tuple));
}

ExprPtr ExprParser::list_display() {
  auto list = make(ExprKind::kList);
  if (!accept_op("]")) {
    do {
      if (peek().type == Tok::kOp && peek().text == "]") break;
      list->args.push_back(expression());
    } while (accept_op(","));
    expect_op("]");
  }
  return done(std::move(list));
}

ExprPtr ExprParser::dict_display() {
  auto dict = make(ExprKind::kDict);
  if (!accept_op("}")) {
    do {
      if (peek().type == Tok::kOp && peek().text == "}") break;
      ExprPtr key = expression();
      expect_op(":");
      dict->args.push_back(key);
      dict->args.push_back(expression());
    } while (accept_op(","));
    expect_op("}");
  }
  return done(std::move(dict));
}

}  // namespace woq::jinja::impl
