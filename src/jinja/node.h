// A parsed template: a tree of text, {{ }} outputs and {% %} blocks.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/expr.h"

namespace woq::jinja::impl {

enum class NodeKind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kBreak, kContinue, kBody };

struct Node {
  NodeKind kind = NodeKind::kBody;
  int line = 0;
  std::string text;  // kText
  ExprPtr expr;      // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprPtr, std::vector<std::shared_ptr<const Node>>>> branches;  // kIf (null cond = else)
  std::vector<std::string> targets;  // kFor loop variables; kSet/kSetBlock: name or {ns, attr}
  ExprPtr filter;                    // kFor "if" condition
  std::vector<std::shared_ptr<const Node>> body, else_body;
};

using NodePtr = std::shared_ptr<const Node>;

}  // namespace woq::jinja::impl
