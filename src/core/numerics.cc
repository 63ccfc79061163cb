#include "core/numerics.h"

#include "core/error.h"

namespace woq {

Numerics parse_numerics(std::string_view name) {
  if (name == "woq") return Numerics::kWoq;
  if (name == "ggml") return Numerics::kGgml;
  fail("unknown numerics '{}' (expected woq or ggml)", name);
}

}  // namespace woq
