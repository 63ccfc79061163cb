#include "generate/jinja.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <unordered_map>
#include <variant>
#include <vector>

#include <fmt/format.h>

namespace woq::jinja {

namespace impl {

[[noreturn]] void error(int line, const std::string& what) {
  throw TemplateError(fmt::format("chat template line {}: {}", line, what));
}

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, like Python's dict

enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace };

struct Value {
  Value() = default;
  explicit Value(Kind k) : kind(k) {}

  Kind kind = Kind::kUndefined;
  bool b = false;
  std::int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<List> list;  // kList (never mutated after construction)
  std::shared_ptr<Dict> dict;  // kDict, kNamespace (a namespace's is mutated by set)

  static Value none() { return Value{Kind::kNone}; }
  static Value boolean(bool v) {
    Value x{Kind::kBool};
    x.b = v;
    return x;
  }
  static Value integer(std::int64_t v) {
    Value x{Kind::kInt};
    x.i = v;
    return x;
  }
  static Value number(double v) {
    Value x{Kind::kFloat};
    x.f = v;
    return x;
  }
  static Value string(std::string v) {
    Value x{Kind::kString};
    x.s = std::move(v);
    return x;
  }
  static Value of_list(List v) {
    Value x{Kind::kList};
    x.list = std::make_shared<List>(std::move(v));
    return x;
  }
  static Value of_dict(Dict v, Kind kind = Kind::kDict) {
    Value x{kind};
    x.dict = std::make_shared<Dict>(std::move(v));
    return x;
  }
  bool undefined() const { return kind == Kind::kUndefined; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat || kind == Kind::kBool; }
  double as_double() const { return kind == Kind::kFloat ? f : kind == Kind::kBool ? (b ? 1.0 : 0.0) : static_cast<double>(i); }
  const Value* find(const std::string& key) const {
    if (!dict) return nullptr;
    for (const auto& [k, v] : *dict)
      if (k == key) return &v;
    return nullptr;
  }
};

const char* kind_name(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
  }
  return "?";
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value::integer(static_cast<std::int64_t>(j.get<std::uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e));
      return Value::of_list(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.emplace_back(k, from_json(v));
      return Value::of_dict(std::move(d));
    }
    default: return Value{};
  }
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return v.b;
    case Kind::kInt: return v.i != 0;
    case Kind::kFloat: return v.f != 0;
    case Kind::kString: return !v.s.empty();
    case Kind::kList: return !v.list->empty();
    case Kind::kDict: return !v.dict->empty();
    case Kind::kNamespace: return true;
  }
  return false;
}

// Python's repr() of a float: the shortest round trip, with ".0" on integers.
std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

std::string python_repr_string(const std::string& s) {
  const char q = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
  std::string out(1, q);
  for (const char c : s) {
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
    else out += c;
  }
  return out + q;
}

std::string repr(const Value& v);

// str(): what {{ }} prints.
std::string str(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kString: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kNone: return "None";
    case Kind::kBool: return v.b ? "True" : "False";
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kFloat: return float_repr(v.f);
    case Kind::kString: return python_repr_string(v.s);
    case Kind::kList: {
      std::string out = "[";
      for (std::size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + repr((*v.list)[i]);
      return out + "]";
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = v.kind == Kind::kNamespace ? "<Namespace {" : "{";
      for (std::size_t i = 0; i < v.dict->size(); ++i)
        out += (i ? ", " : "") + python_repr_string((*v.dict)[i].first) + ": " + repr((*v.dict)[i].second);
      return out + (v.kind == Kind::kNamespace ? "}>" : "}");
    }
  }
  return "";
}

// json.dumps(v, ensure_ascii=False, indent=indent) with Python's separators.
void to_json(const Value& v, int indent, int depth, std::string& out, int line) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<std::size_t>(indent * d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Kind::kUndefined: error(line, "tojson: the value is undefined");
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.b ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.i); return;
    case Kind::kFloat: out += std::isfinite(v.f) ? float_repr(v.f) : std::isnan(v.f) ? "NaN" : v.f > 0 ? "Infinity" : "-Infinity"; return;
    case Kind::kString: {
      out += '"';
      for (const char c : v.s) {
        switch (c) {
          case '"': out += "\\\""; break;
          case '\\': out += "\\\\"; break;
          case '\n': out += "\\n"; break;
          case '\r': out += "\\r"; break;
          case '\t': out += "\\t"; break;
          case '\b': out += "\\b"; break;
          case '\f': out += "\\f"; break;
          default:
            if (static_cast<unsigned char>(c) < 0x20) out += fmt::format("\\u{:04x}", static_cast<unsigned char>(c));
            else out += c;
        }
      }
      out += '"';
      return;
    }
    case Kind::kList:
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        to_json((*v.list)[i], indent, depth + 1, out, line);
      }
      newline(depth);
      out += ']';
      return;
    case Kind::kDict:
    case Kind::kNamespace:
      if (v.dict->empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (std::size_t i = 0; i < v.dict->size(); ++i) {
        if (i) out += item_sep;
        newline(depth + 1);
        to_json(Value::string((*v.dict)[i].first), indent, depth + 1, out, line);
        out += ": ";
        to_json((*v.dict)[i].second, indent, depth + 1, out, line);
      }
      newline(depth);
      out += '}';
      return;
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::kFloat || b.kind == Kind::kFloat) return a.as_double() == b.as_double();
    return (a.kind == Kind::kBool ? a.b : a.i) == (b.kind == Kind::kBool ? b.b : b.i);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kUndefined:
    case Kind::kNone: return true;
    case Kind::kString: return a.s == b.s;
    case Kind::kList:
      return a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(), [](const Value& x, const Value& y) { return equal(x, y); });
    case Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        const Value* o = b.find(k);
        if (o == nullptr || !equal(v, *o)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    default: return false;
  }
}

// Byte offsets of the code points of a UTF-8 string (Python indexes strings by code point).
std::vector<std::size_t> code_points(const std::string& s) {
  std::vector<std::size_t> at;
  for (std::size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) at.push_back(i);
  return at;
}

constexpr const char* kWhitespace = " \t\n\r\v\f";

std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
  std::size_t b = 0, e = s.size();
  if (left) b = s.find_first_not_of(chars);
  if (b == std::string::npos) return {};
  if (right) e = s.find_last_not_of(chars) + 1;
  return s.substr(b, e - b);
}

