// A Jinja2 interpreter for the subset Hugging Face chat templates use,
// rendering as transformers' apply_chat_template does: Jinja2's
// ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the
// loopcontrols extension, raise_exception(), and a tojson filter that is
// json.dumps(ensure_ascii=False) (Jinja2's own would escape <, >, & and ').
//
// Supported (https://jinja.palletsprojects.com/en/3.1.x/templates/):
//   {{ expr }}, {% if/elif/else %}, {% for x in xs [if cond] %} with else,
//   tuple targets and loop.index/index0/revindex/revindex0/first/last/length/
//   previtem/nextitem, {% set %} (names, namespace attributes, block form),
//   {% break %}/{% continue %}, {% generation %}, {# comments #}, {%- -%}
//   whitespace control; literals, lists, dicts, tuples, attribute/item access,
//   slices, calls, arithmetic, comparisons, and/or/not, in, is-tests,
//   conditional expressions, ~ concatenation; the filters and str/dict
//   methods listed in jinja.cc; namespace(), range(), raise_exception().
// Not supported (clear error): macros, call blocks, includes, extends,
// filter blocks, custom filters.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace woq::jinja {

/// A template that failed to parse, or a rendering error. what() says where
/// (line) and why.
class TemplateError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// raise_exception(message) called by the template: what() is the message.
class RaisedException : public TemplateError {
 public:
  using TemplateError::TemplateError;
};

struct Node;

/// A parsed template. Parsing happens once; render() may be called from
/// several threads at once.
class Template {
 public:
  /// Parses `source`. Throws TemplateError for syntax errors and unsupported tags.
  explicit Template(const std::string& source);
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  /// Renders with the top-level variables of `context` (a JSON object;
  /// key order is kept for tojson and iteration). Throws RaisedException
  /// for raise_exception() and TemplateError for other errors (undefined
  /// attributes of undefined values, type errors, unknown filters).
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const Node> root_;
};

}  // namespace woq::jinja
