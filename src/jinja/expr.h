// A parsed expression: the tree ExprParser builds and the Renderer evaluates.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace woq::jinja::impl {

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;

enum class ExprKind {
  kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNeg, kNot, kBinary, kAnd, kOr, kCond, kList, kDict
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;  // kName, kAttr, kFilter, kTest, kBinary (operator)
  ExprPtr a, b, c;   // operands (kSlice: object a, start b, stop c, step d in args[0])
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // kTest: "is not"
  int height = 1;        // nodes on the longest path to a leaf (evaluation recurses that deep)
};

}  // namespace woq::jinja::impl
