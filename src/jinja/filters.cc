#include "jinja/renderer.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <exception>
#include <utility>

#include <fmt/format.h>

#include "jinja/text.h"

namespace woq::jinja::impl {

Value Renderer::filter(const Expr& e) {
  using Group = Value (Renderer::*)(std::string_view, const Expr&, const Value&, const std::vector<Value>&);
  static constexpr std::pair<std::string_view, Group> kFilters[] = {
      {"safe", &Renderer::value_filter},        {"default", &Renderer::value_filter},
      {"d", &Renderer::value_filter},           {"string", &Renderer::value_filter},
      {"tojson", &Renderer::value_filter},      {"trim", &Renderer::string_filter},
      {"upper", &Renderer::string_filter},      {"lower", &Renderer::string_filter},
      {"title", &Renderer::string_filter},      {"capitalize", &Renderer::string_filter},
      {"replace", &Renderer::string_filter},    {"int", &Renderer::number_filter},
      {"float", &Renderer::number_filter},      {"abs", &Renderer::number_filter},
      {"length", &Renderer::sequence_filter},   {"count", &Renderer::sequence_filter},
      {"first", &Renderer::sequence_filter},    {"last", &Renderer::sequence_filter},
      {"join", &Renderer::sequence_filter},     {"list", &Renderer::sequence_filter},
      {"reverse", &Renderer::sequence_filter},  {"items", &Renderer::sequence_filter},
      {"selectattr", &Renderer::select_filter}, {"rejectattr", &Renderer::select_filter},
      {"map", &Renderer::select_filter},
  };
  const Value v = eval(*e.a);
  const std::vector<Value> args = eval_args(e);
  const std::string_view f = e.name;
  for (const auto& [name, group] : kFilters)
    if (f == name) return (this->*group)(f, e, v, args);
  error(e.line, fmt::format("unknown filter '{}'", f));
}

Value Renderer::string_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args) {
  if (f == "trim") {
    if (v.kind != Kind::kString) error(e.line, fmt::format("trim needs a string, not {}", kind_name(v)));
    const Value chars = arg(e, args, 0, "chars", Value::none());
    return Value::string(strip(v.s, chars.kind == Kind::kString ? chars.s : std::string(kWhitespace), true, true));
  }
  if (f == "replace") {
    if (v.kind != Kind::kString || args.size() < 2 || args[0].kind != Kind::kString || args[1].kind != Kind::kString)
      error(e.line, "replace needs a string and two string arguments");
    return Value::string(
        replace_all(v.s, args[0].s, args[1].s, args.size() > 2 ? to_int(args[2], e.line, "count") : -1, e.line, f));
  }
  if (v.kind != Kind::kString) error(e.line, fmt::format("{} needs a string", f));
  if (f == "title") return Value::string(title_case(v.s, false));
  if (f == "capitalize") return Value::string(title_case(v.s, true));
  return Value::string(change_case(v.s, f == "upper"));
}

Value Renderer::number_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args) {
  if (f == "int") {
    if (v.kind == Kind::kInt || v.kind == Kind::kBool) return Value::integer(to_int(v, e.line, "int"));
    if (v.kind == Kind::kFloat) {
      if (!(v.f >= -0x1p63 && v.f < 0x1p63))
        error(e.line, fmt::format("int: {} is out of the 64-bit range", float_repr(v.f)));
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
  if (v.kind == Kind::kInt) {  // abs
    if (v.i == INT64_MIN) error(e.line, fmt::format("abs: integer overflow in abs({})", v.i));
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  if (v.kind == Kind::kFloat) return Value::number(std::fabs(v.f));
  error(e.line, "abs needs a number");
}

Value Renderer::sequence_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args) {
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
    return Value::string(
        join(iterate(v, e.line, f), str(sep, walk(e.line, f)), arg(e, args, 1, "attribute", Value{}), e.line, f));
  }
  if (f == "list") return list(iterate(v, e.line, f), e.line, f);
  if (f == "reverse") {
    if (v.kind == Kind::kString) {
      scan(v.s, e.line, f);
      return Value::string(reverse_code_points(v.s));
    }
    List seq = iterate(v, e.line, f);
    std::reverse(seq.begin(), seq.end());
    return list(std::move(seq), e.line, f);
  }
  if (v.kind != Kind::kDict) error(e.line, "items needs a dict");  // items
  return items(v, e.line, f);
}

Value Renderer::select_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args) {
  List out;
  if (f == "map") {
    const Value attr = kwarg(e, "attribute");
    if (attr.undefined()) error(e.line, "map is supported with attribute= only");
    const std::string name = str(attr, walk(e.line, f));
    for (const Value& x : iterate(v, e.line, f)) {
      Value a = attribute(x, name, e.line);
      if (a.undefined()) a = kwarg(e, "default");
      out.push_back(a);
    }
    return list(std::move(out), e.line, f);
  }
  if (args.empty() || args[0].kind != Kind::kString) error(e.line, fmt::format("{} needs an attribute name", f));
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

Value Renderer::value_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args) {
  if (f == "safe") return v;
  if (f == "string") return Value::string(str(v, walk(e.line, f)));
  if (f == "tojson") {
    const Value indent = arg(e, args, 0, "indent", Value::none());
    std::string out;
    to_json(v,
            indent.kind == Kind::kNone ? -1 : std::clamp<std::int64_t>(to_int(indent, e.line, "indent"), 0, kMaxSize),
            0, out, walk(e.line, "tojson"));
    return Value::string(out);
  }
  const bool boolean = truthy(arg(e, args, 1, "boolean", Value::boolean(false)));  // default, d
  if (v.undefined() || (boolean && !truthy(v))) return arg(e, args, 0, "default_value", Value::string(""));
  return v;
}

bool Renderer::test(const Expr& e) { return test(e.name, eval(*e.a), eval_args(e), e.line); }

bool Renderer::test(std::string_view t, const Value& v, const std::vector<Value>& args, int line) {
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
  if (t == "iterable")
    return v.kind == Kind::kList || v.kind == Kind::kString || v.kind == Kind::kDict || v.undefined();
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
      if (t == "lower" ? std::isupper(static_cast<unsigned char>(c)) : std::islower(static_cast<unsigned char>(c)))
        return false;
    return true;
  }
  error(line, fmt::format("unknown test '{}'", t));
}

}  // namespace woq::jinja::impl
