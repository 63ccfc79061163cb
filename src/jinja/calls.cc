#include "jinja/renderer.h"

#include <cstdint>
#include <utility>

#include <fmt/format.h>

#include "jinja/jinja.h"
#include "jinja/text.h"

namespace woq::jinja::impl {

Value Renderer::call(const Expr& e) {
  const Expr& callee = *e.a;
  const std::vector<Value> args = eval_args(e);
  if (callee.kind == ExprKind::kName && lookup(callee.name) == nullptr) return call_global(e, args);
  if (callee.kind != ExprKind::kAttr) error(e.line, "this value cannot be called");
  const Value obj = eval(*callee.a);
  const std::string_view m = callee.name;
  if (obj.kind == Kind::kString) {
    if (std::optional<Value> v = string_method(m, obj.s, e, args)) return std::move(*v);
  } else if (obj.kind == Kind::kDict) {
    if (std::optional<Value> v = dict_method(m, obj, e, args)) return std::move(*v);
  } else if (obj.undefined()) {
    error(e.line, fmt::format("cannot call '{}' of an undefined value", m));
  }
  error(e.line, fmt::format("'{}' object has no method '{}'", kind_name(obj), m));
}

Value Renderer::call_global(const Expr& e, const std::vector<Value>& args) {
  const std::string& name = e.a->name;
  if (name == "raise_exception")
    throw RaisedException(args.empty() ? std::string("raise_exception() called")
                                       : str(args[0], walk(e.line, "raise_exception()")));
  if (name == "namespace") {
    Dict d;
    if (!args.empty() && args[0].kind == Kind::kDict) d = *args[0].dict;
    for (const auto& [k, v] : e.kwargs) d.emplace_back(k, eval(*v));
    return dict(std::move(d), e.line, "namespace()", Kind::kNamespace);
  }
  if (name == "range") return range(args, e.line);
  error(e.line, fmt::format("'{}' is undefined", name));
}

Value Renderer::range(const std::vector<Value>& args, int line) {
  std::int64_t start = 0, stop = 0, step = 1;
  if (args.size() == 1) stop = to_int(args[0], line, "range()");
  else if (args.size() >= 2) start = to_int(args[0], line, "range()"), stop = to_int(args[1], line, "range()");
  if (args.size() == 3) step = to_int(args[2], line, "range()");
  if (args.empty() || args.size() > 3 || step == 0) error(line, "range() takes 1 to 3 integers, step not 0");
  const std::uint64_t count = range_length(start, stop, step);
  if (count > kMaxLength) error(line, fmt::format("range() is too long: {} elements (at most {})", count, kMaxLength));
  List out;
  out.reserve(count);
  for (std::uint64_t k = 0; k < count; ++k) out.push_back(Value::integer(start + static_cast<std::int64_t>(k) * step));
  return list(std::move(out), line, "range()");
}

std::optional<Value> Renderer::string_method(std::string_view m, const std::string& s, const Expr& e,
                                             const std::vector<Value>& args) {
  auto chars = [&](std::size_t i) {
    return i < args.size() && args[i].kind == Kind::kString ? args[i].s : std::string(kWhitespace);
  };
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
  if (m == "split") return split(s, e, args);
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
  if (m == "join")
    return Value::string(
        join(args.empty() ? List{} : iterate(args[0], e.line, "join()"), s, Value{}, e.line, "join()"));
  return std::nullopt;
}

Value Renderer::split(const std::string& s, const Expr& e, const std::vector<Value>& args) {
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

std::optional<Value> Renderer::dict_method(std::string_view m, const Value& obj, const Expr& e,
                                           const std::vector<Value>& args) {
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
  return std::nullopt;
}

Value Renderer::items(const Value& d, int line, std::string_view what) {
  List out;
  for (const auto& [k, val] : *d.dict) out.push_back(Value::of_list({Value::string(k), val}));
  return list(std::move(out), line, what);
}

std::string Renderer::join(const List& parts, const std::string& sep, const Value& attr, int line,
                           std::string_view what) {
  const Walk w = walk(line, what);
  std::string out;
  for (std::size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += str(attr.undefined() ? parts[i] : attribute(parts[i], str(attr, w), line), w);
    w.fits(out.size());
  }
  return out;
}

std::string Renderer::replace_all(const std::string& s, const std::string& from, const std::string& to,
                                  std::int64_t count, int line, std::string_view what) {
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

}  // namespace woq::jinja::impl
