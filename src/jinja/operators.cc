#include "jinja/renderer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>

#include <fmt/format.h>

namespace woq::jinja::impl {

namespace {

// A number operand in an error message: its repr().
std::string repr_number(const Value& v) {
  return v.kind == Kind::kFloat  ? float_repr(v.f)
         : v.kind == Kind::kBool ? (v.b ? "True" : "False")
                                 : std::to_string(v.i);
}

// The operands of the numeric operator `op` at `line`: `a` and `b` when neither is a float
// (booleans as 0 and 1), and both as doubles, `x` and `y`.
struct Numbers {
  std::string_view op;
  const Value& l;
  const Value& r;
  int line;
  bool ints;
  std::int64_t a, b;
  double x, y;

  // Python's ints are unbounded: a result outside 64 bits is an error, not a wrap (UB).
  [[noreturn]] void overflow() const { error(line, fmt::format("integer overflow in {} {} {}", a, op, b)); }
  [[noreturn]] void division_by_zero() const {
    error(line, fmt::format("division by zero in {} {} {}", repr_number(l), op, repr_number(r)));
  }
};

// a + b, a - b, a * b.
Value add_subtract_multiply(const Numbers& n) {
  std::int64_t out = 0;
  if (n.op == "+") {
    if (!n.ints) return Value::number(n.x + n.y);
    if (__builtin_add_overflow(n.a, n.b, &out)) n.overflow();
    return Value::integer(out);
  }
  if (n.op == "-") {
    if (!n.ints) return Value::number(n.x - n.y);
    if (__builtin_sub_overflow(n.a, n.b, &out)) n.overflow();
    return Value::integer(out);
  }
  if (!n.ints) return Value::number(n.x * n.y);
  if (__builtin_mul_overflow(n.a, n.b, &out)) n.overflow();
  return Value::integer(out);
}

// a / b, a // b, a % b: Python's true division, floor division and modulo.
Value divide(const Numbers& n) {
  if (n.y == 0) n.division_by_zero();
  if (n.op == "/") return Value::number(n.x / n.y);
  if (n.ints) {
    if (n.b == -1) {  // a / -1 traps for INT64_MIN
      if (n.op == "%") return Value::integer(0);
      if (n.a == INT64_MIN) n.overflow();
      return Value::integer(-n.a);
    }
    std::int64_t q = n.a / n.b, m = n.a % n.b;
    if (m != 0 && ((m < 0) != (n.b < 0))) --q, m += n.b;
    return Value::integer(n.op == "//" ? q : m);
  }
  const double q = std::floor(n.x / n.y);
  return Value::number(n.op == "//" ? q : n.x - q * n.y);
}

// a ** b.
Value power(const Numbers& n) {
  if (n.x == 0 && n.y < 0) n.division_by_zero();
  if (!n.ints || n.b < 0) return Value::number(std::pow(n.x, n.y));
  // Exponentiation by squaring: at most 63 squarings before an overflow.
  std::int64_t result = 1, base = n.a;
  for (std::int64_t e = n.b; e > 0;) {
    if ((e & 1) && __builtin_mul_overflow(result, base, &result)) n.overflow();
    e >>= 1;
    if (e > 0 && __builtin_mul_overflow(base, base, &base)) n.overflow();
  }
  return Value::integer(result);
}

// l op r for two numbers.
Value numeric(std::string_view op, const Value& l, const Value& r, int line) {
  const bool ints = l.kind != Kind::kFloat && r.kind != Kind::kFloat;
  const std::int64_t a = ints ? to_int(l, line, op) : 0, b = ints ? to_int(r, line, op) : 0;
  const Numbers n{op, l, r, line, ints, a, b, l.as_double(), r.as_double()};
  if (op == "+" || op == "-" || op == "*") return add_subtract_multiply(n);
  if (op == "/" || op == "//" || op == "%") return divide(n);
  if (op == "**") return power(n);
  error(line, fmt::format("unknown operator {}", op));
}

}  // namespace

Value Renderer::arithmetic(std::string_view op, const Value& l, const Value& r, int line) {
  if (op == "~") {
    const Walk w = walk(line, "'~'");
    std::string a = str(l, w);
    const std::string b = str(r, w);
    room(a.size() + b.size(), kMaxSize, line, "'~'");
    return Value::string(std::move(a += b));
  }
  if (l.undefined() || r.undefined()) error(line, fmt::format("'{}' with an undefined value", op));
  if (op == "+" && l.kind == r.kind && (l.kind == Kind::kString || l.kind == Kind::kList))
    return add_sequences(l, r, line);
  if (op == "*") {
    const bool li = l.kind == Kind::kInt || l.kind == Kind::kBool, ri = r.kind == Kind::kInt || r.kind == Kind::kBool;
    if ((l.kind == Kind::kString || l.kind == Kind::kList) && ri) return repeat(l, to_int(r, line, "'*'"), line);
    if ((r.kind == Kind::kString || r.kind == Kind::kList) && li) return repeat(r, to_int(l, line, "'*'"), line);
  }
  if (!l.is_number() || !r.is_number())
    error(line, fmt::format("unsupported operand types for {}: '{}' and '{}'", op, kind_name(l), kind_name(r)));
  return numeric(op, l, r, line);
}

Value Renderer::add_sequences(const Value& l, const Value& r, int line) {
  if (l.kind == Kind::kString) {
    room(l.s.size() + r.s.size(), kMaxSize, line, "'+'");
    return Value::string(l.s + r.s);
  }
  room(l.list->size() + r.list->size(), kMaxLength, line, "'+'");
  if (l.size + r.size > kMaxSize)
    error(line, fmt::format("'+': the value would be larger than {} MiB", kMaxSize >> 20));
  List out = *l.list;
  out.insert(out.end(), r.list->begin(), r.list->end());
  return list(std::move(out), line, "'+'");
}

Value Renderer::repeat(const Value& v, std::int64_t n, int line) {
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

Value Renderer::compare(std::string_view op, const Value& l, const Value& r, int line) {
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

bool Renderer::contains(const Value& container, const Value& v, int line, std::string_view what) {
  const Walk w = walk(line, what);
  switch (container.kind) {
    case Kind::kString:
      if (v.kind != Kind::kString) error(line, "'in <string>' requires a string on the left");
      budget_.charge(static_cast<std::int64_t>(container.s.size()) / kBytesPerStep, line, what);
      return container.s.find(v.s) != std::string::npos;
    case Kind::kList:
      return std::any_of(container.list->begin(), container.list->end(),
                         [&](const Value& x) { return equal(x, v, w); });
    case Kind::kDict:
    case Kind::kNamespace: return v.kind == Kind::kString && find(container, v.s, line, what) != nullptr;
    case Kind::kUndefined: error(line, "'in' an undefined value");
    default: error(line, fmt::format("'in' needs a string, list or dict, not {}", kind_name(container)));
  }
}

}  // namespace woq::jinja::impl