std::string title_case(const std::string& s, bool only_first) {
  std::string out = s;
  bool start = true;
  for (char& c : out) {
    const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
    if (alpha) c = static_cast<char>(start ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
    if (only_first) {
      if (start && alpha) start = false;
      else if (!start) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      start = false;
    } else {
      start = !alpha;
    }
  }
  return out;
}

// ---------------------------------------------------------------- lexer

enum class Tok { kName, kString, kInt, kFloat, kOp, kEnd };

struct Token {
  Tok type;
  std::string text;
};

std::vector<Token> lex(const std::string& code, int line) {
  std::vector<Token> out;
  std::size_t i = 0;
  while (i < code.size()) {
    const char c = code[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      std::size_t j = i;
      while (j < code.size() && (std::isalnum(static_cast<unsigned char>(code[j])) || code[j] == '_')) ++j;
      out.push_back({Tok::kName, code.substr(i, j - i)});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      std::size_t j = i;
      bool is_float = false;
      while (j < code.size() && (std::isdigit(static_cast<unsigned char>(code[j])) || code[j] == '_')) ++j;
      if (j + 1 < code.size() && code[j] == '.' && std::isdigit(static_cast<unsigned char>(code[j + 1]))) {
        is_float = true;
        ++j;
        while (j < code.size() && std::isdigit(static_cast<unsigned char>(code[j]))) ++j;
      }
      if (j < code.size() && (code[j] == 'e' || code[j] == 'E')) {
        std::size_t k = j + 1;
        if (k < code.size() && (code[k] == '+' || code[k] == '-')) ++k;
        if (k < code.size() && std::isdigit(static_cast<unsigned char>(code[k]))) {
          is_float = true;
          j = k;
          while (j < code.size() && std::isdigit(static_cast<unsigned char>(code[j]))) ++j;
        }
      }
      std::string text = code.substr(i, j - i);
      std::erase(text, '_');
      out.push_back({is_float ? Tok::kFloat : Tok::kInt, text});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string s;
      std::size_t j = i + 1;
      for (;; ++j) {
        if (j >= code.size()) error(line, "a string literal is not closed");
        if (code[j] == c) break;
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
      i = j + 1;
    } else {
      static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~", "<", ">",
                                         "=",  "(",  ")",  "[",  "]",  "{",  "}", ",", ".", ":", "|"};
      bool found = false;
      for (const char* op : kOps) {
        const std::size_t n = std::char_traits<char>::length(op);
        if (code.compare(i, n, op) == 0) {
          out.push_back({Tok::kOp, op});
          i += n;
          found = true;
          break;
        }
      }
      if (!found) error(line, fmt::format("unexpected character '{}'", c));
    }
  }
  out.push_back({Tok::kEnd, ""});
  return out;
}

// ---------------------------------------------------------------- expressions

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

enum class ExprKind { kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNeg, kNot, kBinary, kAnd, kOr, kCond, kList, kDict };

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;  // kName, kAttr, kFilter, kTest, kBinary (operator)
  ExprPtr a, b, c;   // operands (kSlice: object a, start b, stop c, step d in args[0])
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // kTest: "is not"
};

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
  void expect_op(const char* op) {
    if (!accept_op(op)) error(line_, fmt::format("expected '{}', found '{}'", op, peek().text));
  }
  std::string expect_name() {
    if (peek().type != Tok::kName) error(line_, fmt::format("expected a name, found '{}'", peek().text));
    return t_[pos_++].text;
  }
  void expect_end() {
    if (!at_end()) error(line_, fmt::format("unexpected '{}'", peek().text));
  }

 private:
  // A new node of kind `k` at this tag's line.
  std::shared_ptr<Expr> make(ExprKind k) {
    auto e = std::make_shared<Expr>();
    e->kind = k;
    e->line = line_;
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, ExprKind k = ExprKind::kBinary) {
    auto e = make(k);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return e;
  }

  // Nesting guard: deeply nested input must not exhaust the stack.
  struct Depth {
    ExprParser& p;
    explicit Depth(ExprParser& parser) : p(parser) {
      if (++p.depth_ > 100) error(p.line_, "expression nested too deeply");
    }
    ~Depth() { --p.depth_; }
  };

  ExprPtr conditional() {
    const Depth guard(*this);
    ExprPtr e = or_expr();
    while (accept_name("if")) {
      auto c = make(ExprKind::kCond);
      c->b = or_expr();  // condition
      c->a = e;          // value when true
      if (accept_name("else")) c->c = conditional();
      e = c;
    }
    return e;
  }
  ExprPtr or_expr() {
    ExprPtr e = and_expr();
    while (accept_name("or")) e = binary("or", e, and_expr(), ExprKind::kOr);
    return e;
  }
  ExprPtr and_expr() {
    ExprPtr e = not_expr();
    while (accept_name("and")) e = binary("and", e, not_expr(), ExprKind::kAnd);
    return e;
  }
  ExprPtr not_expr() {
    const Depth guard(*this);
    if (peek().type == Tok::kName && peek().text == "not" && !(peek(1).type == Tok::kName && peek(1).text == "in")) {
      ++pos_;
      auto e = make(ExprKind::kNot);
      e->a = not_expr();
      return e;
    }
    return compare();
  }
  ExprPtr compare() {
    ExprPtr e = math1();
    for (;;) {
      if (peek().type == Tok::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                      peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        const std::string op = t_[pos_++].text;
        e = binary(op, e, math1());
      } else if (accept_name("in")) {
        e = binary("in", e, math1());
      } else if (peek().type == Tok::kName && peek().text == "not" && peek(1).type == Tok::kName && peek(1).text == "in") {
        pos_ += 2;
        e = binary("not in", e, math1());
      } else {
        return e;
      }
    }
  }
  // One left-associative level: operands from `next`, joined by any of `ops`.
  ExprPtr left_assoc(ExprPtr (ExprParser::*next)(), std::initializer_list<const char*> ops) {
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
  ExprPtr math1() { return left_assoc(&ExprParser::concat, {"+", "-"}); }
  ExprPtr concat() { return left_assoc(&ExprParser::math2, {"~"}); }
  ExprPtr math2() { return left_assoc(&ExprParser::power, {"*", "/", "//", "%"}); }
  ExprPtr power() { return left_assoc(&ExprParser::unary, {"**"}); }
  ExprPtr unary() {
    const Depth guard(*this);
    if (accept_op("-")) {
      auto e = make(ExprKind::kNeg);
      e->a = unary();
      return filters(e);
    }
    if (accept_op("+")) return unary();
    return filters(postfix(primary()));
  }
  void call_args(Expr& e) {
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
  ExprPtr filters(ExprPtr e) {
    for (;;) {
      if (accept_op("|")) {
        auto f = make(ExprKind::kFilter);
        f->name = expect_name();
        f->a = e;
        if (accept_op("(")) call_args(*f);
        e = f;
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
        e = t;
      } else {
        return e;
      }
    }
  }
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (accept_op(".")) {
        auto a = make(ExprKind::kAttr);
        if (peek().type == Tok::kInt) a->name = t_[pos_++].text;
        else a->name = expect_name();
        a->a = e;
        e = a;
      } else if (accept_op("[")) {
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
        e = x;
      } else if (accept_op("(")) {
        auto call = make(ExprKind::kCall);
        call->a = e;
        call_args(*call);
        e = call;
      } else {
        return e;
      }
    }
  }
  ExprPtr primary() {
    const Token tok = peek();
    ++pos_;
    auto lit = [&](Value v) {
      auto e = make(ExprKind::kLiteral);
      e->literal = std::move(v);
      return e;
    };
    switch (tok.type) {
      case Tok::kString: {
        std::string s = tok.text;
        while (peek().type == Tok::kString) s += t_[pos_++].text;  // adjacent literals concatenate
        return lit(Value::string(s));
      }
      case Tok::kInt: return lit(Value::integer(std::stoll(tok.text)));
      case Tok::kFloat: return lit(Value::number(std::stod(tok.text)));
      case Tok::kName:
        if (tok.text == "true" || tok.text == "True") return lit(Value::boolean(true));
        if (tok.text == "false" || tok.text == "False") return lit(Value::boolean(false));
        if (tok.text == "none" || tok.text == "None") return lit(Value::none());
        {
          auto e = make(ExprKind::kName);
          e->name = tok.text;
          return e;
        }
      case Tok::kOp:
        if (tok.text == "(") {
          if (accept_op(")")) return lit(Value::of_list({}));
          ExprPtr first = expression();
          if (accept_op(")")) return first;
          auto tuple = make(ExprKind::kList);
          tuple->args.push_back(first);
          while (accept_op(",")) {
            if (peek().type == Tok::kOp && peek().text == ")") break;
            tuple->args.push_back(expression());
          }
          expect_op(")");
          return tuple;
        }
        if (tok.text == "[") {
          auto list = make(ExprKind::kList);
          if (!accept_op("]")) {
            do {
              if (peek().type == Tok::kOp && peek().text == "]") break;
              list->args.push_back(expression());
            } while (accept_op(","));
            expect_op("]");
          }
          return list;
        }
        if (tok.text == "{") {
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
          return dict;
        }
        break;
      case Tok::kEnd: error(line_, "unexpected end of expression");
    }
    error(line_, fmt::format("unexpected '{}'", tok.text));
  }

  std::vector<Token> t_;
  std::size_t pos_ = 0;
  int line_;
  int depth_ = 0;
};

