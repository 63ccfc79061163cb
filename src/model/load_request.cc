#include "model/load_request.h"

#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/utf8.h"
#include "formats/kquant.h"

namespace woq {

namespace {

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// LoadRequest::rounding: woq's when not given.
Rounding rounding_of(const LoadRequest& request) {
  return request.rounding.empty() ? Rounding::kWoq : parse_rounding(request.rounding);
}

// The options of a plan file: its base and per-layer formats, and its lm_head,
// or --lm-head-low-bit's when the plan leaves lm_head as stored.
LoadOptions plan_load_options(const LoadRequest& request) {
  LoadOptions options = load_options_of(read_plan(request.plan));
  if (!request.lm_head_low_bit.empty()) {
    if (options.lm_head)
      fail("--lm-head-low-bit {} and the plan {} (lm_head: {}) both set lm_head's format: leave one out",
           request.lm_head_low_bit, request.plan, describe(*options.lm_head));
    options.lm_head = QuantSpec{parse_low_bit(request.lm_head_low_bit), request.group_size,
                                parse_int4_range(request.int4_range), rounding_of(request)};
    validate(*options.lm_head);
  }
  if (!request.activations.empty()) options.activations = parse_activations(request.activations);
  if (!request.numerics.empty()) options.numerics = parse_numerics(request.numerics);
  return options;
}

}  // namespace

LoadOptions load_options_of(const QuantPlan& plan) {
  LoadOptions o;
  o.linear = plan.base;
  o.lm_head = plan.lm_head();
  o.activations = plan.activations;
  o.plan = std::make_shared<QuantPlan>(plan);
  return o;
}

LoadOptions parse_load_request(const LoadRequest& request, std::vector<std::string>* notes) {
  const Int4Range range = parse_int4_range(request.int4_range);
  const Rounding rounding = rounding_of(request);
  if (!request.plan.empty()) {
    if (!request.low_bit.empty())
      fail("--plan {} sets every linear layer's format: leave out --low-bit {}", request.plan, request.low_bit);
    if (kquant::find_mix(request.plan) == nullptr) return plan_load_options(request);
    LoadRequest named = request;
    named.low_bit = request.plan;
    named.plan.clear();
    return parse_load_request(named, notes);
  }
  LoadOptions options;
  options.linear_is_default = request.low_bit.empty();
  options.mix = kquant::find_mix(request.low_bit);
  const LowBit linear = options.linear_is_default ? LowBit::kSymInt4
                        : options.mix != nullptr  ? kquant::find(options.mix->base)->type
                                                  : parse_low_bit(request.low_bit);
  // ggml's block formats fix their blocks: a --group-size other than the flag's default or the block is refused.
  if (is_kquant(linear) && request.group_size != LoadRequest{}.group_size &&
      request.group_size != kquant::find(linear)->block)
    fail("--group-size {}: {}'s blocks are fixed ({} weights); leave --group-size out",
         request.group_size, options.mix ? options.mix->name : low_bit_name(linear), kquant::find(linear)->block);
  if (is_kquant(linear) && rounding != Rounding::kGgml && !request.rounding.empty())
    fail("--rounding {}: {} is quantized with ggml's rounding only (its reference quantizer); leave --rounding out",
         request.rounding, options.mix ? options.mix->name : low_bit_name(linear));
  options.linear = {linear, request.group_size, range, rounding};
  validate(options.linear);
  if (!request.lm_head_low_bit.empty()) {
    options.lm_head = QuantSpec{parse_low_bit(request.lm_head_low_bit), request.group_size, range, rounding};
    validate(*options.lm_head);
  }
  if (!request.activations.empty()) options.activations = parse_activations(request.activations);
  if (!request.numerics.empty()) options.numerics = parse_numerics(request.numerics);
  const bool any_int4 = options.linear.type == LowBit::kSymInt4 ||
                        (options.lm_head && options.lm_head->type == LowBit::kSymInt4);
  if (range == Int4Range::kClip && !any_int4 && notes != nullptr)
    notes->push_back(fmt::format("note: --int4-range applies to sym_int4 only; ignored for {}",
                                 low_bit_name(options.linear.type)));
  return options;
}

std::vector<std::string> load_summary(const LoadReport& r, const LoadOptions& options) {
  std::vector<std::string> lines;
  for (const auto& w : r.warnings) lines.push_back("warning: " + w);
  if (!options.linear_is_default && r.linear_imported > 0 && r.linear_matrices == 0 && r.linear_kept_float == 0)
    lines.push_back(fmt::format("warning: {} {} has no effect: every linear layer of this checkpoint is used as "
                                "stored ({}); it converts only layers stored in float",
                                options.mix ? "--low-bit (or --plan)" : "--low-bit",
                                options.mix ? options.mix->name : low_bit_name(options.linear.type),
                                r.imported_format));
  if (options.activations && r.activations.empty())
    lines.push_back(fmt::format("warning: --activations {} has no effect: no layer is in an integer format",
                                activations_name(*options.activations)));
  if (r.linear_imported > 0)
    lines.push_back(fmt::format("{} linear layers used as stored in the {} checkpoint (read in {:.2f} s; not "
                                "re-quantized): {:.2f} MiB",
                                r.linear_imported, r.imported_format, r.repack_seconds, mib(r.linear_imported_bytes)));
  const std::optional<QuantSpec> embeddings = options.plan ? options.plan->embeddings() : std::nullopt;
  const std::string head =
      (options.lm_head ? fmt::format("; lm_head -> {} ({:.2f} MiB)", describe(*options.lm_head), mib(r.lm_head_bytes))
                       : std::string()) +
      (embeddings ? fmt::format("; embeddings -> {} ({:.2f} MiB)", describe(*embeddings), mib(r.embeddings_bytes))
                  : std::string());
  const std::string converted =
      r.linear_matrices > 0 ? fmt::format("{} linear layers ({}) {} -> {}: {:.2f} MiB -> {:.2f} MiB; ",
                                          r.linear_matrices, fmt::join(r.converted_roles, "/"), r.source_dtype,
                                          r.conversion,
                                          mib(r.linear_source_bytes), mib(r.linear_bytes))
                            : std::string();
  if (r.linear_kept_float > 0)
    lines.push_back(fmt::format("{} float linear layers beside the quantized ones kept as stored ({:.2f} MiB), as "
                                "the file's own runtime runs them; --low-bit converts them",
                                r.linear_kept_float, mib(r.linear_kept_float_bytes)));
  const std::string kept = r.other_converted ? "kept as stored or converted as the warning says" : "kept as stored";
  const std::string others =
      r.mixed_other.empty() || options.mix == nullptr
          ? fmt::format("{}norms{} {}", embeddings ? "" : "embeddings, ", options.lm_head ? "" : " and lm_head", kept)
          : fmt::format("{} by {}'s rule, norms {}", fmt::join(r.mixed_other, ", "), options.mix->llama_name, kept);
  lines.push_back(fmt::format("{}{} ({:.2f} MiB){}; {}{}loaded in {:.2f} s", converted, others, mib(r.other_bytes),
                              head, r.activations.empty() ? "" : fmt::format("activations: {}; ", r.activations),
                              r.numerics == Numerics::kGgml ? "numerics: ggml (llama.cpp's rounding); " : "",
                              r.seconds));
  return lines;
}

std::string model_label(const std::string& path, const LoadReport& report) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return fmt::format("{} [{}]", report.label, printable_text(p.filename().string(), 128));
}

}  // namespace woq
