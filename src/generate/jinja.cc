#include "generate/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <variant>
#include <vector>

#include <fmt/format.h>

namespace woq::jinja {

namespace impl {

// The sandbox's limits (jinja.h), each reached in well under a second.
constexpr int kMaxDepth = 512;                 // nesting of a value: the input's, or one the template builds
constexpr int kMaxTemplateDepth = 128;         // nesting of blocks, and of an expression's operators and brackets
constexpr std::size_t kMaxSize = 16u << 20;    // bytes of the output, and of any one string or list (Value::size)
constexpr std::size_t kMaxLength = 1'000'000;  // elements of any one list (range() included)
// Steps per render. A step is about one expression node's work (some 50 ns); a loop
// iteration costs 4, a list element built or copied 2, a string built, copied, compared
// or scanned one more per 64 bytes, and a dict lookup one more per 16 keys it scans.
constexpr std::int64_t kMaxSteps = 5'000'000;
constexpr std::int64_t kIterationSteps = 4, kElementSteps = 2, kBytesPerStep = 64, kKeysPerStep = 16;

[[noreturn]] void error(int line, const std::string& what) {
  throw TemplateError(fmt::format("chat template line {}: {}", line, what));
}

// The steps one render has taken.
class Budget {
 public:
  /// Takes `n` more steps; false once the render has taken more than kMaxSteps.
  bool spend(std::int64_t n) { return (steps_ += n) <= kMaxSteps; }
  /// spend(n), or the error naming `what` (the construct) and the line.
  void charge(std::int64_t n, int line, std::string_view what) {
    if (!spend(n)) exhausted(line, what);
  }
  [[noreturn]] static void exhausted(int line, std::string_view what) {
    error(line, fmt::format("{}: the template ran more than {} steps", what, kMaxSteps));
  }

 private:
  std::int64_t steps_ = 0;
};

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // insertion order, like Python's dict

enum class Kind : std::uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace };

struct Value {
  Value() = default;
  explicit Value(Kind k) : kind(k) {}

