#include "jinja/renderer.h"

#include <memory>
#include <utility>

#include <fmt/format.h>

namespace woq::jinja::impl {

namespace {

struct LoopControl {
  enum Type { kBreak, kContinue } type;
};

// Appends `text` to the output (or a {% set %} block's) within kMaxSize.
void emit(std::string& out, const std::string& text, int line, std::string_view what) {
  if (out.size() + text.size() > kMaxSize)
    error(line, fmt::format("{}: the output would be longer than {} MiB", what, kMaxSize >> 20));
  out += text;
}

// Sets `loop` (a new dict unless nothing else holds it) to the loop variable of iteration `i` over `all`.
void set_loop(std::shared_ptr<Dict>& loop, const List& all, std::int64_t i) {
  const auto length = static_cast<std::int64_t>(all.size());
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
}

}  // namespace

Renderer::Renderer(const nlohmann::ordered_json& context) {
  scopes_.emplace_back();
  if (context.is_object())
    for (const auto& [k, v] : context.items()) scopes_.back()[k] = from_json(v, k);
}

void Renderer::render(const std::vector<NodePtr>& nodes, std::string& out) {
  for (const NodePtr& n : nodes) render(*n, out);
}

void Renderer::render(const Node& n, std::string& out) {
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

void Renderer::assign(const Node& n, Value v) {
  if (n.targets.size() == 1) {
    scopes_.back()[n.targets[0]] = std::move(v);
    return;
  }
  Value* ns = lookup(n.targets[0]);
  if (ns == nullptr || ns->kind != Kind::kNamespace)
    error(n.line,
          fmt::format("cannot set '{}.{}': '{}' is not a namespace()", n.targets[0], n.targets[1], n.targets[0]));
  if (v.kind == Kind::kNamespace)  // no cycles, and no nesting that set could deepen unseen
    error(n.line, fmt::format("cannot set '{}.{}' to a namespace()", n.targets[0], n.targets[1]));
  for (auto& [k, val] : *ns->dict)
    if (k == n.targets[1]) {
      val = std::move(v);
      return;
    }
  ns->dict->emplace_back(n.targets[1], std::move(v));
}

void Renderer::bind_targets(const Node& n, const Value& item, Scope& scope) {
  if (n.targets.size() == 1) {
    scope[n.targets[0]] = item;
    return;
  }
  const List parts = iterate(item, n.line);
  if (parts.size() != n.targets.size())
    error(n.line, fmt::format("cannot unpack {} values into {} loop variables", parts.size(), n.targets.size()));
  for (std::size_t i = 0; i < parts.size(); ++i) scope[n.targets[i]] = parts[i];
}

void Renderer::render_for(const Node& n, std::string& out) {
  const Value seq = eval(*n.expr);
  List items;  // the elements; a list (never mutated) is iterated in place
  if (seq.kind != Kind::kList) items = iterate(seq, n.line);
  else charge_copy(seq, n.line, "for", 0);  // the loop variable's copies
  if (n.filter) items = filtered(n, seq.kind == Kind::kList ? *seq.list : items);
  const List& all = seq.kind == Kind::kList && !n.filter ? *seq.list : items;
  if (all.empty()) {
    render(n.else_body, out);
    return;
  }
  ++loop_depth_;
  scopes_.emplace_back();
  try {
    iterations(n, all, out);
  } catch (...) {
    scopes_.pop_back();
    --loop_depth_;
    throw;
  }
  scopes_.pop_back();
  --loop_depth_;
}

List Renderer::filtered(const Node& n, const List& items) {
  List kept;
  for (const Value& item : items) {
    scopes_.emplace_back();
    bind_targets(n, item, scopes_.back());
    const bool keep = truthy(eval(*n.filter));
    scopes_.pop_back();
    if (keep) kept.push_back(item);
  }
  return kept;
}

void Renderer::iterations(const Node& n, const List& all, std::string& out) {
  std::shared_ptr<Dict> loop;  // reused while no iteration kept a reference to it
  const auto length = static_cast<std::int64_t>(all.size());
  for (std::int64_t i = 0; i < length; ++i) {
    budget_.charge(kIterationSteps, n.line, "for");
    auto& scope = scopes_.back();
    if (scope.size() != n.targets.size() + 1) scope.clear();  // what the last iteration set goes
    bind_targets(n, all[static_cast<std::size_t>(i)], scope);
    Value& loop_var = scope["loop"];
    loop_var = Value{};  // the last iteration's reference
    set_loop(loop, all, i);
    loop_var = Value::of_dict(loop);
    try {
      render(n.body, out);
    } catch (const LoopControl& c) {
      if (c.type == LoopControl::kBreak) break;
    }
  }
}

Value* Renderer::lookup(const std::string& name) {
  for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
    const auto found = it->find(name);
    if (found != it->end()) return &found->second;
  }
  return nullptr;
}

}  // namespace woq::jinja::impl
