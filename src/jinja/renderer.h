// The renderer: runs a parsed template on a context within the sandbox's
// limits. Its member functions are defined by job: statements in
// renderer.cc, expressions in eval.cc, operators in operators.cc, filters and
// tests in filters.cc, calls of globals and methods in calls.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja/budget.h"
#include "jinja/expr.h"
#include "jinja/node.h"
#include "jinja/value.h"

namespace woq::jinja::impl {

class Renderer {
 public:
  /// A render with the top-level variables of `context` (a JSON object).
  explicit Renderer(const nlohmann::ordered_json& context);

  /// Renders `nodes`, appending to `out`.
  void render(const std::vector<NodePtr>& nodes, std::string& out);

 private:
  using Scope = std::unordered_map<std::string, Value>;

  Walk walk(int line, std::string_view what) { return {budget_, line, what}; }

  // ---- renderer.cc: statements

  void render(const Node& n, std::string& out);
  // {% set %}: a variable of the innermost scope, or a namespace's attribute.
  void assign(const Node& n, Value v);
  // Sets the loop variables of `n` in `scope` to `item` (unpacked if several).
  void bind_targets(const Node& n, const Value& item, Scope& scope);
  void render_for(const Node& n, std::string& out);
  // The `items` that pass the loop filter of `n` ("for x in xs if cond").
  List filtered(const Node& n, const List& items);
  // Renders the body of loop `n` once per element of `all` (not empty), in a scope of its own.
  void iterations(const Node& n, const List& all, std::string& out);
  Value* lookup(const std::string& name);

  // ---- eval.cc: expressions, and the values they build within the limits

  // Evaluates `e`: one step, and one more per kBytesPerStep of a string result (built or copied).
  Value eval(const Expr& e);
  Value eval_node(const Expr& e);
  Value negative(const Expr& e);
  Value binary(const Expr& e);
  Value dict_display(const Expr& e);
  std::vector<Value> eval_args(const Expr& e);
  // Keyword argument `key`, or `fallback`.
  Value kwarg(const Expr& e, const char* key, Value fallback = {});
  // Positional argument i, or keyword `key`, or `fallback`.
  Value arg(const Expr& e, const std::vector<Value>& args, std::size_t i, const char* key, Value fallback = {});
  // Charges scanning string `s` (indexing it by code point, say).
  void scan(const std::string& s, int line, std::string_view what);
  // obj.find(key), charging the linear scan.
  const Value* find(const Value& obj, const std::string& key, int line, std::string_view what);
  Value item(const Value& obj, const Value& key, int line);
  Value slice(const Value& obj, const Expr& e);
  Value attribute(const Value& obj, const std::string& name, int line);
  // `v`, a list or dict the template built for `what` at `line`, if within
  // kMaxLength, kMaxSize and kMaxDepth, holding no namespace(); charges its copy.
  Value checked(Value v, int line, std::string_view what);
  Value list(List l, int line, std::string_view what);
  Value dict(Dict d, int line, std::string_view what, Kind kind = Kind::kDict);
  // Charges copying the elements of list or dict `v`, `element_steps` each, and
  // their strings' bytes (copied; lists and dicts in it are shared).
  void charge_copy(const Value& v, int line, std::string_view what, std::int64_t element_steps = kElementSteps);
  // The elements of `v` for a loop or a filter (`what`): a copy of at most kMaxLength.
  List iterate(const Value& v, int line, std::string_view what = "for");

  // ---- operators.cc

  // l op r for the arithmetic operators (+ - * / // % ** ~).
  Value arithmetic(std::string_view op, const Value& l, const Value& r, int line);
  // l + r for two strings or two lists.
  Value add_sequences(const Value& l, const Value& r, int line);
  // `n` copies of `v` (a string or list; `n` the other operand of '*').
  Value repeat(const Value& v, std::int64_t n, int line);
  // l op r for the comparisons (== != < <= > >= in, not in).
  Value compare(std::string_view op, const Value& l, const Value& r, int line);
  bool contains(const Value& container, const Value& v, int line, std::string_view what);

  // ---- filters.cc: filters and tests

  Value filter(const Expr& e);
  // Filters of strings: trim, upper, lower, title, capitalize, replace.
  Value string_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args);
  // Filters to numbers: int, float, abs.
  Value number_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args);
  // Filters of sequences: length, count, first, last, join, list, reverse, items.
  Value sequence_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args);
  // Filters of a sequence's elements by attribute: selectattr, rejectattr, map.
  Value select_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args);
  // Filters of any value: safe, default (d), string, tojson.
  Value value_filter(std::string_view f, const Expr& e, const Value& v, const std::vector<Value>& args);
  bool test(const Expr& e);
  // The Jinja test `t` ("defined", "divisibleby", ...) of `v` with arguments `args`.
  bool test(std::string_view t, const Value& v, const std::vector<Value>& args, int line);

  // ---- calls.cc: globals and methods

  Value call(const Expr& e);
  // raise_exception(), namespace(), range(), called as `e`.
  Value call_global(const Expr& e, const std::vector<Value>& args);
  Value range(const std::vector<Value>& args, int line);
  // The str method `m` of `s`, if there is one.
  std::optional<Value> string_method(std::string_view m, const std::string& s, const Expr& e,
                                     const std::vector<Value>& args);
  // s.split(sep=None, maxsplit=-1).
  Value split(const std::string& s, const Expr& e, const std::vector<Value>& args);
  // The dict method `m` of `obj`, if there is one.
  std::optional<Value> dict_method(std::string_view m, const Value& obj, const Expr& e, const std::vector<Value>& args);
  // dict.items() and |items: [key, value] pairs.
  Value items(const Value& d, int line, std::string_view what);
  // str.join and |join: `parts` printed and joined by `sep` (each part's attribute `attr` unless undefined).
  std::string join(const List& parts, const std::string& sep, const Value& attr, int line, std::string_view what);
  // str.replace and |replace: s.replace(from, to, count), a step per replacement.
  std::string replace_all(const std::string& s, const std::string& from, const std::string& to, std::int64_t count,
                          int line, std::string_view what);

  Budget budget_;
  std::vector<Scope> scopes_;
  int loop_depth_ = 0;
  int depth_ = 0;
};

}  // namespace woq::jinja::impl