// ---------------------------------------------------------------- statements

}  // namespace impl

enum class NodeKind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kBody };

struct Node {
  using ExprPtr = impl::ExprPtr;
  NodeKind kind = NodeKind::kBody;
  int line = 0;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, std::vector<std::shared_ptr<const Node>>>> branches;  // kIf (null cond = else)
  std::vector<std::string> targets;  // kFor loop variables; kSet/kSetBlock: name or {ns, attr}
  ExprPtr filter;                    // kFor "if" condition
  std::vector<std::shared_ptr<const Node>> body, else_body;
};

namespace impl {

using NodePtr = std::shared_ptr<const Node>;

struct Piece {
  enum Type { kText, kExpr, kStmt } type;
  std::string text;
  int line;
};

// Splits the source into text, {{ }} and {% %} pieces, dropping comments and
// applying whitespace control, trim_blocks and lstrip_blocks.
std::vector<Piece> split_pieces(const std::string& src) {
  std::vector<Piece> out;
  std::size_t i = 0;
  int line = 1;
  bool trim_next_newline = false, strip_next = false;
  std::string text;
  auto line_at = [&](std::size_t from, std::size_t to) {
    for (std::size_t k = from; k < to; ++k) line += src[k] == '\n';
  };
  auto emit_text = [&] {
    if (!text.empty()) out.push_back({Piece::kText, text, line});
    text.clear();
  };
  while (i <= src.size()) {
    std::size_t open = src.find('{', i);
    while (open != std::string::npos && open + 1 < src.size() && src[open + 1] != '{' && src[open + 1] != '%' && src[open + 1] != '#')
      open = src.find('{', open + 1);
    if (open + 1 >= src.size()) open = std::string::npos;
    std::string chunk = src.substr(i, open == std::string::npos ? std::string::npos : open - i);
    if (strip_next) {
      chunk.erase(0, chunk.find_first_not_of(kWhitespace) == std::string::npos ? chunk.size() : chunk.find_first_not_of(kWhitespace));
    } else if (trim_next_newline) {
      if (chunk.starts_with("\n")) chunk.erase(0, 1);
      else if (chunk.starts_with("\r\n")) chunk.erase(0, 2);
    }
    strip_next = trim_next_newline = false;
    if (open == std::string::npos) {
      text += chunk;
      line_at(i, src.size());
      break;
    }
    const char kind = src[open + 1];
    const bool block = kind == '%' || kind == '#';
    std::size_t code_begin = open + 2;
    const char modifier = code_begin < src.size() ? src[code_begin] : '\0';
    if (modifier == '-') {
      const std::size_t keep = chunk.find_last_not_of(kWhitespace);
      chunk.erase(keep == std::string::npos ? 0 : keep + 1);
      ++code_begin;
    } else if (modifier == '+') {
      ++code_begin;
    } else if (block) {  // lstrip_blocks: spaces and tabs from the start of the line up to the tag
      std::size_t k = open, blanks = 0;
      while (k > 0 && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k, ++blanks;
      if (k == 0 || src[k - 1] == '\n') chunk.erase(chunk.size() - std::min(blanks, chunk.size()));
    }
    text += chunk;
    line_at(i, open);
    const char* close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    std::size_t end = code_begin;
    char quote = 0;
    for (; end + 1 < src.size(); ++end) {
      const char c = src[end];
      if (kind != '#') {
        if (quote) {
          if (c == '\\') ++end;
          else if (c == quote) quote = 0;
          continue;
        }
        if (c == '\'' || c == '"') {
          quote = c;
          continue;
        }
      }
      if (src.compare(end, 2, close) == 0) break;
    }
    if (end + 1 >= src.size()) error(line, fmt::format("'{}' is not closed by '{}'", src.substr(open, 2), close));
    std::size_t code_end = end;
    if (code_end > code_begin && src[code_end - 1] == '-') {
      --code_end;
      strip_next = true;
    } else if (code_end > code_begin && src[code_end - 1] == '+' && block) {
      --code_end;
    } else if (block) {
      trim_next_newline = true;
    }
    const int tag_line = line;
    line_at(open, end + 2);
    if (kind != '#') {
      emit_text();
      out.push_back({kind == '{' ? Piece::kExpr : Piece::kStmt, src.substr(code_begin, code_end - code_begin), tag_line});
    }
    i = end + 2;
  }
  emit_text();
  return out;
}

class Parser {
 public:
  explicit Parser(std::vector<Piece> pieces) : p_(std::move(pieces)) {}

  NodePtr parse() {
    auto root = std::make_shared<Node>();
    std::string end;
    root->body = body({}, end);
    return root;
  }

 private:
  // Parses nodes until a statement whose first word is in `ends` (returned
  // in `end`, with the rest of that tag left in last_).
  std::vector<NodePtr> body(const std::vector<std::string>& ends, std::string& end) {
    std::vector<NodePtr> nodes;
    while (pos_ < p_.size()) {
      const Piece& piece = p_[pos_++];
      if (piece.type == Piece::kText) {
        auto n = std::make_shared<Node>();
        n->kind = NodeKind::kText;
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

  NodePtr statement(const std::string& word, ExprParser& ep, int line) {
    auto n = std::make_shared<Node>();
    n->line = line;
    std::string end;
    if (word == "if") {
      n->kind = NodeKind::kIf;
      ExprPtr cond = ep.expression();
      ep.expect_end();
      for (;;) {
        auto nodes = body({"elif", "else", "endif"}, end);
        n->branches.emplace_back(cond, std::move(nodes));
        if (end == "elif") {
          cond = last_->expression();
          last_->expect_end();
          continue;
        }
        last_->expect_end();
        if (end == "else") {
          n->branches.emplace_back(nullptr, body({"endif"}, end));
          last_->expect_end();
        }
        break;
      }
    } else if (word == "for") {
      n->kind = NodeKind::kFor;
      do n->targets.push_back(ep.expect_name());
      while (ep.accept_op(","));
      if (!ep.accept_name("in")) error(line, "expected 'in' in a for tag");
      n->expr = ep.without_conditional();
      if (ep.accept_name("if")) n->filter = ep.expression();
      if (ep.accept_name("recursive")) error(line, "recursive loops are not supported");
      ep.expect_end();
      n->body = body({"else", "endfor"}, end);
      last_->expect_end();
      if (end == "else") {
        n->else_body = body({"endfor"}, end);
        last_->expect_end();
      }
    } else if (word == "set") {
      n->targets.push_back(ep.expect_name());
      if (ep.accept_op(".")) n->targets.push_back(ep.expect_name());
      if (ep.accept_op("=")) {
        n->kind = NodeKind::kSet;
        n->expr = ep.expression();
        ep.expect_end();
      } else {
        ep.expect_end();
        n->kind = NodeKind::kSetBlock;
        n->body = body({"endset"}, end);
        last_->expect_end();
      }
    } else if (word == "break" || word == "continue") {
      ep.expect_end();
      n->kind = word == "break" ? NodeKind::kBreak : NodeKind::kContinue;
    } else if (word == "generation") {  // transformers' assistant-mask marker: renders its body
      ep.expect_end();
      n->kind = NodeKind::kBody;
      n->body = body({"endgeneration"}, end);
      last_->expect_end();
    } else {
      error(line, fmt::format("unsupported tag '{}'", word));
    }
    return n;
  }

  std::vector<Piece> p_;
  std::size_t pos_ = 0;
  std::unique_ptr<ExprParser> last_;
};

// ---------------------------------------------------------------- rendering

struct LoopControl {
  enum Type { kBreak, kContinue } type;
};

class Renderer {
 public:
  explicit Renderer(const nlohmann::ordered_json& context) {
    scopes_.emplace_back();
    if (context.is_object())
      for (const auto& [k, v] : context.items()) scopes_.back()[k] = from_json(v);
  }

  void render(const std::vector<NodePtr>& nodes, std::string& out) {
    for (const NodePtr& n : nodes) render(*n, out);
  }

 private:
  void render(const Node& n, std::string& out) {
    switch (n.kind) {
      case NodeKind::kText: out += n.text; return;
      case NodeKind::kOutput: out += str(eval(*n.expr)); return;
      case NodeKind::kBody: render(n.body, out); return;
      case NodeKind::kIf:
        for (const auto& [cond, body] : n.branches)
          if (!cond || truthy(eval(*cond))) {
            render(body, out);
            return;
          }
        return;
      case NodeKind::kSet: assign(n, eval(*n.expr)); return;
      case NodeKind::kSetBlock: {
        std::string captured;
        render(n.body, captured);
        assign(n, Value::string(captured));
        return;
      }
      case NodeKind::kBreak:
      case NodeKind::kContinue:
        if (loop_depth_ == 0) error(n.line, "break or continue outside a loop");
        throw LoopControl{n.kind == NodeKind::kBreak ? LoopControl::kBreak : LoopControl::kContinue};
      case NodeKind::kFor: render_for(n, out); return;
    }
  }

  void assign(const Node& n, Value v) {
    if (n.targets.size() == 1) {
      scopes_.back()[n.targets[0]] = std::move(v);
      return;
    }
    Value* ns = lookup(n.targets[0]);
    if (ns == nullptr || ns->kind != Kind::kNamespace)
      error(n.line, fmt::format("cannot set '{}.{}': '{}' is not a namespace()", n.targets[0], n.targets[1], n.targets[0]));
    for (auto& [k, val] : *ns->dict)
      if (k == n.targets[1]) {
        val = std::move(v);
        return;
      }
    ns->dict->emplace_back(n.targets[1], std::move(v));
  }

  List iterate(const Value& v, int line) {
    switch (v.kind) {
      case Kind::kUndefined: return {};
      case Kind::kList: return *v.list;
      case Kind::kDict: {
        List keys;
        for (const auto& [k, unused] : *v.dict) keys.push_back(Value::string(k));
        return keys;
      }
      case Kind::kString: {
        List chars;
        const auto at = code_points(v.s);
        for (std::size_t i = 0; i < at.size(); ++i)
          chars.push_back(Value::string(v.s.substr(at[i], (i + 1 < at.size() ? at[i + 1] : v.s.size()) - at[i])));
        return chars;
      }
      default: error(line, fmt::format("'{}' object is not iterable", kind_name(v)));
    }
  }

  void bind_targets(const Node& n, const Value& item, std::unordered_map<std::string, Value>& scope) {
    if (n.targets.size() == 1) {
      scope[n.targets[0]] = item;
      return;
    }
    const List parts = iterate(item, n.line);
    if (parts.size() != n.targets.size())
      error(n.line, fmt::format("cannot unpack {} values into {} loop variables", parts.size(), n.targets.size()));
    for (std::size_t i = 0; i < parts.size(); ++i) scope[n.targets[i]] = parts[i];
  }

  void render_for(const Node& n, std::string& out) {
    const List all = iterate(eval(*n.expr), n.line);
    List items;
    if (n.filter) {
      for (const Value& item : all) {
        scopes_.emplace_back();
        bind_targets(n, item, scopes_.back());
        const bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (keep) items.push_back(item);
      }
    } else {
      items = all;
    }
    if (items.empty()) {
      render(n.else_body, out);
      return;
    }
    ++loop_depth_;
    const auto length = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < length; ++i) {
      scopes_.emplace_back();
      auto& scope = scopes_.back();
      bind_targets(n, items[static_cast<std::size_t>(i)], scope);
      Dict loop = {{"index", Value::integer(i + 1)},
                   {"index0", Value::integer(i)},
                   {"revindex", Value::integer(length - i)},
                   {"revindex0", Value::integer(length - i - 1)},
                   {"first", Value::boolean(i == 0)},
                   {"last", Value::boolean(i == length - 1)},
                   {"length", Value::integer(length)},
                   {"depth", Value::integer(1)},
                   {"depth0", Value::integer(0)}};
      if (i > 0) loop.emplace_back("previtem", items[static_cast<std::size_t>(i - 1)]);
      if (i + 1 < length) loop.emplace_back("nextitem", items[static_cast<std::size_t>(i + 1)]);
      scope["loop"] = Value::of_dict(std::move(loop));
      bool stop = false;
      try {
        render(n.body, out);
      } catch (const LoopControl& c) {
        stop = c.type == LoopControl::kBreak;
      } catch (...) {
        scopes_.pop_back();
        --loop_depth_;
        throw;
      }
      scopes_.pop_back();
      if (stop) break;
    }
    --loop_depth_;
  }

  Value* lookup(const std::string& name) {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      const auto found = it->find(name);
      if (found != it->end()) return &found->second;
    }
    return nullptr;
  }

  std::vector<Value> eval_args(const Expr& e) {
    std::vector<Value> out;
    for (const auto& a : e.args) out.push_back(a ? eval(*a) : Value{});
    return out;
  }

  // Keyword argument `key`, or `fallback`.
  Value kwarg(const Expr& e, const char* key, Value fallback = {}) {
    for (const auto& [k, v] : e.kwargs)
      if (k == key) return eval(*v);
    return fallback;
  }

  // Positional argument i, or keyword `key`, or `fallback`.
  Value arg(const Expr& e, const std::vector<Value>& args, std::size_t i, const char* key, Value fallback = {}) {
    return i < args.size() ? args[i] : kwarg(e, key, std::move(fallback));
  }

  static std::int64_t to_int(const Value& v, int line, const char* what) {
    if (v.kind == Kind::kInt) return v.i;
    if (v.kind == Kind::kBool) return v.b ? 1 : 0;
    error(line, fmt::format("{} must be an integer, not {}", what, kind_name(v)));
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
      if (key.kind != Kind::kString) return Value{};
      const Value* v = obj.find(key.s);
      return v ? *v : Value{};
    }
    if (obj.kind == Kind::kList || obj.kind == Kind::kString) {
      if (key.kind != Kind::kInt && key.kind != Kind::kBool) return Value{};
      const List elems = obj.kind == Kind::kList ? List{} : iterate(obj, line);
      const List& seq = obj.kind == Kind::kList ? *obj.list : elems;
      std::int64_t i = to_int(key, line, "an index");
      if (i < 0) i += static_cast<std::int64_t>(seq.size());
      if (i < 0 || i >= static_cast<std::int64_t>(seq.size())) return Value{};
      return seq[static_cast<std::size_t>(i)];
    }
    if (obj.undefined()) error(line, "cannot index an undefined value");
    return Value{};
  }

  Value slice(const Value& obj, const Expr& e) {
    const bool is_string = obj.kind == Kind::kString;
    if (!is_string && obj.kind != Kind::kList) {
      if (obj.undefined()) error(e.line, "cannot slice an undefined value");
      error(e.line, fmt::format("cannot slice a '{}'", kind_name(obj)));
    }
    const List seq = is_string ? iterate(obj, e.line) : *obj.list;
    const auto n = static_cast<std::int64_t>(seq.size());
    const Value step_v = e.args[0] ? eval(*e.args[0]) : Value::none();
    const std::int64_t step = step_v.kind == Kind::kNone ? 1 : to_int(step_v, e.line, "a slice step");
    if (step == 0) error(e.line, "slice step cannot be zero");
    auto bound = [&](const ExprPtr& x, std::int64_t dflt) {
      if (!x) return dflt;
      const Value v = eval(*x);
      if (v.kind == Kind::kNone) return dflt;
      std::int64_t i = to_int(v, e.line, "a slice index");
      if (i < 0) i += n;
      if (step > 0) return std::clamp<std::int64_t>(i, 0, n);
      return std::clamp<std::int64_t>(i, -1, n - 1);
    };
    const std::int64_t start = bound(e.b, step > 0 ? 0 : n - 1);
    const std::int64_t stop = bound(e.c, step > 0 ? n : -1);
    List out;
    for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(seq[static_cast<std::size_t>(i)]);
    if (!is_string) return Value::of_list(std::move(out));
    std::string joined;
    for (const Value& c : out) joined += c.s;
    return Value::string(joined);
  }

  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
      const Value* v = obj.find(name);
      return v ? *v : Value{};
    }
    if (obj.undefined()) error(line, fmt::format("cannot read '{}' of an undefined value", name));
    if ((obj.kind == Kind::kList || obj.kind == Kind::kString) && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0])))
      return item(obj, Value::integer(std::stoll(name)), line);
    return Value{};
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.a;
    std::vector<Value> args = eval_args(e);
    if (callee.kind == ExprKind::kName && lookup(callee.name) == nullptr) {
      if (callee.name == "raise_exception")
        throw RaisedException(args.empty() ? std::string("raise_exception() called") : str(args[0]));
      if (callee.name == "namespace") {
        Dict d;
        if (!args.empty() && args[0].kind == Kind::kDict) d = *args[0].dict;
        for (const auto& [k, v] : e.kwargs) d.emplace_back(k, eval(*v));
        return Value::of_dict(std::move(d), Kind::kNamespace);
      }
      if (callee.name == "range") {
        std::int64_t start = 0, stop = 0, step = 1;
        if (args.size() == 1) stop = to_int(args[0], e.line, "range()");
        else if (args.size() >= 2) start = to_int(args[0], e.line, "range()"), stop = to_int(args[1], e.line, "range()");
        if (args.size() == 3) step = to_int(args[2], e.line, "range()");
        if (args.empty() || args.size() > 3 || step == 0) error(e.line, "range() takes 1 to 3 integers, step not 0");
        if ((stop - start) / step > 1000000) error(e.line, "range() is too long");
        List out;
        for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) out.push_back(Value::integer(i));
        return Value::of_list(std::move(out));
      }
      error(e.line, fmt::format("'{}' is undefined", callee.name));
    }
    if (callee.kind != ExprKind::kAttr) error(e.line, "this value cannot be called");
    const Value obj = eval(*callee.a);
    const std::string& m = callee.name;
    if (obj.kind == Kind::kString) {
      const std::string& s = obj.s;
      auto chars = [&](std::size_t i) { return i < args.size() && args[i].kind == Kind::kString ? args[i].s : std::string(kWhitespace); };
      if (m == "strip") return Value::string(strip(s, chars(0), true, true));
      if (m == "lstrip") return Value::string(strip(s, chars(0), true, false));
      if (m == "rstrip") return Value::string(strip(s, chars(0), false, true));
      if (m == "upper" || m == "lower") {
        std::string out = s;
        for (char& c : out) c = static_cast<char>(m == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
        return Value::string(out);
      }
      if (m == "title") return Value::string(title_case(s, false));
      if (m == "capitalize") return Value::string(title_case(s, true));
      if (m == "startswith" || m == "endswith") {
        List prefixes = args.empty() ? List{} : args[0].kind == Kind::kList ? *args[0].list : List{args[0]};
        for (const Value& p : prefixes) {
          if (p.kind != Kind::kString) error(e.line, fmt::format("{}() takes strings", m));
          if (m == "startswith" ? s.starts_with(p.s) : s.ends_with(p.s)) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (m == "split") {
        const Value sep = arg(e, args, 0, "sep", Value::none());
        const std::int64_t maxsplit = to_int(arg(e, args, 1, "maxsplit", Value::integer(-1)), e.line, "maxsplit");
        List out;
        if (sep.kind == Kind::kNone) {
          std::size_t i = s.find_first_not_of(kWhitespace);
          while (i != std::string::npos) {
            if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
              out.push_back(Value::string(strip(s.substr(i), kWhitespace, false, true)));
              break;
            }
            const std::size_t j = s.find_first_of(kWhitespace, i);
            out.push_back(Value::string(s.substr(i, j == std::string::npos ? std::string::npos : j - i)));
            i = j == std::string::npos ? j : s.find_first_not_of(kWhitespace, j);
          }
          return Value::of_list(std::move(out));
        }
        if (sep.kind != Kind::kString || sep.s.empty()) error(e.line, "split() needs a non-empty string separator");
        std::size_t i = 0;
        for (;;) {
          const std::size_t j = s.find(sep.s, i);
          if (j == std::string::npos || (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit)) {
            out.push_back(Value::string(s.substr(i)));
            break;
          }
          out.push_back(Value::string(s.substr(i, j - i)));
          i = j + sep.s.size();
        }
        return Value::of_list(std::move(out));
      }
      if (m == "replace") {
        if (args.size() < 2 || args[0].kind != Kind::kString || args[1].kind != Kind::kString)
          error(e.line, "replace() takes two strings");
        return Value::string(replace_all(s, args[0].s, args[1].s, args.size() > 2 ? to_int(args[2], e.line, "count") : -1));
      }
      if (m == "find") {
        if (args.empty() || args[0].kind != Kind::kString) error(e.line, "find() takes a string");
        const std::size_t at = s.find(args[0].s);
        if (at == std::string::npos) return Value::integer(-1);
        const auto cps = code_points(s);
        return Value::integer(std::lower_bound(cps.begin(), cps.end(), at) - cps.begin());
      }
      if (m == "join") {
        std::string out;
        const List parts = args.empty() ? List{} : iterate(args[0], e.line);
        for (std::size_t i = 0; i < parts.size(); ++i) out += (i ? s : "") + str(parts[i]);
        return Value::string(out);
      }
    } else if (obj.kind == Kind::kDict) {
      if (m == "items") {
        List out;
        for (const auto& [k, v] : *obj.dict) out.push_back(Value::of_list({Value::string(k), v}));
        return Value::of_list(std::move(out));
      }
      if (m == "keys" || m == "values") {
        List out;
        for (const auto& [k, v] : *obj.dict) out.push_back(m == "keys" ? Value::string(k) : v);
        return Value::of_list(std::move(out));
      }
      if (m == "get") {
        if (args.empty()) error(e.line, "get() needs a key");
        const Value v = item(obj, args[0], e.line);
        return v.undefined() ? (args.size() > 1 ? args[1] : Value::none()) : v;
      }
    } else if (obj.undefined()) {
      error(e.line, fmt::format("cannot call '{}' of an undefined value", m));
    }
    error(e.line, fmt::format("'{}' object has no method '{}'", kind_name(obj), m));
  }

  static std::string replace_all(const std::string& s, const std::string& from, const std::string& to, std::int64_t count) {
    if (from.empty()) return s;
    std::string out;
    std::size_t i = 0;
    for (std::int64_t n = 0; count < 0 || n < count; ++n) {
      const std::size_t j = s.find(from, i);
      if (j == std::string::npos) break;
      out += s.substr(i, j - i) + to;
      i = j + from.size();
    }
    return out + s.substr(i);
  }

  bool test(const Expr& e) { return test(e.name, eval(*e.a), eval_args(e), e.line); }

  // The Jinja test `t` ("defined", "divisibleby", ...) of `v` with arguments `args`.
  bool test(const std::string& t, const Value& v, const std::vector<Value>& args, int line) {
    auto need = [&] {
      if (args.empty()) error(line, fmt::format("the test '{}' needs an argument", t));
      return args[0];
    };
    if (t == "defined") return !v.undefined();
    if (t == "undefined") return v.undefined();
    if (t == "none") return v.kind == Kind::kNone;
    if (t == "string") return v.kind == Kind::kString;
    if (t == "number") return v.kind == Kind::kInt || v.kind == Kind::kFloat;
    if (t == "integer") return v.kind == Kind::kInt;
    if (t == "float") return v.kind == Kind::kFloat;
    if (t == "boolean") return v.kind == Kind::kBool;
    if (t == "true") return v.kind == Kind::kBool && v.b;
    if (t == "false") return v.kind == Kind::kBool && !v.b;
    if (t == "mapping") return v.kind == Kind::kDict || v.kind == Kind::kNamespace;
    if (t == "sequence") return v.kind == Kind::kList || v.kind == Kind::kString || v.kind == Kind::kDict;
    if (t == "iterable") return v.kind == Kind::kList || v.kind == Kind::kString || v.kind == Kind::kDict || v.undefined();
    if (t == "even" || t == "odd") return (to_int(v, line, t.c_str()) % 2 == 0) == (t == "even");
    if (t == "divisibleby") {
      const std::int64_t d = to_int(need(), line, "divisibleby");
      if (d == 0) error(line, "divisibleby 0");
      return to_int(v, line, "divisibleby") % d == 0;
    }
    if (t == "eq" || t == "equalto" || t == "sameas") return equal(v, need());
    if (t == "ne") return !equal(v, need());
    if (t == "in") return contains(need(), v, line);
    if (t == "lower" || t == "upper") {
      if (v.kind != Kind::kString) return false;
      for (const char c : v.s)
        if (t == "lower" ? std::isupper(static_cast<unsigned char>(c)) : std::islower(static_cast<unsigned char>(c))) return false;
      return true;
    }
    error(line, fmt::format("unknown test '{}'", t));
  }

  bool contains(const Value& container, const Value& v, int line) {
    switch (container.kind) {
      case Kind::kString:
        if (v.kind != Kind::kString) error(line, "'in <string>' requires a string on the left");
        return container.s.find(v.s) != std::string::npos;
      case Kind::kList:
        return std::any_of(container.list->begin(), container.list->end(), [&](const Value& x) { return equal(x, v); });
      case Kind::kDict:
      case Kind::kNamespace: return v.kind == Kind::kString && container.find(v.s) != nullptr;
      case Kind::kUndefined: error(line, "'in' an undefined value");
      default: error(line, fmt::format("'in' needs a string, list or dict, not {}", kind_name(container)));
    }
  }

  Value filter(const Expr& e) {
    const Value v = eval(*e.a);
    const std::vector<Value> args = eval_args(e);
    const std::string& f = e.name;
    if (f == "safe") return v;
    if (f == "trim") {
      if (v.kind != Kind::kString) error(e.line, fmt::format("trim needs a string, not {}", kind_name(v)));
      const Value chars = arg(e, args, 0, "chars", Value::none());
      return Value::string(strip(v.s, chars.kind == Kind::kString ? chars.s : std::string(kWhitespace), true, true));
    }
    if (f == "length" || f == "count") {
      switch (v.kind) {
        case Kind::kString: return Value::integer(static_cast<std::int64_t>(code_points(v.s).size()));
        case Kind::kList: return Value::integer(static_cast<std::int64_t>(v.list->size()));
        case Kind::kDict:
        case Kind::kNamespace: return Value::integer(static_cast<std::int64_t>(v.dict->size()));
        case Kind::kUndefined: return Value::integer(0);
        default: error(e.line, fmt::format("object of type '{}' has no length", kind_name(v)));
      }
    }
    if (f == "tojson") {
      const Value indent = arg(e, args, 0, "indent", Value::none());
      std::string out;
      to_json(v, indent.kind == Kind::kNone ? -1 : static_cast<int>(to_int(indent, e.line, "indent")), 0, out, e.line);
      return Value::string(out);
    }
    if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") {
      if (v.kind != Kind::kString) error(e.line, fmt::format("{} needs a string", f));
      if (f == "title") return Value::string(title_case(v.s, false));
      if (f == "capitalize") return Value::string(title_case(v.s, true));
      std::string out = v.s;
      for (char& c : out) c = static_cast<char>(f == "upper" ? std::toupper(static_cast<unsigned char>(c)) : std::tolower(static_cast<unsigned char>(c)));
      return Value::string(out);
    }
    if (f == "default" || f == "d") {
      const bool boolean = truthy(arg(e, args, 1, "boolean", Value::boolean(false)));
      if (v.undefined() || (boolean && !truthy(v))) return arg(e, args, 0, "default_value", Value::string(""));
      return v;
    }
    if (f == "first" || f == "last") {
      const List seq = iterate(v, e.line);
      if (seq.empty()) return Value{};
      return f == "first" ? seq.front() : seq.back();
    }
    if (f == "join") {
      const Value sep = arg(e, args, 0, "d", Value::string(""));
      const Value attr = arg(e, args, 1, "attribute", Value{});
      std::string out;
      const List parts = iterate(v, e.line);
      for (std::size_t i = 0; i < parts.size(); ++i)
        out += (i ? str(sep) : "") + str(attr.undefined() ? parts[i] : attribute(parts[i], str(attr), e.line));
      return Value::string(out);
    }
    if (f == "list") return Value::of_list(iterate(v, e.line));
    if (f == "string") return Value::string(str(v));
    if (f == "int") {
      if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::integer(to_int(v, e.line, "int"));
      if (v.kind == Kind::kFloat) return Value::integer(static_cast<std::int64_t>(v.f));
      if (v.kind == Kind::kString) {
        try {
          std::size_t used = 0;
          const std::string t = strip(v.s, kWhitespace, true, true);
          const long long x = std::stoll(t, &used);
          if (used == t.size()) return Value::integer(x);
        } catch (const std::exception&) {
        }
      }
      return arg(e, args, 0, "default", Value::integer(0));
    }
    if (f == "float") {
      if (v.is_number()) return Value::number(v.as_double());
      if (v.kind == Kind::kString) {
        try {
          return Value::number(std::stod(v.s));
        } catch (const std::exception&) {
        }
      }
      return arg(e, args, 0, "default", Value::number(0.0));
    }
    if (f == "abs") {
      if (v.kind == Kind::kInt) return Value::integer(v.i < 0 ? -v.i : v.i);
      if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
      error(e.line, "abs needs a number");
    }
    if (f == "replace") {
      if (v.kind != Kind::kString || args.size() < 2 || args[0].kind != Kind::kString || args[1].kind != Kind::kString)
        error(e.line, "replace needs a string and two string arguments");
      return Value::string(replace_all(v.s, args[0].s, args[1].s, args.size() > 2 ? to_int(args[2], e.line, "count") : -1));
    }
    if (f == "reverse") {
      List seq = iterate(v, e.line);
      std::reverse(seq.begin(), seq.end());
      if (v.kind != Kind::kString) return Value::of_list(std::move(seq));
      std::string out;
      for (const Value& c : seq) out += c.s;
      return Value::string(out);
    }
    if (f == "items") {
      if (v.kind != Kind::kDict) error(e.line, "items needs a dict");
      List out;
      for (const auto& [k, val] : *v.dict) out.push_back(Value::of_list({Value::string(k), val}));
      return Value::of_list(std::move(out));
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (args.empty() || args[0].kind != Kind::kString) error(e.line, fmt::format("{} needs an attribute name", f));
      List out;
      for (const Value& x : iterate(v, e.line)) {
        const Value a = attribute(x, args[0].s, e.line);
        bool ok;
        if (args.size() < 2) {
          ok = truthy(a);
        } else {
          ok = test(str(args[1]), a, std::vector<Value>(args.begin() + 2, args.end()), e.line);
        }
        if (ok == (f == "selectattr")) out.push_back(x);
      }
      return Value::of_list(std::move(out));
    }
    if (f == "map") {
      const Value attr = kwarg(e, "attribute");
      if (attr.undefined()) error(e.line, "map is supported with attribute= only");
      List out;
      for (const Value& x : iterate(v, e.line)) {
        Value a = attribute(x, str(attr), e.line);
        if (a.undefined()) a = kwarg(e, "default");
        out.push_back(a);
      }
      return Value::of_list(std::move(out));
    }
    error(e.line, fmt::format("unknown filter '{}'", f));
  }

  Value arithmetic(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "~") return Value::string(str(l) + str(r));
    if (l.undefined() || r.undefined()) error(line, fmt::format("'{}' with an undefined value", op));
    if (op == "+") {
      if (l.kind == Kind::kString && r.kind == Kind::kString) return Value::string(l.s + r.s);
      if (l.kind == Kind::kList && r.kind == Kind::kList) {
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return Value::of_list(std::move(out));
      }
    }
    if (op == "*" && l.kind == Kind::kString && (r.kind == Kind::kInt || r.kind == Kind::kBool)) {
      std::string out;
      for (std::int64_t i = 0; i < std::min<std::int64_t>(to_int(r, line, "repeat"), 1 << 20); ++i) out += l.s;
      return Value::string(out);
    }
    if (!l.is_number() || !r.is_number())
      error(line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, kind_name(l), kind_name(r)));
    const bool ints = l.kind != Kind::kFloat && r.kind != Kind::kFloat;
    const std::int64_t a = ints ? to_int(l, line, op.c_str()) : 0, b = ints ? to_int(r, line, op.c_str()) : 0;
    const double x = l.as_double(), y = r.as_double();
    if (op == "+") return ints ? Value::integer(a + b) : Value::number(x + y);
    if (op == "-") return ints ? Value::integer(a - b) : Value::number(x - y);
    if (op == "*") return ints ? Value::integer(a * b) : Value::number(x * y);
    if (op == "/") {
      if (y == 0) error(line, "division by zero");
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) error(line, "division by zero");
      if (ints) {
        std::int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) --q, m += b;
        return Value::integer(op == "//" ? q : m);
      }
      const double q = std::floor(x / y);
      return Value::number(op == "//" ? q : x - q * y);
    }
    if (op == "**") return ints && b >= 0 ? Value::integer(static_cast<std::int64_t>(std::pow(x, y))) : Value::number(std::pow(x, y));
    error(line, fmt::format("unknown operator {}", op));
  }

  Value compare(const std::string& op, const Value& l, const Value& r, int line) {
    if (op == "==") return Value::boolean(equal(l, r));
    if (op == "!=") return Value::boolean(!equal(l, r));
    if (op == "in") return Value::boolean(contains(r, l, line));
    if (op == "not in") return Value::boolean(!contains(r, l, line));
    int c;
    if (l.is_number() && r.is_number()) c = l.as_double() < r.as_double() ? -1 : l.as_double() > r.as_double() ? 1 : 0;
    else if (l.kind == Kind::kString && r.kind == Kind::kString) c = l.s.compare(r.s);
    else error(line, fmt::format("'{}' not supported between '{}' and '{}'", op, kind_name(l), kind_name(r)));
    if (op == "<") return Value::boolean(c < 0);
    if (op == "<=") return Value::boolean(c <= 0);
    if (op == ">") return Value::boolean(c > 0);
    return Value::boolean(c >= 0);
  }

  Value eval(const Expr& e) {
    if (++depth_ > 200) error(e.line, "expression nested too deeply");
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{depth_};
    switch (e.kind) {
      case ExprKind::kLiteral: return e.literal;
      case ExprKind::kName: {
        const Value* v = lookup(e.name);
        return v ? *v : Value{};
      }
      case ExprKind::kAttr: return attribute(eval(*e.a), e.name, e.line);
      case ExprKind::kItem: return item(eval(*e.a), eval(*e.b), e.line);
      case ExprKind::kSlice: return slice(eval(*e.a), e);
      case ExprKind::kCall: return call(e);
      case ExprKind::kFilter: return filter(e);
      case ExprKind::kTest: return Value::boolean(test(e) != e.negated);
      case ExprKind::kNeg: {
        const Value v = eval(*e.a);
        if (v.kind == Kind::kInt) return Value::integer(-v.i);
        if (v.kind == Kind::kFloat) return Value::number(-v.f);
        error(e.line, fmt::format("bad operand type for unary -: '{}'", kind_name(v)));
      }
      case ExprKind::kNot: return Value::boolean(!truthy(eval(*e.a)));
      case ExprKind::kAnd: {
        Value l = eval(*e.a);
        return truthy(l) ? eval(*e.b) : l;
      }
      case ExprKind::kOr: {
        Value l = eval(*e.a);
        return truthy(l) ? l : eval(*e.b);
      }
      case ExprKind::kCond:
        if (truthy(eval(*e.b))) return eval(*e.a);
        return e.c ? eval(*e.c) : Value{};
      case ExprKind::kBinary: {
        const Value l = eval(*e.a);
        const Value r = eval(*e.b);
        if (e.name == "==" || e.name == "!=" || e.name == "<" || e.name == "<=" || e.name == ">" || e.name == ">=" ||
            e.name == "in" || e.name == "not in")
          return compare(e.name, l, r, e.line);
        return arithmetic(e.name, l, r, e.line);
      }
      case ExprKind::kList: return Value::of_list(eval_args(e));
      case ExprKind::kDict: {
        Dict d;
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (k.kind != Kind::kString) error(e.line, "dict keys must be strings");
          d.emplace_back(k.s, eval(*e.args[i + 1]));
        }
        return Value::of_dict(std::move(d));
      }
    }
    return Value{};
  }

  std::vector<std::unordered_map<std::string, Value>> scopes_;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace impl

Template::Template(const std::string& source) : root_(impl::Parser(impl::split_pieces(source)).parse()) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  std::string out;
  impl::Renderer(context).render(root_->body, out);
  return out;
}

}  // namespace woq::jinja
