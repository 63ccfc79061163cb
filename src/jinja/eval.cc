#include "jinja/renderer.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <system_error>
#include <utility>

#include <fmt/format.h>

#include "jinja/text.h"

namespace woq::jinja::impl {

namespace {

// The construct expression `e` is, for errors: "'+'", "join", "range()".
std::string describe(const Expr& e) {
  switch (e.kind) {
    case ExprKind::kLiteral: return "a literal";
    case ExprKind::kName: return fmt::format("'{}'", e.name);
    case ExprKind::kAttr: return fmt::format("'.{}'", e.name);
    case ExprKind::kItem: return "'[]'";
    case ExprKind::kSlice: return "'[:]'";
    case ExprKind::kCall:
      return e.a->kind == ExprKind::kName || e.a->kind == ExprKind::kAttr ? fmt::format("{}()", e.a->name)
                                                                          : std::string("a call");
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

}  // namespace

Value Renderer::eval(const Expr& e) {
  if (++depth_ > kMaxTemplateDepth) error(e.line, "expression nested too deeply");
  struct Guard {
    int& d;
    ~Guard() { --d; }
  } guard{depth_};
  Value v = eval_node(e);
  if (!budget_.spend(1 + static_cast<std::int64_t>(v.s.size()) / kBytesPerStep)) Budget::exhausted(e.line, describe(e));
  return v;
}

Value Renderer::eval_node(const Expr& e) {
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
    case ExprKind::kNeg: return negative(e);
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
    case ExprKind::kBinary: return binary(e);
    case ExprKind::kList: return list(eval_args(e), e.line, "a list");
    case ExprKind::kDict: return dict_display(e);
  }
  return Value{};
}

Value Renderer::negative(const Expr& e) {
  const Value v = eval(*e.a);
  if (v.kind == Kind::kInt) {
    if (v.i == INT64_MIN) error(e.line, fmt::format("integer overflow in -({})", v.i));
    return Value::integer(-v.i);
  }
  if (v.kind == Kind::kFloat) return Value::number(-v.f);
  error(e.line, fmt::format("bad operand type for unary -: '{}'", kind_name(v)));
}

Value Renderer::binary(const Expr& e) {
  const Value l = eval(*e.a);
  const Value r = eval(*e.b);
  const std::string_view op = e.name;
  if (op == "==" || op == "!=" || op == "<" || op == "<=" || op == ">" || op == ">=" || op == "in" || op == "not in")
    return compare(op, l, r, e.line);
  return arithmetic(op, l, r, e.line);
}

Value Renderer::dict_display(const Expr& e) {
  Dict d;
  for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
    const Value k = eval(*e.args[i]);
    if (k.kind != Kind::kString) error(e.line, "dict keys must be strings");
    d.emplace_back(k.s, eval(*e.args[i + 1]));
  }
  return dict(std::move(d), e.line, "a dict");
}

std::vector<Value> Renderer::eval_args(const Expr& e) {
  std::vector<Value> out;
  for (const auto& a : e.args) out.push_back(a ? eval(*a) : Value{});
  return out;
}

Value Renderer::kwarg(const Expr& e, const char* key, Value fallback) {
  for (const auto& [k, v] : e.kwargs)
    if (k == key) return eval(*v);
  return fallback;
}

Value Renderer::arg(const Expr& e, const std::vector<Value>& args, std::size_t i, const char* key, Value fallback) {
  return i < args.size() ? args[i] : kwarg(e, key, std::move(fallback));
}

void Renderer::scan(const std::string& s, int line, std::string_view what) {
  budget_.charge(static_cast<std::int64_t>(s.size()) / kBytesPerStep, line, what);
}

const Value* Renderer::find(const Value& obj, const std::string& key, int line, std::string_view what) {
  budget_.charge(static_cast<std::int64_t>(obj.dict->size()) / kKeysPerStep, line, what);
  return obj.find(key);
}

Value Renderer::item(const Value& obj, const Value& key, int line) {
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

Value Renderer::slice(const Value& obj, const Expr& e) {
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
  const std::uint64_t count = range_length(start, stop, step);
  List out;
  out.reserve(count);
  for (std::uint64_t k = 0; k < count; ++k)
    out.push_back((*obj.list)[static_cast<std::size_t>(start + static_cast<std::int64_t>(k) * step)]);
  return list(std::move(out), e.line, "'[:]'");
}

Value Renderer::attribute(const Value& obj, const std::string& name, int line) {
  if (obj.kind == Kind::kDict || obj.kind == Kind::kNamespace) {
    const Value* v = find(obj, name, line, "'.'");
    return v ? *v : Value{};
  }
  if (obj.undefined()) error(line, fmt::format("cannot read '{}' of an undefined value", name));
  if ((obj.kind == Kind::kList || obj.kind == Kind::kString) && !name.empty() &&
      std::isdigit(static_cast<unsigned char>(name[0]))) {
    std::int64_t i = 0;
    const auto [end, ec] = std::from_chars(name.data(), name.data() + name.size(), i);
    if (ec != std::errc() || end != name.data() + name.size()) return Value{};  // no such index
    return item(obj, Value::integer(i), line);
  }
  return Value{};
}

Value Renderer::checked(Value v, int line, std::string_view what) {
  const std::size_t n = v.list ? v.list->size() : v.dict ? v.dict->size() : 0;
  if (n > kMaxLength) error(line, fmt::format("{}: the list would have more than {} elements", what, kMaxLength));
  if (v.size > kMaxSize) error(line, fmt::format("{}: the value would be larger than {} MiB", what, kMaxSize >> 20));
  if (v.depth > kMaxDepth)
    error(line, fmt::format("{}: the value would be nested deeper than {} levels", what, kMaxDepth));
  charge_copy(v, line, what);
  auto is_namespace = [](const Value& x) { return x.kind == Kind::kNamespace; };
  if ((v.list && std::any_of(v.list->begin(), v.list->end(), is_namespace)) ||
      (v.dict && std::any_of(v.dict->begin(), v.dict->end(), [&](const auto& kv) { return is_namespace(kv.second); })))
    error(line, fmt::format("{}: a namespace() cannot be put in a list, dict or namespace", what));
  return v;
}

Value Renderer::list(List l, int line, std::string_view what) {
  return checked(Value::of_list(std::move(l)), line, what);
}

Value Renderer::dict(Dict d, int line, std::string_view what, Kind kind) {
  return checked(Value::of_dict(std::move(d), kind), line, what);
}

void Renderer::charge_copy(const Value& v, int line, std::string_view what, std::int64_t element_steps) {
  std::size_t n = 0, bytes = 0;
  if (v.list)
    for (const Value& e : *v.list) ++n, bytes += e.s.size();
  if (v.dict)
    for (const auto& [k, e] : *v.dict) ++n, bytes += k.size() + e.s.size();
  budget_.charge(static_cast<std::int64_t>(n) * element_steps + static_cast<std::int64_t>(bytes) / kBytesPerStep, line,
                 what);
}

List Renderer::iterate(const Value& v, int line, std::string_view what) {
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

}  // namespace woq::jinja::impl
