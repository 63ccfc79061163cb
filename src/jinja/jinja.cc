#include "jinja/jinja.h"

#include "jinja/parser.h"
#include "jinja/pieces.h"
#include "jinja/renderer.h"

namespace woq::jinja {

Template::Template(const std::string& source) : root_(impl::Parser(impl::split_pieces(source)).parse()) {}
Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(const nlohmann::ordered_json& context) const {
  std::string out;
  impl::Renderer(context).render(root_->body, out);
  return out;
}

}  // namespace woq::jinja
