// woq quantize: write a GPTQ-format checkpoint.
#include <charconv>
#include <filesystem>
#include <memory>
#include <tuple>
#include <optional>
#include <string>

#include <fmt/core.h>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "bench/bench.h"
#include "io/json_file.h"
#include "io/gguf.h"
#include "io/safetensors.h"
#include "quantize/gguf_export.h"
#include "quantize/gptq_calibration.h"
#include "quantize/quantize_checkpoint.h"

namespace woq::cli {

namespace {

struct QuantizeArgs {
  std::string in_dir, out_dir;
  std::string low_bit = "sym_int4";
  std::int64_t group_size = 128;
  std::string int4_range = "full";
  std::string method = "rtn";
  std::string gptq_format = "v1";
  double max_shard_gb = 5.0;
  double damp_percent = 0.01;
  bool desc_act = false;
  bool static_groups = false;
  bool true_sequential = false;
  std::int64_t block_size = 128;
  std::string calib = "random";
  std::string calib_file;
  std::int64_t nsamples = 32;
  std::int64_t seqlen = 512;
  const CLI::Option* seqlen_flag = nullptr;
  std::uint64_t seed = 0;
  bool force = false;
  int threads = 0;
  std::string format;  ///< gptq or gguf; empty: gguf when the output ends in .gguf
  std::string rounding = "woq";
  CLI::App* cmd = nullptr;
};

// "random:NxL" -> {N, L}; throws on anything else.
std::pair<std::int64_t, std::int64_t> parse_random_calib(const std::string& spec) {
  std::int64_t count = 0, length = 0;
  const char* p = spec.data() + std::string_view("random:").size();
  const char* end = spec.data() + spec.size();
  auto r = std::from_chars(p, end, count);
  if (spec.rfind("random:", 0) == 0 && r.ec == std::errc() && r.ptr != end && (*r.ptr == 'x' || *r.ptr == '*')) {
    r = std::from_chars(r.ptr + 1, end, length);
    if (r.ec == std::errc() && r.ptr == end && count > 0 && length > 0) return {count, length};
  }
  fail("--calib '{}' is not random or random:NxL with positive integers N and L (e.g. random:128x512)", spec);
}

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// --format gguf: one GGUF file (quantize/gguf_export.h).
int run_export_gguf(const QuantizeArgs& a) {
  for (const char* flag : {"--group-size", "--int4-range", "--gptq-format", "--max-shard-size", "--damp-percent",
                           "--desc-act", "--static-groups", "--true-sequential", "--block-size", "--calib",
                           "--calib-file", "--nsamples", "--seqlen", "--seed"})
    if (a.cmd->count(flag) > 0)
      fail("{} does not apply to --format gguf (Q4_0 / Q8_0 are group 32, full range, round to nearest)", flag);
  if (a.method != "rtn") fail("--format gguf writes round-to-nearest blocks; --method {} is for --format gptq", a.method);
  GgufExportOptions options;
  options.type = parse_low_bit(a.low_bit);
  options.rounding = parse_rounding(a.rounding);
  options.force = a.force;
  ThreadPool pool(a.threads);
  const GgufExportReport r = export_gguf(a.in_dir, a.out_dir, options, pool);
  for (const auto& note : r.notes) fmt::print(stderr, "woq: note: {}\n", note);
  fmt::print(stderr, "woq: wrote {} (GGUF, {} linear layers as {}, {} rounding): tensors {:.2f} MiB -> {:.2f} MiB in {:.2f} s\n",
             a.out_dir, r.matrices, a.low_bit, a.rounding, mib(r.bytes_before), mib(r.bytes_after), r.seconds);
  fmt::print(stderr, "woq: peak RSS {:.2f} GiB\n", static_cast<double>(peak_rss_bytes()) / (1u << 30));
  return 0;
}

int run_quantize(const QuantizeArgs& a) {
  const std::string format = a.format.empty() ? (is_gguf_path(a.out_dir) ? "gguf" : "gptq") : a.format;
  if (format == "gguf") return run_export_gguf(a);
  if (format != "gptq") fail("--format '{}' is not one of: gptq, gguf", a.format);
  if (a.cmd->count("--rounding") > 0) fail("--rounding applies to --format gguf only");
  // A GGUF's Q4_0 / Q8_0 blocks are groups of 32: GPTQ keeps them exactly at that group size only.
  std::int64_t group_size = a.group_size;
  if (is_gguf_path(a.in_dir) && a.cmd->count("--group-size") == 0 &&
      TensorStore::open(a.in_dir).get("model.layers.0.self_attn.q_proj.weight").dtype == DType::kGgml) {
    group_size = 32;
    fmt::print(stderr, "woq: note: {}'s linear layers are ggml blocks of 32: --group-size 32 (not GPTQ's usual 128), "
               "so that Q4_0 / Q8_0 blocks keep their integers and scales\n", a.in_dir);
  }
  if (std::error_code ec; std::filesystem::exists(std::filesystem::symlink_status(a.out_dir, ec)) && !a.force)
    fail("{}: already exists (pass --force to replace it)", a.out_dir);  // before any calibration
  QuantizeOptions options;
  options.spec = {parse_low_bit(a.low_bit), group_size, parse_int4_range(a.int4_range)};
  if (a.method != "rtn" && a.method != "gptq") fail("--method '{}' is not one of: rtn, gptq", a.method);
  if (a.method == "rtn")
    for (const char* flag : {"--damp-percent", "--desc-act", "--static-groups", "--true-sequential", "--block-size",
                             "--calib", "--calib-file", "--nsamples", "--seqlen", "--seed"})
      if (a.cmd->count(flag) > 0) fail("{} applies to --method gptq only", flag);
  if (a.cmd->count("--calib") > 0 && a.cmd->count("--calib-file") > 0)
    fail("--calib and --calib-file are alternatives; give one (--calib-file uses --nsamples and --seqlen)");
  if (!(a.damp_percent > 0 && a.damp_percent <= 1)) fail("--damp-percent must be in (0, 1], got {}", a.damp_percent);
  if (a.gptq_format == "v1") {
    options.zeros = GptqZeros::kV1;
  } else if (a.gptq_format == "v2") {
    options.zeros = GptqZeros::kV2;
  } else {
    fail("--gptq-format '{}' is not one of: v1, v2", a.gptq_format);
  }
  if (!(a.max_shard_gb > 0)) fail("--max-shard-size must be positive, got {}", a.max_shard_gb);
  options.max_shard_bytes = static_cast<std::uint64_t>(a.max_shard_gb * 1e9);
  options.force = a.force;
  options.method = a.method;
  options.progress = [](const std::string& line) { fmt::print(stderr, "woq: {}\n", line); };
  ThreadPool pool(a.threads);
  BlockQuantizer gptq;
  std::unique_ptr<LlamaModel> model;
  std::optional<TensorStore> store;
  if (a.method == "gptq") {
    options.damp_percent = a.damp_percent;
    options.desc_act = a.desc_act;
    options.static_groups = a.static_groups;
    options.true_sequential = a.true_sequential;
    model = load_for_calibration(a.in_dir, pool);
    store = TensorStore::open(a.in_dir);
    std::int64_t count = a.nsamples, length = a.seqlen;
    if (a.calib != "random") {
      for (const char* flag : {"--nsamples", "--seqlen"})
        if (a.cmd->count(flag) > 0)
          fail("{} does not apply to --calib {}: N and L are in it (random:NxL); it is for --calib random and "
               "--calib-file", flag, a.calib);
      std::tie(count, length) = parse_random_calib(a.calib);
    }
    // The default --seqlen 512 shrinks to a shorter context; an explicit length must fit.
    if (a.calib == "random" && a.seqlen_flag->count() == 0) length = std::min(length, model->context_limit());
    if (length > model->context_limit())
      fail("calibration sequences of {} tokens exceed the model's context of {} (--seqlen or --calib random:NxL)",
           length, model->context_limit());
    check_calibration_memory(count, length, model->config().hidden_size);
    Calibration calibration;
    if (a.calib_file.empty()) {
      calibration = random_calibration(count, length, model->config().vocab_size, a.seed);
    } else {
      try {
        calibration = text_calibration(Tokenizer::load(a.in_dir), read_text_file(a.calib_file), count, length);
      } catch (const Error& e) {
        fail("--calib-file {}: {}", a.calib_file, e.what());
      }
    }
    fmt::print(stderr, "woq: GPTQ calibration: {} sequences x {} tokens ({}), damp_percent {}, desc_act {}, "
               "static_groups {}, true_sequential {}, block_size {}\n",
               count, length, a.calib_file.empty() ? fmt::format("random ids, seed {}", a.seed) : a.calib_file,
               a.damp_percent, a.desc_act, a.static_groups, a.true_sequential, a.block_size);
    GptqOptions g;
    g.spec = options.spec;
    g.damp_percent = a.damp_percent;
    g.desc_act = a.desc_act;
    g.static_groups = a.static_groups;
    g.block_size = a.block_size;
    gptq = gptq_block_quantizer(*model, *store, std::move(calibration), g, a.true_sequential, pool);
  }
  const QuantizeReport r = quantize_checkpoint(a.in_dir, a.out_dir, options, pool, gptq);
  for (const auto& note : r.notes) fmt::print(stderr, "woq: note: {}\n", note);
  fmt::print(stderr,
             "woq: wrote {} (GPTQ {}, {} {}, {}): {} linear layers; tensors {:.2f} MiB -> {:.2f} MiB ({:.1f} %) in "
             "{:.2f} s\n",
             a.out_dir, a.gptq_format, a.low_bit,
             group_size == -1 ? std::string("per channel") : fmt::format("group_size {}", group_size), a.method,
             r.matrices, mib(r.bytes_before), mib(r.bytes_after),
             100.0 * static_cast<double>(r.bytes_after) / static_cast<double>(r.bytes_before), r.seconds);
  fmt::print(stderr, "woq: peak RSS {:.2f} GiB\n", static_cast<double>(peak_rss_bytes()) / (1u << 30));
  return 0;
}

}  // namespace

Run add_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Quantize a model's linear layers and save it in GPTQ format or as GGUF");
  cmd->add_option("-m,--model", args->in_dir,
                  "Input model: Hugging Face directory (float weights; for --format gguf also GPTQ) or .gguf file")
      ->required();
  cmd->add_option("-o,--output", args->out_dir,
                  "Output directory (GPTQ) or .gguf file (must not exist unless --force)")->required();
  cmd->add_option("--format", args->format, "gptq (a Hugging Face directory) or gguf (one file llama.cpp runs); "
                  "default: gguf when --output ends in .gguf");
  cmd->add_option("--low-bit", args->low_bit, "gptq: sym_int4, asym_int4 or sym_int8; gguf: sym_int4 (Q4_0), "
                  "sym_int8 (Q8_0), fp16, bf16 or fp32")->capture_default_str();
  cmd->add_option("--rounding", args->rounding, "gguf: woq (fp16-rounded scale, nearest even: the blocks equal woq's "
                  "in-memory sym_int4/sym_int8) or ggml (llama-quantize's reference rounding, byte for byte)")
      ->capture_default_str();
  cmd->add_option("--group-size", args->group_size,
                  "Weights per scale along the input dimension (even for 4-bit types); -1 = per output channel")
      ->capture_default_str();
  cmd->add_option("--int4-range", args->int4_range,
                  "sym_int4 range: full ([-8, 7], ggml Q4_0; signed scales) or clip ([-7, 7]; positive scales)")
      ->capture_default_str();
  cmd->add_option("--method", args->method, "Quantization algorithm: rtn (round to nearest) or gptq")
      ->capture_default_str();
  cmd->add_option("--damp-percent", args->damp_percent, "GPTQ: dampening, as a fraction of mean(diag H)")
      ->capture_default_str();
  cmd->add_flag("--desc-act", args->desc_act, "GPTQ: quantize columns by decreasing activation size (act order)");
  cmd->add_flag("--static-groups", args->static_groups, "GPTQ: fit all group scales on the original weights first");
  cmd->add_flag("--true-sequential", args->true_sequential,
                "GPTQ: quantize q/k/v, o, gate/up, down in turn, each on inputs through the quantized ones");
  cmd->add_option("--block-size", args->block_size, "GPTQ: columns per lazy batch update")
      ->capture_default_str()
      ->check(kPositive);
  cmd->add_option("--calib", args->calib, "GPTQ calibration: random (--nsamples x --seqlen) or random:NxL")
      ->capture_default_str();
  cmd->add_option("--calib-file", args->calib_file, "GPTQ calibration from a text file: --nsamples windows of --seqlen tokens");
  cmd->add_option("--nsamples", args->nsamples, "GPTQ: calibration sequences")->capture_default_str()->check(kPositive);
  args->seqlen_flag = cmd->add_option("--seqlen", args->seqlen, "GPTQ: tokens per calibration sequence (default: 512, or the context when shorter)")
                          ->capture_default_str()
                          ->check(kPositive);
  cmd->add_option("--seed", args->seed, "GPTQ: seed of the random calibration tokens")->capture_default_str();
  cmd->add_option("--gptq-format", args->gptq_format,
                  "qzeros format: v1 (zero - 1, read everywhere) or v2 (the zero itself; needed when an "
                  "asym_int4 zero point is 0)")
      ->capture_default_str();
  cmd->add_option("--max-shard-size", args->max_shard_gb, "Largest safetensors shard, in GB (1e9 bytes)")
      ->capture_default_str();
  cmd->add_flag("--force", args->force, "Replace the output (directory or .gguf file) if it exists");
  add_threads_flag(cmd, args->threads);
  args->cmd = cmd;
  return [args] { return run_quantize(*args); };
}

}  // namespace woq::cli