  Kind kind = Kind::kUndefined;
  bool b = false;
  std::int32_t depth = 0;  // kList, kDict: levels of lists and dicts, this one included (kNamespace: at construction)
  std::int64_t i = 0;
  double f = 0;
  std::string s;
  std::size_t size = 0;        // what kMaxSize counts: a string's bytes; a list's or dict's keys, elements and one per element
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
    x.size = x.s.size();
    return x;
  }
  static Value of_list(List v) {
    Value x{Kind::kList};
    x.depth = 1;
    x.list = std::make_shared<List>(std::move(v));
    for (const Value& e : *x.list) x.add(e);
    return x;
  }
  static Value of_dict(Dict v, Kind kind = Kind::kDict) { return of_dict(std::make_shared<Dict>(std::move(v)), kind); }
  static Value of_dict(std::shared_ptr<Dict> v, Kind kind = Kind::kDict) {
    Value x{kind};
    x.depth = 1;
    x.dict = std::move(v);
    for (const auto& [k, e] : *x.dict) x.add(e), x.size += k.size();
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

 private:
  // Counts element `e` into depth and size.
  void add(const Value& e) {
    depth = std::max(depth, e.depth + 1);
    size += e.size + 1;
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

// The context variable `name` (JSON value `j`, `depth` levels down) as a Value.
Value from_json(const nlohmann::ordered_json& j, const std::string& name, int depth = 0) {
  if (depth >= kMaxDepth && (j.is_array() || j.is_object()))
    throw TemplateError(fmt::format("chat template input: '{}' is nested deeper than {} levels", name, kMaxDepth));
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned: return Value::integer(static_cast<std::int64_t>(j.get<std::uint64_t>()));
    case nlohmann::json::value_t::number_float: return Value::number(j.get<double>());
    case nlohmann::json::value_t::string: return Value::string(j.get<std::string>());
    case nlohmann::json::value_t::array: {
      List l;
      for (const auto& e : j) l.push_back(from_json(e, name, depth + 1));
      return Value::of_list(std::move(l));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (const auto& [k, v] : j.items()) d.emplace_back(k, from_json(v, name, depth + 1));
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
  for (std::size_t i = 0; i < s.size(); ++i) {
    std::size_t j = i;  // a run of characters that print as themselves, appended at once (s may be long)
    while (j < s.size() && s[j] != q && s[j] != '\\' && static_cast<unsigned char>(s[j]) >= 0x20 && s[j] != 0x7f) ++j;
    out.append(s, i, j - i);
    if (j == s.size()) break;
    const char c = s[i = j];
    if (c == q || c == '\\') out += '\\', out += c;
    else if (c == '\n') out += "\\n";
    else if (c == '\r') out += "\\r";
    else if (c == '\t') out += "\\t";
    else out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
  }
  return out + q;
}

// A recursive walk over a value (printing, tojson, comparing) for the construct
// `what` at `line`: it checks the nesting and charges the render's steps.
struct Walk {
  Budget& budget;
  int line;
  std::string_view what;

  // Visits `v`, `depth` levels down.
  void enter(const Value& v, int depth) const {
    if (depth > kMaxDepth) error(line, fmt::format("{}: the value is nested deeper than {} levels", what, kMaxDepth));
    budget.charge(1 + static_cast<std::int64_t>(v.s.size()) / kBytesPerStep, line, what);
  }
  // Throws if the text built is to be longer than kMaxSize.
  void fits(std::size_t size) const {
    if (size > kMaxSize) error(line, fmt::format("{}: the text would be longer than {} MiB", what, kMaxSize >> 20));
  }
};

// Python's repr() of `v`, appended to `out`.
void repr(const Value& v, std::string& out, const Walk& w, int depth = 0) {
  w.enter(v, depth);
  switch (v.kind) {
    case Kind::kUndefined: break;
    case Kind::kNone: out += "None"; break;
    case Kind::kBool: out += v.b ? "True" : "False"; break;
    case Kind::kInt: out += std::to_string(v.i); break;
    case Kind::kFloat: out += float_repr(v.f); break;
    case Kind::kString: out += python_repr_string(v.s); break;
    case Kind::kList:
      out += '[';
      for (std::size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        repr((*v.list)[i], out, w, depth + 1);
      }
      out += ']';
      break;
    case Kind::kDict:
    case Kind::kNamespace:
      out += v.kind == Kind::kNamespace ? "<Namespace {" : "{";
      for (std::size_t i = 0; i < v.dict->size(); ++i) {
        if (i) out += ", ";
        out += python_repr_string((*v.dict)[i].first) + ": ";
        repr((*v.dict)[i].second, out, w, depth + 1);
      }
      out += v.kind == Kind::kNamespace ? "}>" : "}";
      break;
  }
  w.fits(out.size());
}

// str(): what {{ }} prints.
std::string str(const Value& v, const Walk& w) {
  switch (v.kind) {
    case Kind::kUndefined: return "";
    case Kind::kString: return v.s;
    default: {
      std::string out;
      repr(v, out, w);
      return out;
    }
  }
}

// json.dumps(v, ensure_ascii=False, indent=indent) with Python's separators (indent -1: None, else at most kMaxSize).
void to_json(const Value& v, std::int64_t indent, int depth, std::string& out, const Walk& w) {
  w.enter(v, depth);
  w.fits(out.size());
  auto newline = [&](int d) {
    if (indent < 0) return;
    const auto spaces = static_cast<std::size_t>(indent) * static_cast<std::size_t>(d);  // indent <= kMaxSize
    w.fits(out.size() + 1 + spaces);
    out += '\n';
    out.append(spaces, ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.kind) {
    case Kind::kUndefined: error(w.line, "tojson: the value is undefined");
    case Kind::kNone: out += "null"; return;
    case Kind::kBool: out += v.b ? "true" : "false"; return;
    case Kind::kInt: out += std::to_string(v.i); return;
    case Kind::kFloat: out += std::isfinite(v.f) ? float_repr(v.f) : std::isnan(v.f) ? "NaN" : v.f > 0 ? "Infinity" : "-Infinity"; return;
    case Kind::kString: {
      out += '"';
      for (std::size_t i = 0; i < v.s.size(); ++i) {
        std::size_t j = i;  // a run of characters that need no escape, appended at once
        while (j < v.s.size() && v.s[j] != '"' && v.s[j] != '\\' && static_cast<unsigned char>(v.s[j]) >= 0x20) ++j;
        out.append(v.s, i, j - i);
        if (j == v.s.size()) break;
        const char c = v.s[i = j];
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
      w.fits(out.size());
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
        to_json((*v.list)[i], indent, depth + 1, out, w);
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
        to_json(Value::string((*v.dict)[i].first), indent, depth + 1, out, w);
        out += ": ";
        to_json((*v.dict)[i].second, indent, depth + 1, out, w);
      }
      newline(depth);
      out += '}';
      return;
  }
}

// Python's ==.
bool equal(const Value& a, const Value& b, const Walk& w, int depth = 0) {
  w.enter(a, depth);
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
      return a.list->size() == b.list->size() && std::equal(a.list->begin(), a.list->end(), b.list->begin(),
                                                            [&](const Value& x, const Value& y) { return equal(x, y, w, depth + 1); });
    case Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        w.budget.charge(static_cast<std::int64_t>(b.dict->size()) / kKeysPerStep, w.line, w.what);  // find() scans the keys
        const Value* o = b.find(k);
        if (o == nullptr || !equal(v, *o, w, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    default: return false;
  }
}

// Whether byte `i` of a UTF-8 string starts a code point (Python indexes strings by code point).
bool starts_code_point(std::string_view s, std::size_t i) { return i == 0 || (static_cast<unsigned char>(s[i]) & 0xC0) != 0x80; }

std::size_t code_point_count(std::string_view s) {
  std::size_t n = 0;
  for (std::size_t i = 0; i < s.size(); ++i) n += starts_code_point(s, i);
  return n;
}

// The code points of `s` in reverse order: its bytes reversed, then each code point's put back in order.
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

// Python's s[start:stop:step] by code point, `start` and `stop` clamped as for a
// list of code_point_count(s) elements; no index is built (s may be long).
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

constexpr const char* kWhitespace = " \t\n\r\v\f";

std::string strip(const std::string& s, const std::string& chars, bool left, bool right) {
  std::size_t b = 0, e = s.size();
  if (left) b = s.find_first_not_of(chars);
  if (b == std::string::npos) return {};
  if (right) e = s.find_last_not_of(chars) + 1;
  return s.substr(b, e - b);
}

// s.upper() or s.lower() for ASCII letters (as std::toupper in the "C" locale; UTF-8 stays intact).
std::string change_case(std::string s, bool upper) {
  for (char& c : s)
    if (upper ? c >= 'a' && c <= 'z' : c >= 'A' && c <= 'Z') c = static_cast<char>(c ^ 0x20);
  return s;
}

// s.title(), or s.capitalize() if `only_first` (ASCII letters, like change_case).
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
  int height = 1;        // nodes on the longest path to a leaf (evaluation recurses that deep)
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
  // `e`, complete, with its height: loops such as "a + b + c ..." build trees that
  // recursive evaluation (and destruction) must not find too deep.
  ExprPtr done(std::shared_ptr<Expr> e) {
    int h = 0;
    for (const ExprPtr* x : {&e->a, &e->b, &e->c})
      if (*x) h = std::max(h, (*x)->height);
    for (const ExprPtr& x : e->args)
      if (x) h = std::max(h, x->height);
    for (const auto& [k, x] : e->kwargs) h = std::max(h, x->height);
    e->height = h + 1;
    if (e->height > kMaxTemplateDepth) error(line_, fmt::format("the expression is nested deeper than {} levels", kMaxTemplateDepth));
    return e;
  }
  ExprPtr binary(const std::string& op, ExprPtr l, ExprPtr r, ExprKind k = ExprKind::kBinary) {
    auto e = make(k);
    e->name = op;
    e->a = std::move(l);
    e->b = std::move(r);
    return done(std::move(e));
  }

  // Nesting guard: deeply nested input ("((((...") must not exhaust the stack.
  struct Depth {
    ExprParser& p;
    explicit Depth(ExprParser& parser) : p(parser) {
      if (++p.depth_ > kMaxTemplateDepth)
        error(p.line_, fmt::format("the expression is nested deeper than {} levels", kMaxTemplateDepth));
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
      e = done(std::move(c));
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
      return done(std::move(e));
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
      return filters(done(std::move(e)));
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
  ExprPtr postfix(ExprPtr e) {
    for (;;) {
      if (accept_op(".")) {
        auto a = make(ExprKind::kAttr);
        if (peek().type == Tok::kInt) a->name = t_[pos_++].text;
        else a->name = expect_name();
        a->a = e;
        e = done(std::move(a));
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
        e = done(std::move(x));
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
      case Tok::kInt: {
        std::int64_t v = 0;
        const auto [end, ec] = std::from_chars(tok.text.data(), tok.text.data() + tok.text.size(), v);
        if (ec != std::errc() || end != tok.text.data() + tok.text.size())
          error(line_, fmt::format("the integer literal {} is out of the 64-bit range", tok.text));
        return lit(Value::integer(v));
      }
      case Tok::kFloat: {
        double v = 0;
        const auto [end, ec] = std::from_chars(tok.text.data(), tok.text.data() + tok.text.size(), v);
        if (ec != std::errc() || end != tok.text.data() + tok.text.size())
          error(line_, fmt::format("the float literal {} is out of range", tok.text));
        return lit(Value::number(v));
      }
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
          return done(std::move(tuple));
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
          return done(std::move(list));
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
          return done(std::move(dict));
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

  NodePtr statement(const std::string& word, ExprParser& ep, int line) {
    if (depth_ >= kMaxTemplateDepth) error(line, fmt::format("'{}': blocks are nested deeper than {} levels", word, kMaxTemplateDepth));
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{++depth_};
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
  int depth_ = 0;  // blocks open
};

// ---------------------------------------------------------------- rendering

struct LoopControl {
  enum Type { kBreak, kContinue } type;
};

// The construct expression `e` is, for errors: "'+'", "join", "range()".
std::string describe(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral: return "a literal";
    case ExprKind::kName: return fmt::format("'{}'", e.name);
    case ExprKind::kAttr: return fmt::format("'.{}'", e.name);
    case ExprKind::kItem: return "'[]'";
    case ExprKind::kSlice: return "'[:]'";
    case ExprKind::kCall:
      return e.a->kind == ExprKind::kName || e.a->kind == ExprKind::kAttr ? fmt::format("{}()", e.a->name) : std::string("a call");
    case ExprKind::kFilter: return e.name;
    case ExprKind::kTest: return fmt::format("is {}", e.name);
    case ExprKind::kNeg: return "unary '-'";
    case ExprKind::kNot: return "'not'";
    case ExprKind::kBinary:
    case ExprKind::kAnd:
    case ExprKind::kOr: return fmt::format("'{}'", e.name);
    case ExprKind::kCond: return "'if else'";
    case ExprKind::kList: return "a list";
    case ExprKind::kDict: return "a dict";
  }
  return "an expression";
}

class Renderer {
 public:
  explicit Renderer(const nlohmann::ordered_json& context) {
    scopes_.emplace_back();
    if (context.is_object())
      for (const auto& [k, v] : context.items()) scopes_.back()[k] = from_json(v, k);
  }

  void render(const std::vector<NodePtr>& nodes, std::string& out) {
    for (const NodePtr& n : nodes) render(*n, out);
  }

 private:
  Walk walk(int line, std::string_view what) { return {budget_, line, what}; }

  // Appends `text` to the output (or a {% set %} block's) within kMaxSize.
  static void emit(std::string& out, const std::string& text, int line, std::string_view what) {
    if (out.size() + text.size() > kMaxSize)
      error(line, fmt::format("{}: the output would be longer than {} MiB", what, kMaxSize >> 20));
    out += text;
  }

  void render(const Node& n, std::string& out) {
    switch (n.kind) {
      case NodeKind::kText: emit(out, n.text, n.line, "text"); return;
      case NodeKind::kOutput: emit(out, str(eval(*n.expr), walk(n.line, "{{ }}")), n.line, "{{ }}"); return;
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
    if (v.kind == Kind::kNamespace)  // no cycles, and no nesting that set could deepen unseen
      error(n.line, fmt::format("cannot set '{}.{}' to a namespace()", n.targets[0], n.targets[1]));
    for (auto& [k, val] : *ns->dict)
      if (k == n.targets[1]) {
        val = std::move(v);
        return;
      }
    ns->dict->emplace_back(n.targets[1], std::move(v));
  }

  // `v`, a list or dict the template built for `what` at `line`, if within
  // kMaxLength, kMaxSize and kMaxDepth, holding no namespace(); charges its copy.
  Value checked(Value v, int line, std::string_view what) {
    const std::size_t n = v.list ? v.list->size() : v.dict ? v.dict->size() : 0;
    if (n > kMaxLength) error(line, fmt::format("{}: the list would have more than {} elements", what, kMaxLength));
    if (v.size > kMaxSize) error(line, fmt::format("{}: the value would be larger than {} MiB", what, kMaxSize >> 20));
    if (v.depth > kMaxDepth) error(line, fmt::format("{}: the value would be nested deeper than {} levels", what, kMaxDepth));
    charge_copy(v, line, what);
    auto is_namespace = [](const Value& x) { return x.kind == Kind::kNamespace; };
    if ((v.list && std::any_of(v.list->begin(), v.list->end(), is_namespace)) ||
        (v.dict && std::any_of(v.dict->begin(), v.dict->end(), [&](const auto& kv) { return is_namespace(kv.second); })))
      error(line, fmt::format("{}: a namespace() cannot be put in a list, dict or namespace", what));
    return v;
  }
  Value list(List l, int line, std::string_view what) { return checked(Value::of_list(std::move(l)), line, what); }
  Value dict(Dict d, int line, std::string_view what, Kind kind = Kind::kDict) {
    return checked(Value::of_dict(std::move(d), kind), line, what);
  }
  // Throws unless a list of `n` elements (or a string of `n` bytes) fits.
  static void room(std::size_t n, std::size_t limit, int line, std::string_view what) {
    if (n > limit)
      error(line, limit == kMaxSize ? fmt::format("{}: the string would be longer than {} MiB", what, kMaxSize >> 20)
                                    : fmt::format("{}: the list would have more than {} elements", what, kMaxLength));
  }

  // Charges copying the elements of list or dict `v`, `element_steps` each, and
  // their strings' bytes (copied; lists and dicts in it are shared).
  void charge_copy(const Value& v, int line, std::string_view what, std::int64_t element_steps = kElementSteps) {
    std::size_t n = 0, bytes = 0;
    if (v.list)
      for (const Value& e : *v.list) ++n, bytes += e.s.size();
    if (v.dict)
      for (const auto& [k, e] : *v.dict) ++n, bytes += k.size() + e.s.size();
    budget_.charge(static_cast<std::int64_t>(n) * element_steps + static_cast<std::int64_t>(bytes) / kBytesPerStep, line, what);
  }

  // The elements of `v` for a loop or a filter (`what`): a copy of at most kMaxLength.
  List iterate(const Value& v, int line, std::string_view what = "for") {
    List out;
    switch (v.kind) {
      case Kind::kUndefined: return {};
      case Kind::kList:
        room(v.list->size(), kMaxLength, line, what);
        charge_copy(v, line, what);
        return *v.list;
      case Kind::kDict:
        room(v.dict->size(), kMaxLength, line, what);
        charge_copy(v, line, what);
        for (const auto& [k, unused] : *v.dict) out.push_back(Value::string(k));
        return out;
      case Kind::kString: {
        const std::size_t n = code_point_count(v.s);
        room(n, kMaxLength, line, what);
        budget_.charge(static_cast<std::int64_t>(n) * kElementSteps, line, what);
        for (std::size_t b = 0, e; b < v.s.size(); b = e) {
          for (e = b + 1; e < v.s.size() && !starts_code_point(v.s, e);) ++e;
          out.push_back(Value::string(v.s.substr(b, e - b)));
        }
        return out;
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
    const Value seq = eval(*n.expr);
    List items;  // the elements; a list (never mutated) is iterated in place
    if (seq.kind != Kind::kList) items = iterate(seq, n.line);
    else charge_copy(seq, n.line, "for", 0);  // the loop variable's copies
    if (n.filter) {
      List kept;
      for (const Value& item : seq.kind == Kind::kList ? *seq.list : items) {
        scopes_.emplace_back();
        bind_targets(n, item, scopes_.back());
        const bool keep = truthy(eval(*n.filter));
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    const List& all = seq.kind == Kind::kList && !n.filter ? *seq.list : items;
    if (all.empty()) {
      render(n.else_body, out);
      return;
    }
    ++loop_depth_;
    scopes_.emplace_back();
    std::shared_ptr<Dict> loop;  // reused while no iteration kept a reference to it
    const auto length = static_cast<std::int64_t>(all.size());
    try {
      for (std::int64_t i = 0; i < length; ++i) {
        budget_.charge(kIterationSteps, n.line, "for");
        auto& scope = scopes_.back();
        if (scope.size() != n.targets.size() + 1) scope.clear();  // what the last iteration set goes
        bind_targets(n, all[static_cast<std::size_t>(i)], scope);
        Value& loop_var = scope["loop"];
        loop_var = Value{};  // the last iteration's reference
        if (!loop || loop.use_count() > 1)
          loop = std::make_shared<Dict>(Dict{{"index", Value::integer(0)},
                                             {"index0", Value::integer(0)},
                                             {"revindex", Value::integer(0)},
                                             {"revindex0", Value::integer(0)},
                                             {"first", Value::boolean(false)},
                                             {"last", Value::boolean(false)},
                                             {"length", Value::integer(length)},
                                             {"depth", Value::integer(1)},
                                             {"depth0", Value::integer(0)}});
        Dict& d = *loop;
        d.resize(9);  // previtem and nextitem go
        d[0].second.i = i + 1;
        d[1].second.i = i;
        d[2].second.i = length - i;
        d[3].second.i = length - i - 1;
        d[4].second.b = i == 0;
        d[5].second.b = i == length - 1;
        if (i > 0) d.emplace_back("previtem", all[static_cast<std::size_t>(i - 1)]);
        if (i + 1 < length) d.emplace_back("nextitem", all[static_cast<std::size_t>(i + 1)]);
        loop_var = Value::of_dict(loop);
        try {
          render(n.body, out);
        } catch (const LoopControl& c) {
          if (c.type == LoopControl::kBreak) break;
        }
      }
    } catch (...) {
      scopes_.pop_back();
      --loop_depth_;
      throw;
    }
    scopes_.pop_back();
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

  static std::int64_t to_int(const Value& v, int line, std::string_view what) {
    if (v.kind == Kind::kInt) return v.i;
    if (v.kind == Kind::kBool) return v.b ? 1 : 0;
    error(line, fmt::format("{} must be an integer, not {}", what, kind_name(v)));
  }

  // Charges scanning string `s` (indexing it by code point, say).
  void scan(const std::string& s, int line, std::string_view what) {
    budget_.charge(static_cast<std::int64_t>(s.size()) / kBytesPerStep, line, what);
  }

  // obj.find(key), charging the linear scan.
  const Value* find(const Value& obj, const std::string& key, int line, std::string_view what) {
    budget_.charge(static_cast<std::int64_t>(obj.dict->size()) / kKeysPerStep, line, what);
    return obj.find(key);
  }

  Value item(const Value& obj, const Value& key, int line) {
    if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
      if (key.kind != Kind::kString) return Value{};
      const Value* v = find(obj, key.s, line, "'[]'");
      return v ? *v : Value{};
    }
    if (obj.kind == Kind::kList || obj.kind == Kind::kString) {
      if (key.kind != Kind::kInt && key.kind != Kind::kBool) return Value{};
      const bool is_string = obj.kind == Kind::kString;
      if (is_string) scan(obj.s, line, "'[]'");
      const auto n = static_cast<std::int64_t>(is_string ? code_point_count(obj.s) : obj.list->size());
      std::int64_t i = to_int(key, line, "an index");
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value{};
      if (is_string) return Value::string(slice_code_points(obj.s, i, i + 1, 1));
      return (*obj.list)[static_cast<std::size_t>(i)];
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
    if (is_string) scan(obj.s, e.line, "'[:]'");
    const auto n = static_cast<std::int64_t>(is_string ? code_point_count(obj.s) : obj.list->size());
    const Value step_v = e.args[0] ? eval(*e.args[0]) : Value::none();
    const std::int64_t step = step_v.kind == Kind::kNone ? 1 : to_int(step_v, e.line, "a slice step");
    if (step == 0) error(e.line, "slice step cannot be zero");
    auto bound = [&](const ExprPtr& x, std::int64_t dflt) {
      if (!x) return dflt;
      const Value v = eval(*x);
      if (v.kind == Kind::kNone) return dflt;
      std::int64_t i = to_int(v, e.line, "a slice index");
      if (i < 0) i = i < -n ? -n - 1 : i + n;  // (no overflow)
      if (step > 0) return std::clamp<std::int64_t>(i, 0, n);
      return std::clamp<std::int64_t>(i, -1, n - 1);
    };
    const std::int64_t start = bound(e.b, step > 0 ? 0 : n - 1);
    const std::int64_t stop = bound(e.c, step > 0 ? n : -1);
    if (is_string) return Value::string(slice_code_points(obj.s, start, stop, step));
    // The count first: start + k * step stays within [-1, n] (no overflow).
    std::uint64_t count = 0;
    if (step > 0 && start < stop) count = (static_cast<std::uint64_t>(stop - start) - 1) / static_cast<std::uint64_t>(step) + 1;
    if (step < 0 && start > stop) count = (static_cast<std::uint64_t>(start - stop) - 1) / (0 - static_cast<std::uint64_t>(step)) + 1;
    List out;
    out.reserve(count);
    for (std::uint64_t k = 0; k < count; ++k)
      out.push_back((*obj.list)[static_cast<std::size_t>(start + static_cast<std::int64_t>(k) * step)]);
    return list(std::move(out), e.line, "'[:]'");
  }

  Value attribute(const Value& obj, const std::string& name, int line) {
    if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
      const Value* v = find(obj, name, line, "'.'");
      return v ? *v : Value{};
    }
    if (obj.undefined()) error(line, fmt::format("cannot read '{}' of an undefined value", name));
    if ((obj.kind == Kind::kList || obj.kind == Kind::kString) && !name.empty() && std::isdigit(static_cast<unsigned char>(name[0]))) {
      std::int64_t i = 0;
      const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), i);
      if (ec != std::errc() || end != name.data() + name.size()) return Value{};  // no such index
      return item(obj, Value::integer(i), line);
    }
    return Value{};
  }

  Value call(const Expr& e) {
    const Expr& callee = *e.a;
    std::vector<Value> args = eval_args(e);
    if (callee.kind == ExprKind::kName && lookup(callee.name) == nullptr) {
      if (callee.name == "raise_exception")
        throw RaisedException(args.empty() ? std::string("raise_exception() called") : str(args[0], walk(e.line, "raise_exception()")));
      if (callee.name == "namespace") {
        Dict d;
        if (!args.empty() && args[0].kind == Kind::kDict) d = *args[0].dict;
        for (const auto& [k, v] : e.kwargs) d.emplace_back(k, eval(*v));
        return dict(std::move(d), e.line, "namespace()", Kind::kNamespace);
      }
      if (callee.name == "range") {
        std::int64_t start = 0, stop = 0, step = 1;
        if (args.size() == 1) stop = to_int(args[0], e.line, "range()");
        else if (args.size() >= 2) start = to_int(args[0], e.line, "range()"), stop = to_int(args[1], e.line, "range()");
        if (args.size() == 3) step = to_int(args[2], e.line, "range()");
        if (args.empty() || args.size() > 3 || step == 0) error(e.line, "range() takes 1 to 3 integers, step not 0");
        // The length, in unsigned arithmetic (stop - start may not fit an int64).
        std::uint64_t count = 0;
        const auto ustart = static_cast<std::uint64_t>(start), ustop = static_cast<std::uint64_t>(stop);
        if (step > 0 && start < stop) count = (ustop - ustart - 1) / static_cast<std::uint64_t>(step) + 1;
        if (step < 0 && start > stop) count = (ustart - ustop - 1) / (0 - static_cast<std::uint64_t>(step)) + 1;
        if (count > kMaxLength) error(e.line, fmt::format("range() is too long: {} elements (at most {})", count, kMaxLength));
        List out;
        out.reserve(count);
        for (std::uint64_t k = 0; k < count; ++k) out.push_back(Value::integer(start + static_cast<std::int64_t>(k) * step));
        return list(std::move(out), e.line, "range()");
      }
      error(e.line, fmt::format("'{}' is undefined", callee.name));
    }
    if (callee.kind != ExprKind::kAttr) error(e.line, "this value cannot be called");
    const Value obj = eval(*callee.a);
    const std::string_view m = callee.name;
    if (obj.kind == Kind::kString) {
      const std::string& s = obj.s;
      auto chars = [&](std::size_t i) { return i < args.size() && args[i].kind == Kind::kString ? args[i].s : std::string(kWhitespace); };
      if (m == "strip") return Value::string(strip(s, chars(0), true, true));
      if (m == "lstrip") return Value::string(strip(s, chars(0), true, false));
      if (m == "rstrip") return Value::string(strip(s, chars(0), false, true));
      if (m == "upper" || m == "lower") return Value::string(change_case(s, m == "upper"));
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
        scan(s, e.line, "split()");
        List out;
        if (sep.kind == Kind::kNone) {
          std::size_t i = s.find_first_not_of(kWhitespace);
          while (i != std::string::npos) {
            room(out.size() + 1, kMaxLength, e.line, "split()");
            if (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit) {
              out.push_back(Value::string(strip(s.substr(i), kWhitespace, false, true)));
              break;
            }
            const std::size_t j = s.find_first_of(kWhitespace, i);
            out.push_back(Value::string(s.substr(i, j == std::string::npos ? std::string::npos : j - i)));
            i = j == std::string::npos ? j : s.find_first_not_of(kWhitespace, j);
          }
          return list(std::move(out), e.line, "split()");
        }
        if (sep.kind != Kind::kString || sep.s.empty()) error(e.line, "split() needs a non-empty string separator");
        std::size_t i = 0;
        for (;;) {
          room(out.size() + 1, kMaxLength, e.line, "split()");
          const std::size_t j = s.find(sep.s, i);
          if (j == std::string::npos || (maxsplit >= 0 && static_cast<std::int64_t>(out.size()) == maxsplit)) {
            out.push_back(Value::string(s.substr(i)));
            break;
          }
          out.push_back(Value::string(s.substr(i, j - i)));
          i = j + sep.s.size();
        }
        return list(std::move(out), e.line, "split()");
      }
      if (m == "replace") {
        if (args.size() < 2 || args[0].kind != Kind::kString || args[1].kind != Kind::kString)
          error(e.line, "replace() takes two strings");
        const std::int64_t count = args.size() > 2 ? to_int(args[2], e.line, "count") : -1;
        return Value::string(replace_all(s, args[0].s, args[1].s, count, e.line, "replace()"));
      }
      if (m == "find") {
        if (args.empty() || args[0].kind != Kind::kString) error(e.line, "find() takes a string");
        scan(s, e.line, "find()");
        const std::size_t at = s.find(args[0].s);
        if (at == std::string::npos) return Value::integer(-1);
        return Value::integer(static_cast<std::int64_t>(code_point_count(std::string_view(s).substr(0, at))));
      }
      if (m == "join") return Value::string(join(args.empty() ? List{} : iterate(args[0], e.line, "join()"), s, Value{}, e.line, "join()"));
    } else if (obj.kind == Kind::kDict) {
      if (m == "items") return items(obj, e.line, "items()");
      if (m == "keys" || m == "values") {
        List out;
        for (const auto& [k, v] : *obj.dict) out.push_back(m == "keys" ? Value::string(k) : v);
        return list(std::move(out), e.line, m == "keys" ? "keys()" : "values()");
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

  // dict.items() and |items: [key, value] pairs.
  Value items(const Value& d, int line, std::string_view what) {
    List out;
    for (const auto& [k, val] : *d.dict) out.push_back(Value::of_list({Value::string(k), val}));
    return list(std::move(out), line, what);
  }

  // `parts` printed and joined by `sep` (each part's attribute `attr` unless undefined).
  std::string join(const List& parts, const std::string& sep, const Value& attr, int line, std::string_view what) {
    const Walk w = walk(line, what);
    std::string out;
    for (std::size_t i = 0; i < parts.size(); ++i) {
      if (i) out += sep;
      out += str(attr.undefined() ? parts[i] : attribute(parts[i], str(attr, w), line), w);
      w.fits(out.size());
    }
    return out;
  }

  // s.replace(from, to, count): a step per replacement.
  std::string replace_all(const std::string& s, const std::string& from, const std::string& to, std::int64_t count, int line,
                          std::string_view what) {
    if (from.empty()) return s;
    std::string out;
    std::size_t i = 0;
    for (std::int64_t n = 0; count < 0 || n < count; ++n) {
      const std::size_t j = s.find(from, i);
      if (j == std::string::npos) break;
      room(out.size() + (j - i) + to.size(), kMaxSize, line, what);
      budget_.charge(1, line, what);
      out.append(s, i, j - i) += to;
      i = j + from.size();
    }
    room(out.size() + (s.size() - i), kMaxSize, line, what);
    return out.append(s, i);
  }

  bool test(const Expr& e) { return test(e.name, eval(*e.a), eval_args(e), e.line); }

  // The Jinja test `t` ("defined", "divisibleby", ...) of `v` with arguments `args`.
  bool test(std::string_view t, const Value& v, const std::vector<Value>& args, int line) {
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
    if (t == "even" || t == "odd") return (to_int(v, line, t) % 2 == 0) == (t == "even");
    if (t == "divisibleby") {
      const std::int64_t d = to_int(need(), line, "divisibleby");
      if (d == 0) error(line, "divisibleby 0");
      return d == -1 || to_int(v, line, "divisibleby") % d == 0;  // (INT64_MIN % -1 traps)
    }
    if (t == "eq" || t == "equalto" || t == "sameas") return equal(v, need(), walk(line, "is eq"));
    if (t == "ne") return !equal(v, need(), walk(line, "is ne"));
    if (t == "in") return contains(need(), v, line, "is in");
    if (t == "lower" || t == "upper") {
      if (v.kind != Kind::kString) return false;
      for (const char c : v.s)
        if (t == "lower" ? std::isupper(static_cast<unsigned char>(c)) : std::islower(static_cast<unsigned char>(c))) return false;
      return true;
    }
    error(line, fmt::format("unknown test '{}'", t));
  }

  bool contains(const Value& container, const Value& v, int line, std::string_view what) {
    const Walk w = walk(line, what);
    switch (container.kind) {
      case Kind::kString:
        if (v.kind != Kind::kString) error(line, "'in <string>' requires a string on the left");
        budget_.charge(static_cast<std::int64_t>(container.s.size()) / kBytesPerStep, line, what);
        return container.s.find(v.s) != std::string::npos;
      case Kind::kList:
        return std::any_of(container.list->begin(), container.list->end(), [&](const Value& x) { return equal(x, v, w); });
      case Kind::kDict:
      case Kind::kNamespace: return v.kind == Kind::kString && find(container, v.s, line, what) != nullptr;
      case Kind::kUndefined: error(line, "'in' an undefined value");
      default: error(line, fmt::format("'in' needs a string, list or dict, not {}", kind_name(container)));
    }
  }

  Value filter(const Expr& e) {
    const Value v = eval(*e.a);
    const std::vector<Value> args = eval_args(e);
    const std::string_view f = e.name;
    if (f == "safe") return v;
    if (f == "trim") {
      if (v.kind != Kind::kString) error(e.line, fmt::format("trim needs a string, not {}", kind_name(v)));
      const Value chars = arg(e, args, 0, "chars", Value::none());
      return Value::string(strip(v.s, chars.kind == Kind::kString ? chars.s : std::string(kWhitespace), true, true));
    }
    if (f == "length" || f == "count") {
      switch (v.kind) {
        case Kind::kString:
          scan(v.s, e.line, f);
          return Value::integer(static_cast<std::int64_t>(code_point_count(v.s)));
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
      to_json(v, indent.kind == Kind::kNone ? -1 : std::clamp<std::int64_t>(to_int(indent, e.line, "indent"), 0, kMaxSize), 0, out,
              walk(e.line, "tojson"));
      return Value::string(out);
    }
    if (f == "upper" || f == "lower" || f == "title" || f == "capitalize") {
      if (v.kind != Kind::kString) error(e.line, fmt::format("{} needs a string", f));
      if (f == "title") return Value::string(title_case(v.s, false));
      if (f == "capitalize") return Value::string(title_case(v.s, true));
      return Value::string(change_case(v.s, f == "upper"));
    }
    if (f == "default" || f == "d") {
      const bool boolean = truthy(arg(e, args, 1, "boolean", Value::boolean(false)));
      if (v.undefined() || (boolean && !truthy(v))) return arg(e, args, 0, "default_value", Value::string(""));
      return v;
    }
    if (f == "first" || f == "last") {
      if (v.kind == Kind::kString) {
        scan(v.s, e.line, f);
        const auto n = static_cast<std::int64_t>(code_point_count(v.s));
        if (n == 0) return Value{};
        return Value::string(f == "first" ? slice_code_points(v.s, 0, 1, 1) : slice_code_points(v.s, n - 1, n, 1));
      }
      if (v.kind == Kind::kList) {
        if (v.list->empty()) return Value{};
        return f == "first" ? v.list->front() : v.list->back();
      }
      const List seq = iterate(v, e.line, f);
      if (seq.empty()) return Value{};
      return f == "first" ? seq.front() : seq.back();
    }
    if (f == "join") {
      const Value sep = arg(e, args, 0, "d", Value::string(""));
      return Value::string(join(iterate(v, e.line, f), str(sep, walk(e.line, f)), arg(e, args, 1, "attribute", Value{}), e.line, f));
    }
    if (f == "list") return list(iterate(v, e.line, f), e.line, f);
    if (f == "string") return Value::string(str(v, walk(e.line, f)));
    if (f == "int") {
      if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::integer(to_int(v, e.line, "int"));
      if (v.kind == Kind::kFloat) {
        if (!(v.f >= -0x1p63 && v.f < 0x1p63)) error(e.line, fmt::format("int: {} is out of the 64-bit range", float_repr(v.f)));
        return Value::integer(static_cast<std::int64_t>(v.f));
      }
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
      if (v.kind == Kind::kInt) {
        if (v.i == INT64_MIN) error(e.line, fmt::format("abs: integer overflow in abs({})", v.i));
        return Value::integer(v.i < 0 ? -v.i : v.i);
      }
      if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
      error(e.line, "abs needs a number");
    }
    if (f == "replace") {
      if (v.kind != Kind::kString || args.size() < 2 || args[0].kind != Kind::kString || args[1].kind != Kind::kString)
        error(e.line, "replace needs a string and two string arguments");
      return Value::string(replace_all(v.s, args[0].s, args[1].s, args.size() > 2 ? to_int(args[2], e.line, "count") : -1, e.line, f));
    }
    if (f == "reverse") {
      if (v.kind == Kind::kString) {
        scan(v.s, e.line, f);
        return Value::string(reverse_code_points(v.s));
      }
      List seq = iterate(v, e.line, f);
      std::reverse(seq.begin(), seq.end());
      return list(std::move(seq), e.line, f);
    }
    if (f == "items") {
      if (v.kind != Kind::kDict) error(e.line, "items needs a dict");
      return items(v, e.line, f);
    }
    if (f == "selectattr" || f == "rejectattr") {
      if (args.empty() || args[0].kind != Kind::kString) error(e.line, fmt::format("{} needs an attribute name", f));
      List out;
      for (const Value& x : iterate(v, e.line, f)) {
        const Value a = attribute(x, args[0].s, e.line);
        bool ok;
        if (args.size() < 2) {
          ok = truthy(a);
        } else {
          ok = test(str(args[1], walk(e.line, f)), a, std::vector<Value>(args.begin() + 2, args.end()), e.line);
        }
        if (ok == (f == "selectattr")) out.push_back(x);
      }
      return list(std::move(out), e.line, f);
    }
    if (f == "map") {
      const Value attr = kwarg(e, "attribute");
      if (attr.undefined()) error(e.line, "map is supported with attribute= only");
      const std::string name = str(attr, walk(e.line, f));
      List out;
      for (const Value& x : iterate(v, e.line, f)) {
        Value a = attribute(x, name, e.line);
        if (a.undefined()) a = kwarg(e, "default");
        out.push_back(a);
      }
      return list(std::move(out), e.line, f);
    }
    error(e.line, fmt::format("unknown filter '{}'", f));
  }

  // `n` copies of `v` (a string or list; `n` the other operand of '*').
  Value repeat(const Value& v, std::int64_t n, int line) {
    if (v.kind == Kind::kString) {
      if (n <= 0 || v.s.empty()) return Value::string("");
      if (static_cast<std::uint64_t>(n) > kMaxSize / v.s.size()) room(kMaxSize + 1, kMaxSize, line, "'*'");
      std::string out;
      out.reserve(v.s.size() * static_cast<std::size_t>(n));
      for (std::int64_t i = 0; i < n; ++i) out += v.s;
      return Value::string(std::move(out));
    }
    if (n <= 0 || v.list->empty()) return list({}, line, "'*'");
    if (static_cast<std::uint64_t>(n) > kMaxLength / v.list->size()) room(kMaxLength + 1, kMaxLength, line, "'*'");
    if (static_cast<std::uint64_t>(n) > kMaxSize / std::max<std::size_t>(v.size, 1))
      error(line, fmt::format("'*': the value would be larger than {} MiB", kMaxSize >> 20));
    List out;
    out.reserve(v.list->size() * static_cast<std::size_t>(n));
    for (std::int64_t i = 0; i < n; ++i) out.insert(out.end(), v.list->begin(), v.list->end());
    return list(std::move(out), line, "'*'");
  }

  Value arithmetic(std::string_view op, const Value& l, const Value& r, int line) {
    if (op == "~") {
      const Walk w = walk(line, "'~'");
      std::string a = str(l, w);
      const std::string b = str(r, w);
      room(a.size() + b.size(), kMaxSize, line, "'~'");
      return Value::string(std::move(a += b));
    }
    if (l.undefined() || r.undefined()) error(line, fmt::format("'{}' with an undefined value", op));
    if (op == "+") {
      if (l.kind == Kind::kString && r.kind == Kind::kString) {
        room(l.s.size() + r.s.size(), kMaxSize, line, "'+'");
        return Value::string(l.s + r.s);
      }
      if (l.kind == Kind::kList && r.kind == Kind::kList) {
        room(l.list->size() + r.list->size(), kMaxLength, line, "'+'");
        if (l.size + r.size > kMaxSize) error(line, fmt::format("'+': the value would be larger than {} MiB", kMaxSize >> 20));
        List out = *l.list;
        out.insert(out.end(), r.list->begin(), r.list->end());
        return list(std::move(out), line, "'+'");
      }
    }
    if (op == "*") {
      const bool li = l.kind == Kind::kInt || l.kind == Kind::kBool, ri = r.kind == Kind::kInt || r.kind == Kind::kBool;
      if ((l.kind == Kind::kString || l.kind == Kind::kList) && ri) return repeat(l, to_int(r, line, "'*'"), line);
      if ((r.kind == Kind::kString || r.kind == Kind::kList) && li) return repeat(r, to_int(l, line, "'*'"), line);
    }
    if (!l.is_number() || !r.is_number())
      error(line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, kind_name(l), kind_name(r)));
    const bool ints = l.kind != Kind::kFloat && r.kind != Kind::kFloat;
    const std::int64_t a = ints ? to_int(l, line, op) : 0, b = ints ? to_int(r, line, op) : 0;
    const double x = l.as_double(), y = r.as_double();
    // Python's ints are unbounded: a result outside 64 bits is an error, not a wrap (UB).
    auto overflow = [&] { error(line, fmt::format("integer overflow in {} {} {}", a, op, b)); };
    std::int64_t out = 0;
    if (op == "+") {
      if (!ints) return Value::number(x + y);
      if (__builtin_add_overflow(a, b, &out)) overflow();
      return Value::integer(out);
    }
    if (op == "-") {
      if (!ints) return Value::number(x - y);
      if (__builtin_sub_overflow(a, b, &out)) overflow();
      return Value::integer(out);
    }
    if (op == "*") {
      if (!ints) return Value::number(x * y);
      if (__builtin_mul_overflow(a, b, &out)) overflow();
      return Value::integer(out);
    }
    if (op == "/") {
      if (y == 0) error(line, fmt::format("division by zero in {} / {}", repr_number(l), repr_number(r)));
      return Value::number(x / y);
    }
    if (op == "//" || op == "%") {
      if (y == 0) error(line, fmt::format("division by zero in {} {} {}", repr_number(l), op, repr_number(r)));
      if (ints) {
        if (b == -1) {  // a / -1 traps for INT64_MIN
          if (op == "%") return Value::integer(0);
          if (a == INT64_MIN) overflow();
          return Value::integer(-a);
        }
        std::int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) --q, m += b;
        return Value::integer(op == "//" ? q : m);
      }
      const double q = std::floor(x / y);
      return Value::number(op == "//" ? q : x - q * y);
    }
    if (op == "**") {
      if (x == 0 && y < 0) error(line, fmt::format("division by zero in {} ** {}", repr_number(l), repr_number(r)));
      if (!ints || b < 0) return Value::number(std::pow(x, y));
      // Exponentiation by squaring: at most 63 squarings before an overflow.
      std::int64_t result = 1, base = a;
      for (std::int64_t e = b; e > 0;) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result)) overflow();
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base)) overflow();
      }
      return Value::integer(result);
    }
    error(line, fmt::format("unknown operator {}", op));
  }

  static std::string repr_number(const Value& v) {
    return v.kind == Kind::kFloat ? float_repr(v.f) : v.kind == Kind::kBool ? (v.b ? "True" : "False") : std::to_string(v.i);
  }

  Value compare(std::string_view op, const Value& l, const Value& r, int line) {
    if (op == "==") return Value::boolean(equal(l, r, walk(line, "'=='")));
    if (op == "!=") return Value::boolean(!equal(l, r, walk(line, "'!='")));
    if (op == "in") return Value::boolean(contains(r, l, line, "'in'"));
    if (op == "not in") return Value::boolean(!contains(r, l, line, "'not in'"));
    int c;
    if (l.is_number() && r.is_number()) {
      c = l.as_double() < r.as_double() ? -1 : l.as_double() > r.as_double() ? 1 : 0;
    } else if (l.kind == Kind::kString && r.kind == Kind::kString) {
      budget_.charge(static_cast<std::int64_t>(std::min(l.s.size(), r.s.size())) / kBytesPerStep, line, op);
      c = l.s.compare(r.s);
    } else {
      error(line, fmt::format("'{}' not supported between '{}' and '{}'", op, kind_name(l), kind_name(r)));
    }
    if (op == "<") return Value::boolean(c < 0);
    if (op == "<=") return Value::boolean(c <= 0);
    if (op == ">") return Value::boolean(c > 0);
    return Value::boolean(c >= 0);
  }

  // Evaluates `e`: one step, and one more per kBytesPerStep of a string result (built or copied).
  Value eval(const Expr& e) {
    if (++depth_ > kMaxTemplateDepth) error(e.line, "expression nested too deeply");
    struct Guard {
      int& d;
      ~Guard() { --d; }
    } guard{depth_};
    Value v = eval_node(e);
    if (!budget_.spend(1 + static_cast<std::int64_t>(v.s.size()) / kBytesPerStep)) Budget::exhausted(e.line, describe(e));
    return v;
  }

  Value eval_node(const Expr& e) {
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
        if (v.kind == Kind::kInt) {
          if (v.i == INT64_MIN) error(e.line, fmt::format("integer overflow in -({})", v.i));
          return Value::integer(-v.i);
        }
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
        const std::string_view op = e.name;
        if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" || op == ">=" || op == "in" || op == "not in")
          return compare(op, l, r, e.line);
        return arithmetic(op, l, r, e.line);
      }
      case ExprKind::kList: return list(eval_args(e), e.line, "a list");
      case ExprKind::kDict: {
        Dict d;
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value k = eval(*e.args[i]);
          if (k.kind != Kind::kString) error(e.line, "dict keys must be strings");
          d.emplace_back(k.s, eval(*e.args[i + 1]));
        }
        return dict(std::move(d), e.line, "a dict");
      }
    }
    return Value{};
  }

  Budget budget_;
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
