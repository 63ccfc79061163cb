// The template's values (Python's None, bool, int, float, str, list, dict and
// Jinja's undefined and namespace()), and what Python does with them: truth,
// ==, repr() and str(), json.dumps().
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "jinja/budget.h"

namespace woq::jinja::impl {

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
  // What kMaxSize counts: a string's bytes; a list's or dict's keys, elements and one per element.
  std::size_t size = 0;
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
  double as_double() const {
    return kind == Kind::kFloat ? f : kind == Kind::kBool ? (b ? 1.0 : 0.0) : static_cast<double>(i);
  }
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

/// Python's name of the type of `v` ("NoneType", "str", ...), for errors.
const char* kind_name(const Value& v);

/// The context variable `name` (JSON value `j`, `depth` levels down) as a Value.
Value from_json(const nlohmann::ordered_json& j, const std::string& name, int depth = 0);

/// Python's bool(v).
bool truthy(const Value& v);

/// `v` as an integer (a bool as 0 or 1); otherwise the error "`what` must be an integer".
std::int64_t to_int(const Value& v, int line, std::string_view what);

/// len(range(start, stop, step)) for `step` not 0, without overflow.
std::uint64_t range_length(std::int64_t start, std::int64_t stop, std::int64_t step);

/// Python's repr() of a float: the shortest round trip, with ".0" on integers.
std::string float_repr(double d);

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

/// Python's repr() of `v`, appended to `out`.
void repr(const Value& v, std::string& out, const Walk& w, int depth = 0);

/// str(): what {{ }} prints.
std::string str(const Value& v, const Walk& w);

/// json.dumps(v, ensure_ascii=False, indent=indent) with Python's separators (indent -1: None, else at most kMaxSize),
/// appended to `out`; `v` is `depth` levels down.
void to_json(const Value& v, std::int64_t indent, int depth, std::string& out, const Walk& w);

/// Python's ==.
bool equal(const Value& a, const Value& b, const Walk& w, int depth = 0);

}  // namespace woq::jinja::impl
