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
//   conditional expressions, ~ concatenation; the filters and tests of
//   filters.cc, the str/dict methods of calls.cc; namespace(), range(),
//   raise_exception().
// Not supported (clear error): macros, call blocks, includes, extends,
// filter blocks, custom filters.
//
// Sandboxed: the template comes from a downloaded file and the messages from
// clients, so a render is bounded, and past a bound it throws TemplateError
// naming the construct and the line (limits in budget.h):
//   - integers are 64-bit: overflow of + - * ** and unary -, division or
//     modulo by zero, INT64_MIN // -1 and out-of-range literals are errors
//     (Python would switch to big integers);
//   - nesting: 512 levels for values (the input's, and those the template
//     builds or prints, compares, tojson-s), 128 for blocks and for an
//     expression's operators and brackets;
//   - 5 million steps per render, a step being about one expression node's
//     work (a loop iteration is 4, a list element built or copied 2, 64 bytes
//     of string built, copied or scanned 1): some 0.3 s;
//   - 16 MiB for the output and for any one string or list (a list's size is
//     its strings' bytes plus one per element), 1,000,000 elements for any
//     one list (range() included);
//   - a namespace() cannot be put into a list, dict or namespace (no cycles).
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

namespace impl {
struct Node;
}

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
  /// attributes of undefined values, type errors, unknown filters, the
  /// sandbox's limits, a context nested deeper than 512 levels).
  std::string render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const impl::Node> root_;
};

}  // namespace woq::jinja
