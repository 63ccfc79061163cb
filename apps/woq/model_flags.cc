// Flags and messages shared by the commands that load a model.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>

#include <fmt/core.h>

#include "commands.h"
#include "core/utf8.h"

namespace woq::cli {

namespace {

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

}  // namespace

SamplingParams SamplingFlags::params() const {
  const SamplingParams p{temperature, top_k, top_p, seed >= 0 ? static_cast<std::uint64_t>(seed) : std::random_device{}()};
  validate(p);
  validate(penalties);
  return p;
}

void add_sampling_flags(CLI::App* cmd, SamplingFlags& f) {
  cmd->add_option("--temperature", f.temperature, "Sampling temperature; 0 = greedy")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--top-k", f.top_k, "Sample from the K most likely tokens; 0 = all")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--top-p", f.top_p, "Nucleus sampling: smallest set with probability >= P, in (0, 1]")->capture_default_str();
  cmd->add_option("--seed", f.seed, "Random seed (default: random, printed in the summary)")->check(kNonNegative);
  cmd->add_option("--repeat-penalty", f.penalties.repeat,
                  "Penalize the last --repeat-last-n tokens (prompt included), as llama.cpp: logit > 0 divided by "
                  "it, else multiplied; 1 = off")
      ->capture_default_str();
  cmd->add_option("--repeat-last-n", f.penalties.last_n, "Tokens the penalties look back over; 0 = off")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_option("--presence-penalty", f.penalties.presence,
                  "Subtracted from the logit of each token in that window (OpenAI's presence_penalty)")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", f.penalties.frequency,
                  "Subtracted per occurrence in that window (OpenAI's frequency_penalty)")
      ->capture_default_str();
}

void add_threads_flag(CLI::App* cmd, int& threads) {
  cmd->add_option("-t,--threads", threads, "Worker threads; 0 = all cores")
      ->capture_default_str()
      ->check(kNonNegative);
}

void add_model_flags(CLI::App* cmd, ModelFlags& flags) {
  cmd->add_option("--group-size", flags.group_size,
                  "Weights per scale along the input dimension (even for 4-bit types); -1 = per output channel")
      ->capture_default_str();
  cmd->add_option("--int4-range", flags.int4_range,
                  "sym_int4 range: full ([-8, 7], ggml Q4_0) or clip ([-7, 7])")
      ->capture_default_str();
  cmd->add_option("--rounding", flags.rounding,
                  "sym_int4 / sym_int8 rounding: woq (fp16-rounded scale, nearest even) or ggml (llama-quantize's "
                  "Q4_0 / Q8_0 reference rule; group size 32)")
      ->capture_default_str();
  cmd->add_option("--lm-head-low-bit", flags.lm_head_low_bit,
                  "Also convert lm_head to this format (default: keep it as stored)");
  cmd->add_option("--activations", flags.activations,
                  "What integer-format layers multiply their inputs as: int8 (quantized per block of 32, integer dot "
                  "products) or f32 (weights dequantized in the dot product: w4a16/w8a16); default: per format");
  add_threads_flag(cmd, flags.threads);
}

LoadOptions load_options(const ModelFlags& flags, const std::string& low_bit) {
  const Int4Range range = parse_int4_range(flags.int4_range);
  LoadOptions options;
  const Rounding rounding = parse_rounding(flags.rounding);
  options.linear = {parse_low_bit(low_bit), flags.group_size, range, rounding};
  validate(options.linear);
  if (!flags.lm_head_low_bit.empty()) {
    options.lm_head = QuantSpec{parse_low_bit(flags.lm_head_low_bit), flags.group_size, range, rounding};
    validate(*options.lm_head);
  }
  if (!flags.activations.empty()) options.activations = parse_activations(flags.activations);
  const bool any_int4 = options.linear.type == LowBit::kSymInt4 ||
                        (options.lm_head && options.lm_head->type == LowBit::kSymInt4);
  if (range == Int4Range::kClip && !any_int4)
    fmt::print(stderr, "woq: note: --int4-range applies to sym_int4 only; ignored for {}\n", low_bit);
  return options;
}

namespace {

void print_load_report(const LoadReport& r, const LoadOptions& options) {
  for (const auto& w : r.warnings) fmt::print(stderr, "woq: warning: {}\n", w);
  if (options.activations && r.activations.empty())
    fmt::print(stderr, "woq: warning: --activations {} has no effect: no layer is in an integer format\n",
               activations_name(*options.activations));
  if (r.linear_imported > 0)
    fmt::print(stderr,
               "woq: {} linear layers used as stored in the {} checkpoint (repacked into woq's layout in {:.2f} s, "
               "not re-quantized): {:.2f} MiB\n",
               r.linear_imported, r.imported_format, r.repack_seconds, mib(r.linear_imported_bytes));
  const std::string head = options.lm_head ? fmt::format("; lm_head -> {} ({:.2f} MiB)", describe(*options.lm_head),
                                                         mib(r.lm_head_bytes))
                                           : "";
  const std::string converted =
      r.linear_matrices > 0 ? fmt::format("{} linear layers (q/k/v/o/gate/up/down) {} -> {}: {:.2f} MiB -> {:.2f} MiB; ",
                                          r.linear_matrices, r.source_dtype, describe(options.linear),
                                          mib(r.linear_source_bytes), mib(r.linear_bytes))
                            : std::string();
  fmt::print(stderr, "woq: {}embeddings, norms{} {} ({:.2f} MiB){}; {}loaded in {:.2f} s\n", converted,
             options.lm_head ? "" : " and lm_head",
             r.other_converted ? "kept as stored or converted as the warning says" : "kept as stored", mib(r.other_bytes), head,
             r.activations.empty() ? "" : fmt::format("activations: {}; ", r.activations), r.seconds);
}

}  // namespace

std::unique_ptr<LlamaModel> load_model(const std::string& dir, const LoadOptions& options, ThreadPool& pool,
                                       LoadReport* out) {
  LoadReport report;
  auto model = LlamaModel::load(dir, options, pool, &report);
  print_load_report(report, options);
  if (out != nullptr) *out = report;
  return model;
}

std::function<void(std::int64_t, std::int64_t)> progress_bar(const char* what) {
  if (isatty(STDERR_FILENO) == 0) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  return [start, what](std::int64_t done, std::int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print(stderr, "\rwoq: {} {}/{} ({:.0f} s, ETA {:.0f} s)   {}", what, done, total, s,
               s / static_cast<double>(done) * static_cast<double>(total - done), done == total ? "\n" : "");
  };
}

std::string model_label(const std::string& path, const LoadReport& report) {
  std::filesystem::path p = std::filesystem::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();
  return fmt::format("{} [{}]", report.label, printable_text(p.filename().string(), 128));
}

void note_reference(const std::string& model_dir, const std::string& ref_dir, const LoadReport& ref_report) {
  if (ref_dir.empty()) {
    if (ref_report.prequantized())
      fmt::print(stderr,
                 "woq: note: {} is a quantized checkpoint ({}); without --ref the reference is its own integers "
                 "dequantized, so only the activations and lm_head can differ. Give the original with --ref "
                 "DIR_OR_FILE.\n",
                 model_dir, ref_report.imported_format);
    return;
  }
  std::error_code ec;
  if (std::filesystem::equivalent(model_dir, ref_dir, ec))
    fmt::print(stderr, "woq: note: --ref {} is the model itself\n", ref_dir);
  else if (ref_report.prequantized())
    fmt::print(stderr, "woq: note: the reference {} is itself quantized ({}): the figures compare with it, not with a "
               "float original\n", ref_dir, ref_report.imported_format);
}

}  // namespace woq::cli
