#include "quantize/quantize_request.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <tuple>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "arch/architecture.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/memory.h"
#include "formats/kquant_mix.h"
#include "io/gguf.h"
#include "io/json_file.h"
#include "io/hf_config.h"
#include "io/safetensors.h"
#include "kernels/blas.h"
#include "quantize/awq.h"
#include "quantize/gguf_export.h"
#include "quantize/gptq_calibration.h"
#include "quantize/quantize_checkpoint.h"
#include "quantize/resume.h"

namespace woq {

namespace {

// "random:NxL" -> {N, L}; throws on anything else.
std::pair<std::int64_t, std::int64_t> parse_random_calib(const std::string& spec) {
  std::int64_t count = 0, length = 0;
  const char* p = spec.data() + std::string_view("random:").size();
  const char* end = spec.data() + spec.size();
  if (spec.rfind("random:", 0) == 0) {
    auto r = std::from_chars(p, end, count);
    if (r.ec == std::errc() && r.ptr != end && (*r.ptr == 'x' || *r.ptr == '*')) {
      r = std::from_chars(r.ptr + 1, end, length);
      if (r.ec == std::errc() && r.ptr == end && count > 0 && length > 0) return {count, length};
    }
  }
  fail("--calib '{}' is not random or random:NxL with positive integers N and L (e.g. random:128x512)", spec);
}

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

void say(const QuantizeCallbacks& cb, const std::string& line) {
  if (cb.log) cb.log(line);
}

std::string peak_rss_line() {
  return fmt::format("peak RSS {:.2f} GiB", static_cast<double>(peak_rss_bytes()) / (1u << 30));
}

// The GPTQ-only choices that were given, by flag.
std::vector<const char*> given_gptq_options(const QuantizeRequest& r) {
  std::vector<const char*> out;
  if (r.damp_percent) out.push_back("--damp-percent");
  if (r.desc_act) out.push_back("--desc-act");
  if (r.static_groups) out.push_back("--static-groups");
  if (r.true_sequential) out.push_back("--true-sequential");
  if (r.block_size) out.push_back("--block-size");
  if (r.calib) out.push_back("--calib");
  if (r.calib_file) out.push_back("--calib-file");
  if (r.nsamples) out.push_back("--nsamples");
  if (r.seqlen) out.push_back("--seqlen");
  if (r.seed) out.push_back("--seed");
  return out;
}

nlohmann::ordered_json calibration_fingerprint(const Calibration& calibration) {
  std::string ids;
  for (const auto& seq : calibration) ids.append(reinterpret_cast<const char*>(seq.data()), seq.size() * sizeof(seq[0]));
  return {{"sequences", calibration.size()},
          {"tokens", calibration.empty() ? 0 : calibration.front().size()},
          {"fnv1a64", fnv1a64_hex(ids.data(), ids.size())}};
}

std::string output_format(const QuantizeRequest& r) {
  return r.format.empty() ? (is_gguf_path(r.output) ? "gguf" : "gptq") : r.format;
}

// --low-bit of a GGUF output: a llama-quantize K-quant file type (options.mix)
// or one woq format; the rounding: ggml's for ggml's block formats (K-quants,
// q4_1, q5_1), which have no other.
GgufExportOptions gguf_export_options(const QuantizeRequest& r) {
  GgufExportOptions options;
  const std::string low_bit = r.low_bit.value_or("sym_int4");
  options.mix = r.plan ? nullptr : kquant::find_mix(low_bit);
  if (r.plan) {
    options.plan = std::make_shared<QuantPlan>(read_plan(*r.plan));
  } else if (options.mix == nullptr) {
    options.type = parse_low_bit(low_bit);
    gguf_file_type(options.type);  // throws for a format GGUF has no file type for
  }
  const bool ggml_only = options.mix != nullptr || (!r.plan && is_kquant(options.type));
  options.rounding = parse_rounding(r.rounding.value_or(ggml_only ? "ggml" : "woq"));
  if (ggml_only && options.rounding != Rounding::kGgml)
    fail("--rounding {}: {} is written with ggml's rounding only (llama-quantize's bytes); omit --rounding",
         *r.rounding, options.mix ? options.mix->llama_name : low_bit);
  options.force = r.force;
  return options;
}

// --format gguf: one GGUF file (quantize/gguf_export.h).
void run_export_gguf(const QuantizeRequest& r, ThreadPool& pool, const QuantizeCallbacks& cb) {
  const GgufExportOptions options = gguf_export_options(r);
  const GgufExportReport rep = export_gguf(r.input, r.output, options, pool);
  for (const auto& note : rep.notes) say(cb, "note: " + note);
  std::vector<std::string> types;
  for (const auto& [name, count] : rep.linear_types) types.push_back(fmt::format("{} x{}", name, count));
  // fp16/bf16/fp32 have no rounding rule
  const bool rounded =
      options.mix != nullptr || options.plan != nullptr || !is_float_format(options.type);
  say(cb, fmt::format("wrote {} (GGUF {}{}; linear layers {}): tensors {:.2f} MiB -> {:.2f} MiB in {:.2f} s",
                      r.output,
                      options.mix    ? std::string(options.mix->llama_name)
                      : options.plan ? "plan " + *r.plan
                                     : r.low_bit.value_or("sym_int4"),
                      rounded ? fmt::format(", {} rounding", rounding_name(options.rounding)) : std::string(),
                      fmt::join(types, ", "), mib(rep.bytes_before), mib(rep.bytes_after), rep.seconds));
  say(cb, peak_rss_line());
}

// The calibration sequences of a calibrated method (GPTQ, AWQ): --calib random / random:NxL or --calib-file
// windows, --nsamples x --seqlen (the default length shrinks to the model's context); the memory it will take is
// said and checked first.
Calibration calibration_of(const QuantizeRequest& r, const LlamaModel& model, const LoadReport& loaded,
                           const QuantizeCallbacks& cb) {
  const std::string calib = r.calib.value_or("random");
  std::int64_t count = r.nsamples.value_or(32), length = r.seqlen.value_or(512);
  if (calib != "random") std::tie(count, length) = parse_random_calib(calib);
  // The default --seqlen 512 shrinks to a shorter context; an explicit length must fit.
  if (calib == "random" && !r.seqlen) length = std::min(length, model.context_limit());
  if (length > model.context_limit())
    fail("calibration sequences of {} tokens exceed the model's context of {} (--seqlen or --calib random:NxL)",
         length, model.context_limit());
  GptqMemory memory = gptq_memory(model.config(), count, length, loaded.other_bytes);
  const std::string method = r.method.value_or("rtn");
  if (method.starts_with("awq")) {
    // AWQ records every linear's input and the outputs of o and down for all calibration rows, keeps the block's
    // inputs for the attention reruns, and a candidate copy of the weights; Hessians only for awq+gptq.
    const ModelConfig& c = model.config();
    const auto rows = static_cast<std::uint64_t>(count * length);
    memory.activations += rows * static_cast<std::uint64_t>(4 * (5 * c.hidden_size + c.q_dim() + c.intermediate_size));
    // The search's temporaries: the MLP's gate and up products and a candidate output per row.
    memory.activations += rows * static_cast<std::uint64_t>(4 * (2 * c.intermediate_size + 2 * c.hidden_size));
    memory.block_weights *= 2;
    if (method == "awq") memory.hessians = 0;
  }
  const auto gib = [](std::uint64_t b) { return static_cast<double>(b) / (1u << 30); };
  const std::optional<std::int64_t> available = available_memory_bytes();
  say(cb, fmt::format("{} memory at its peak: about {:.2f} GiB (one decoder block in fp32 {:.2f}, calibration "
                      "activations {:.2f}, Hessians {:.2f}, embeddings and lm_head {:.2f}){}",
                      method == "gptq" ? "GPTQ" : "AWQ", gib(memory.total()),
                      gib(memory.block_weights), gib(memory.activations), gib(memory.hessians), gib(memory.resident),
                      available ? fmt::format("; {:.1f} GiB available", gib(static_cast<std::uint64_t>(*available))) : ""));
  check_gptq_memory(memory, count, length);
  const std::uint64_t seed = r.seed.value_or(0);
  Calibration calibration;
  if (!r.calib_file) {
    calibration = random_calibration(count, length, model.config().vocab_size, seed);
  } else {
    try {
      calibration = text_calibration(Tokenizer::load(r.input), read_text_file(*r.calib_file), count, length);
    } catch (const Error& e) {
      fail("--calib-file {}: {}", *r.calib_file, e.what());
    }
  }
  say(cb, fmt::format("{} calibration: {} sequences x {} tokens ({}); {}", method == "gptq" ? "GPTQ" : "AWQ",
                      count, length,
                      r.calib_file ? *r.calib_file : fmt::format("random ids, seed {}", seed), blas_description()));
  return calibration;
}

// GPTQ's settings from the request (options: the quantize options already filled).
GptqOptions gptq_options_of(const QuantizeRequest& r, const QuantizeOptions& options) {
  GptqOptions g;
  g.spec = options.spec;
  g.plan = options.plan;
  g.damp_percent = r.damp_percent.value_or(0.01);
  g.desc_act = r.desc_act.value_or(false);
  g.static_groups = r.static_groups.value_or(false);
  g.block_size = r.block_size.value_or(128);
  return g;
}

// --method awq / awq+gptq: AWQ's block quantizer, saying what each block chose.
BlockQuantizer awq_quantizer_of(const QuantizeRequest& r, QuantizeOptions& options, LlamaModel& model,
                                const TensorStore& store, Calibration calibration, ThreadPool& pool,
                                const QuantizeCallbacks& cb, nlohmann::ordered_json fingerprint,
                                std::optional<ResumeDir>& resume) {
  AwqOptions a;
  a.spec = options.spec;
  a.grid = r.awq_grid.value_or(20);
  a.clip = r.awq_clip.value_or(true);
  a.search_tokens = r.awq_search_tokens.value_or(a.search_tokens);
  a.propagate_quantized = r.awq_propagate.value_or("float") == "quantized";
  a.plan = options.plan;  // --format awq: the layers AWQ cannot pack stay float
  if (r.method == "awq+gptq") {
    a.gptq = gptq_options_of(r, options);
    a.gptq->plan = nullptr;
    options.damp_percent = a.gptq->damp_percent;
    options.desc_act = a.gptq->desc_act;
    options.static_groups = a.gptq->static_groups;
  }
  // What makes another run: AWQ's options with the GPTQ run's fingerprint (input, format, calibration, plan).
  // AWQ's settings, also recorded in the output's quantization_config.meta.woq_settings.
  options.method_settings = {{"awq_grid", a.grid},
                             {"awq_clip", a.clip},
                             {"awq_search_tokens", a.search_tokens},
                             {"awq_propagate", a.propagate_quantized ? "quantized" : "float"}};
  fingerprint["method"] = a.gptq ? "awq+gptq" : "awq";
  for (const auto& [key, value] : options.method_settings.items()) fingerprint[key] = value;
  if (!a.gptq) {
    for (const char* key : {"damp_percent", "desc_act", "static_groups", "true_sequential", "block_size"})
      fingerprint.erase(key);
  } else {
    fingerprint["block_size"] = a.gptq->block_size;
  }
  const std::int64_t layers = model.config().num_hidden_layers;
  resume.emplace(std::filesystem::absolute(r.output).lexically_normal(), fingerprint, layers, r.resume, r.force, cb.log,
                 kAwqResumeMatrices);
  say(cb, fmt::format("AWQ: scale grid {}, clipping {}, {} inputs for the next block, then {}", a.grid,
                      a.clip ? "on" : "off", a.propagate_quantized ? "quantized" : "float",
                      a.gptq ? fmt::format("GPTQ (damp_percent {}, desc_act {})", a.gptq->damp_percent, a.gptq->desc_act)
                             : std::string("round to nearest")));
  return awq_block_quantizer(model, store, std::move(calibration), a, pool, [&cb, layers](const AwqLayerReport& t) {
    std::vector<std::string> groups;
    for (const AwqScale& s : t.scales)
      groups.push_back(s.ratio < 0 ? fmt::format("{} a=none error {:.3g} (no grid point beat unscaled; {:.1f} s)",
                                                 s.group, s.loss, s.seconds)
                                   : fmt::format("{} a={:.2f} error {:.3g} (unscaled {:.3g}; {:.1f} s)", s.group,
                                                 s.ratio, s.loss, s.loss_unscaled, s.seconds));
    for (const std::string& s : t.skipped) groups.push_back("skipped " + s);
    say(cb, fmt::format("layer {}/{} AWQ: forward {:.2f} s, search {:.2f} s, clip {:.2f} s, quantize {:.2f} s; {}",
                        t.layer + 1, layers, t.forward, t.search, t.clip, t.quantize, fmt::join(groups, "; ")));
  }, &*resume);
}

}  // namespace

QuantizeRequest with_recipe(const QuantizeRequest& request) {
  QuantizeRequest r = request;
  // "OUT/" names OUT.
  while (r.output.size() > 1 && r.output.back() == '/') r.output.pop_back();
  if (!r.recipe) return r;
  if (*r.recipe != "w8a16" && *r.recipe != "w4a16") fail("--recipe '{}' is not one of: w8a16, w4a16", *r.recipe);
  if (output_format(r) != "gptq")
    fail("--recipe {} is a GPTQ recipe; it does not apply to --format {}", *r.recipe, output_format(r));
  const bool w8 = *r.recipe == "w8a16";
  if (!r.low_bit) r.low_bit = w8 ? "sym_int8" : "sym_int4";
  if (!r.group_size) r.group_size = w8 ? -1 : 128;
  if (!r.method) r.method = "gptq";
  if (*r.method == "gptq") {
    if (!r.damp_percent) r.damp_percent = 0.01;
    if (!r.desc_act) r.desc_act = !w8;
    if (!r.calib && !r.calib_file) r.calib = "random";
  }
  r.recipe.reset();
  return r;
}

void validate(const QuantizeRequest& request) {
  const QuantizeRequest r = with_recipe(request);
  const std::string method = r.method.value_or("rtn");
  const std::string format = output_format(r);
  const std::string low_bit = r.low_bit.value_or(format == "awq" ? "asym_int4" : "sym_int4");
  std::vector<const char*> given = given_gptq_options(r);
  if (r.plan && r.low_bit) fail("--plan {} sets every linear layer's format: leave out --low-bit {}", *r.plan, *r.low_bit);
  if (r.plan && kquant::find_mix(*r.plan) != nullptr)
    fail("--plan {} is llama-quantize's rule: woq quantize writes it with --low-bit {} -o FILE.gguf", *r.plan, *r.plan);
  if (r.plan && format == "gptq") {
    if (request.recipe) fail("--recipe {} sets one format for every layer; --plan {} sets each layer's", *request.recipe, *r.plan);
    if (r.group_size) fail("--group-size does not apply with --plan {}: the plan gives each layer's group size", *r.plan);
    if (r.int4_range) fail("--int4-range does not apply with --plan {}: the plan gives each layer's range", *r.plan);
    read_plan(*r.plan);  // its errors before anything runs
  }
  if (format == "gguf") {
    if (method != "rtn")
      fail("--format gguf{} writes round-to-nearest blocks; --method {} is for --format gptq or awq",
           r.format.empty() ? " (the output's .gguf name)" : "", method);
    if (r.group_size) given.push_back("--group-size");
    if (r.int4_range) given.push_back("--int4-range");
    if (r.gptq_format) given.push_back("--gptq-format");
    if (r.max_shard_gb) given.push_back("--max-shard-size");
    if (!given.empty())
      fail("{} does not apply to --format gguf (its types have fixed blocks: Q4_0 / Q8_0 group 32, K-quants "
           "super-blocks of 256)", given[0]);
    if (r.resume) fail("--resume applies to --method gptq only; a GGUF is written by round to nearest, quick to run again");
    gguf_export_options(r);
    return;
  }
  if (format != "gptq" && format != "awq") fail("--format '{}' is not one of: gptq, awq, gguf", r.format);
  if (format == "awq") {
    if (r.plan) fail("--plan {}: a plan is written as GPTQ (GPTQModel's dynamic) or GGUF; AWQ has one format", *r.plan);
    if (r.gptq_format) fail("--gptq-format applies to --format gptq");
    if (r.desc_act.value_or(false)) fail("--desc-act: an AWQ checkpoint has no g_idx, so no act order");
    const std::string awq_low_bit = r.low_bit.value_or("asym_int4");
    if (awq_low_bit != "asym_int4" && awq_low_bit != "sym_int4")
      fail("--low-bit {}: an AWQ checkpoint holds 4-bit weights with zero points: asym_int4 (AWQ's) or sym_int4", awq_low_bit);
    if (r.group_size && *r.group_size <= 0)
      fail("--group-size {}: an AWQ checkpoint needs a group size (AutoAWQ packs K / group_size groups); AWQ's usual is "
           "128", *r.group_size);
  }
  // A directory named *.gguf would be read as a GGUF file by every loading command.
  if (is_gguf_path(r.output))
    fail("{}: a GPTQ checkpoint is a directory, and a name ending in .gguf is read as a GGUF file; choose another "
         "name, or --format gguf", r.output);
  if (r.rounding) fail("--rounding applies to --format gguf only");
  if (kquant::find_mix(low_bit) != nullptr || is_kquant(parse_low_bit(low_bit)))
    fail("--low-bit {} is a GGUF block type; a GPTQ checkpoint holds sym_int4, asym_int4 or sym_int8 (write it to a "
         "file named *.gguf)", low_bit);
  parse_int4_range(r.int4_range.value_or("full"));
  if (r.int4_range && low_bit != "sym_int4")
    fail("--int4-range {} applies to sym_int4 only, not --low-bit {}", *r.int4_range, low_bit);
  if (method != "rtn" && method != "gptq" && method != "awq" && method != "awq+gptq")
    fail("--method '{}' is not one of: rtn, gptq, awq, awq+gptq", method);
  const auto calibration_flag = [](std::string_view flag) {
    return flag == "--calib" || flag == "--calib-file" || flag == "--nsamples" || flag == "--seqlen" || flag == "--seed";
  };
  if (method == "rtn" && !given.empty())
    fail("{} applies to --method {} only", given[0], calibration_flag(given[0]) ? "gptq, awq or awq+gptq" : "gptq or awq+gptq");
  if (method == "awq")
    for (const char* flag : given)
      if (!calibration_flag(flag)) fail("{} is a GPTQ option: it applies to --method gptq or awq+gptq", flag);
  if (method.starts_with("awq") && r.true_sequential)
    fail("--true-sequential does not apply to --method {}: AWQ quantizes a block's linears from the inputs it recorded "
         "in float", method);
  if ((r.awq_grid || r.awq_clip || r.awq_search_tokens || r.awq_propagate) && method != "awq" && method != "awq+gptq")
    fail("{} applies to --method awq or awq+gptq only",
         r.awq_grid ? "--awq-grid" : r.awq_clip ? "--no-clip" : r.awq_search_tokens ? "--awq-search-tokens"
                                                                                    : "--awq-propagate");
  if (r.awq_propagate && *r.awq_propagate != "quantized" && *r.awq_propagate != "float")
    fail("--awq-propagate must be quantized or float, got '{}'", *r.awq_propagate);
  if (r.awq_search_tokens && *r.awq_search_tokens < 0)
    fail("--awq-search-tokens must be 0 (all) or positive, got {}", *r.awq_search_tokens);
  if (r.awq_grid && (*r.awq_grid < 1 || *r.awq_grid > 1000)) fail("--awq-grid must be in [1, 1000], got {}", *r.awq_grid);
  if (r.resume && method == "rtn")
    fail("--resume applies to --method gptq, awq or awq+gptq only (round to nearest is quick to run again)");
  if (method.starts_with("awq") && r.plan)
    fail("--plan with --method {}: AWQ searches its scales for one format; give --low-bit and --group-size", method);
  if (r.calib && r.calib_file)
    fail("--calib and --calib-file are alternatives; give one (--calib-file uses --nsamples and --seqlen)");
  if (r.damp_percent && !(*r.damp_percent > 0 && *r.damp_percent <= 1))
    fail("--damp-percent must be in (0, 1], got {}", *r.damp_percent);
  if (r.gptq_format && *r.gptq_format != "v1" && *r.gptq_format != "v2")
    fail("--gptq-format '{}' is not one of: v1, v2", *r.gptq_format);
  if (r.max_shard_gb && !(*r.max_shard_gb > 0)) fail("--max-shard-size (GB) must be positive, got {}", *r.max_shard_gb);
  for (const auto& [value, flag] : {std::pair{&r.nsamples, "--nsamples"}, {&r.seqlen, "--seqlen"}, {&r.block_size, "--block-size"}})
    if (*value && **value <= 0) fail("{} must be > 0, got {}", flag, **value);
  if (r.group_size)
    woq::validate(QuantSpec{parse_low_bit(low_bit), *r.group_size, parse_int4_range(r.int4_range.value_or("full"))});
  if (r.calib && *r.calib != "random") {
    if (r.nsamples || r.seqlen)
      fail("{} does not apply to --calib {}: N and L are in it (random:NxL); it is for --calib random and "
           "--calib-file", r.nsamples ? "--nsamples" : "--seqlen", *r.calib);
    parse_random_calib(*r.calib);
  }
}

void run_quantize_request(const QuantizeRequest& request, ThreadPool& pool, const QuantizeCallbacks& cb) {
  validate(request);
  const QuantizeRequest r = with_recipe(request);
  const std::string method = r.method.value_or("rtn");
  const bool awq = output_format(r) == "awq";
  const std::string low_bit = r.low_bit.value_or(awq ? "asym_int4" : "sym_int4");
  remove_stale_quantize_temps(r.output, r.input, cb.log);  // also when this run is refused or stopped before writing
  require_writable_architecture(r.input, read_model_config(r.input));  // before any calibration
  if (output_format(r) == "gguf") return run_export_gguf(r, pool, cb);
  // A GGUF's Q4_0 / Q8_0 blocks are groups of 32: GPTQ keeps them exactly at that group size only.
  std::int64_t group_size = r.group_size.value_or(128);
  if (is_gguf_path(r.input) && !r.group_size &&
      TensorStore::open(r.input).get(linear_tensor(0, LinearRole::kQ)).dtype == DType::kGgml) {
    group_size = 32;
    say(cb, fmt::format("note: {}'s linear layers are ggml blocks of 32: --group-size 32 (not GPTQ's usual 128), so "
                        "that Q4_0 / Q8_0 blocks keep their integers and scales", r.input));
  }
  if (std::error_code ec; std::filesystem::exists(std::filesystem::symlink_status(r.output, ec)) && !r.force)
    fail("{}: already exists (pass --force to replace it)", r.output);  // before any calibration
  QuantizeOptions options;
  options.spec = {parse_low_bit(low_bit), group_size, parse_int4_range(r.int4_range.value_or("full"))};
  if (r.plan) {
    options.plan = std::make_shared<const QuantPlan>(read_plan(*r.plan));
    options.spec = options.plan->base;
    group_size = options.spec.group_size;
    // What GPTQ cannot hold is refused before any calibration.
    gptq_plan_config(*options.plan, read_model_config(r.input), GptqZeros::kV1, false);
  }
  if (awq) {
    require_float_checkpoint(r.input);
    // The layers AWQ's packing cannot hold stay in the input's float type (modules_to_not_convert).
    const DType dtype = TensorStore::open(r.input).get(linear_tensor(0, LinearRole::kQ)).dtype;
    const LowBit keep = dtype == DType::kF32 ? LowBit::kFp32 : dtype == DType::kBF16 ? LowBit::kBf16 : LowBit::kFp16;
    options.checkpoint = QuantizationConfig::Method::kAwq;
    options.plan = std::make_shared<const QuantPlan>(awq_plan(options.spec, read_model_config(r.input), keep));
  }
  const double damp_percent = r.damp_percent.value_or(0.01);
  const std::string gptq_format = r.gptq_format.value_or("v1");
  options.zeros = gptq_format == "v1" ? GptqZeros::kV1 : GptqZeros::kV2;
  options.max_shard_bytes = static_cast<std::uint64_t>(r.max_shard_gb.value_or(5.0) * 1e9);
  options.force = r.force;
  options.method = method;
  options.progress = cb.log;
  BlockQuantizer gptq;
  std::unique_ptr<LlamaModel> model;
  std::optional<TensorStore> store;
  std::optional<ResumeDir> resume;
  options.layer_progress = [&cb, &method](std::int64_t done, std::int64_t total) {
    if (cb.layers) cb.layers(done, total);
    if (cb.stop && cb.stop() && done < total)
      fail("stopped after decoder block {} of {}{}", done, total,
           method != "rtn" ? "; the same command with --resume continues from there" : "");
  };
  if (method != "rtn") {
    LoadReport loaded;
    model = load_for_calibration(r.input, pool, &loaded);
    store = TensorStore::open(r.input);
    Calibration calibration = calibration_of(r, *model, loaded, cb);
    options.damp_percent = damp_percent;
    options.desc_act = r.desc_act.value_or(false);
    options.static_groups = r.static_groups.value_or(false);
    options.true_sequential = r.true_sequential.value_or(false);
    const GptqOptions g = gptq_options_of(r, options);
    // What --resume checks a .OUT.partial against (AWQ adds its options).
    const nlohmann::ordered_json fingerprint = {{"input", input_fingerprint(r.input)},
                                                {"low_bit", low_bit},
                                                {"group_size", group_size},
                                                {"int4_range", r.int4_range.value_or("full")},
                                                {"gptq_format", gptq_format},
                                                {"damp_percent", damp_percent},
                                                {"desc_act", options.desc_act},
                                                {"static_groups", options.static_groups},
                                                {"true_sequential", options.true_sequential},
                                                {"block_size", g.block_size},
                                                {"calibration", calibration_fingerprint(calibration)},
                                                {"plan", options.plan ? plan_json(*options.plan) : nullptr}};
    if (method == "gptq") {
      say(cb, fmt::format("GPTQ: damp_percent {}, desc_act {}, static_groups {}, true_sequential {}, block_size {}",
                          g.damp_percent, g.desc_act, g.static_groups, options.true_sequential, g.block_size));
      const std::int64_t layers = model->config().num_hidden_layers;
      resume.emplace(std::filesystem::absolute(r.output).lexically_normal(), fingerprint, layers, r.resume, r.force,
                     cb.log);
      gptq = gptq_block_quantizer(*model, *store, std::move(calibration), g, options.true_sequential, pool,
                                  [&cb, layers](const GptqTimes& t) {
                                    say(cb, fmt::format("layer {}/{} GPTQ: read {:.2f} s, forward {:.2f} s, Hessian "
                                                        "{:.2f} s, solve {:.2f} s, save {:.2f} s", t.layer + 1, layers,
                                                        t.read, t.forward, t.hessian, t.solve, t.save));
                                  },
                                  &*resume);
    } else {
      gptq = awq_quantizer_of(r, options, *model, *store, std::move(calibration), pool, cb, fingerprint, resume);
    }
  }
  const QuantizeReport rep = quantize_checkpoint(r.input, r.output, options, pool, gptq);
  if (resume) resume->remove();
  for (const auto& note : rep.notes) say(cb, "note: " + note);
  say(cb, fmt::format("wrote {} ({}, {} {}, {}): {} linear layers{}; tensors {:.2f} MiB -> {:.2f} MiB ({:.1f} %) in "
                      "{:.2f} s",
                      r.output, awq ? "AWQ GEMM" : "GPTQ " + gptq_format, r.plan ? "plan " + *r.plan : low_bit,
                      r.plan ? fmt::format("base {}", spec_name(options.spec))
                      : group_size == -1 ? std::string("per channel") : fmt::format("group_size {}", group_size),
                      method, rep.matrices,
                      rep.kept_float > 0 ? fmt::format(" ({} kept float)", rep.kept_float) : std::string(),
                      mib(rep.bytes_before), mib(rep.bytes_after),
                      100.0 * static_cast<double>(rep.bytes_after) / static_cast<double>(rep.bytes_before), rep.seconds));
  say(cb, peak_rss_line());
}

}  // namespace woq
