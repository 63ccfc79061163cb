#include "jinja/value.h"

#include <cmath>

#include "jinja/jinja.h"

namespace woq::jinja::impl {

namespace {

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

// The JSON string of `s` (json.dumps with ensure_ascii=False), appended to `out`.
void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    std::size_t j = i;  // a run of characters that need no escape, appended at once
    while (j < s.size() && s[j] != '"' && s[j] != '\\' && static_cast<unsigned char>(s[j]) >= 0x20) ++j;
    out.append(s, i, j - i);
    if (j == s.size()) break;
    const char c = s[i = j];
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
}

}  // namespace

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

Value from_json(const nlohmann::ordered_json& j, const std::string& name, int depth) {
  if (depth >= kMaxDepth && (j.is_array() || j.is_object()))
    throw TemplateError(fmt::format("chat template input: '{}' is nested deeper than {} levels", name, kMaxDepth));
  switch (j.type()) {
    case nlohmann::json::value_t::null: return Value::none();
    case nlohmann::json::value_t::boolean: return Value::boolean(j.get<bool>());
    case nlohmann::json::value_t::number_integer: return Value::integer(j.get<std::int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Value::integer(static_cast<std::int64_t>(j.get<std::uint64_t>()));
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

std::int64_t to_int(const Value& v, int line, std::string_view what) {
  if (v.kind == Kind::kInt) return v.i;
  if (v.kind == Kind::kBool) return v.b ? 1 : 0;
  error(line, fmt::format("{} must be an integer, not {}", what, kind_name(v)));
}

std::uint64_t range_length(std::int64_t start, std::int64_t stop, std::int64_t step) {
  // In unsigned arithmetic: stop - start may not fit an int64.
  const auto ustart = static_cast<std::uint64_t>(start), ustop = static_cast<std::uint64_t>(stop);
  if (step > 0 && start < stop) return (ustop - ustart - 1) / static_cast<std::uint64_t>(step) + 1;
  if (step < 0 && start > stop) return (ustart - ustop - 1) / (0 - static_cast<std::uint64_t>(step)) + 1;
  return 0;
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  std::string s = fmt::format("{}", d);
  if (s.find_first_of(".en") == std::string::npos) s += ".0";
  return s;
}

void repr(const Value& v, std::string& out, const Walk& w, int depth) {
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
    case Kind::kFloat:
      out += std::isfinite(v.f) ? float_repr(v.f) : std::isnan(v.f) ? "NaN" : v.f > 0 ? "Infinity" : "-Infinity";
      return;
    case Kind::kString:
      json_string(v.s, out);
      w.fits(out.size());
      return;
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

bool equal(const Value& a, const Value& b, const Walk& w, int depth) {
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
      return a.list->size() == b.list->size() &&
             std::equal(a.list->begin(), a.list->end(), b.list->begin(),
                        [&](const Value& x, const Value& y) { return equal(x, y, w, depth + 1); });
    case Kind::kDict: {
      if (a.dict->size() != b.dict->size()) return false;
      for (const auto& [k, v] : *a.dict) {
        // find() scans the keys.
        w.budget.charge(static_cast<std::int64_t>(b.dict->size()) / kKeysPerStep, w.line, w.what);
        const Value* o = b.find(k);
        if (o == nullptr || !equal(v, *o, w, depth + 1)) return false;
      }
      return true;
    }
    case Kind::kNamespace: return a.dict == b.dict;
    default: return false;
  }
}

}  // namespace woq::jinja::impl
