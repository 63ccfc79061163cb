#include "jinja/budget.h"

#include <fmt/format.h>

#include "jinja/jinja.h"

namespace woq::jinja::impl {

void error(int line, const std::string& what) {
  throw TemplateError(fmt::format("chat template line {}: {}", line, what));
}

void room(std::size_t n, std::size_t limit, int line, std::string_view what) {
  if (n > limit)
    error(line, limit == kMaxSize ? fmt::format("{}: the string would be longer than {} MiB", what, kMaxSize >> 20)
                                  : fmt::format("{}: the list would have more than {} elements", what, kMaxLength));
}

void Budget::exhausted(int line, std::string_view what) {
  error(line, fmt::format("{}: the template ran more than {} steps", what, kMaxSteps));
}

}  // namespace woq::jinja::impl
