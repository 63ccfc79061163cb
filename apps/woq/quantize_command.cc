// woq quantize: write a GPTQ-format checkpoint.
#include <string>

#include <fmt/core.h>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
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
  bool force = false;
  int threads = 0;
};

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

int run_quantize(const QuantizeArgs& a) {
  QuantizeOptions options;
  options.spec = {parse_low_bit(a.low_bit), a.group_size, parse_int4_range(a.int4_range)};
  if (a.method != "rtn") fail("--method '{}' is not supported (available: rtn)", a.method);
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
  const QuantizeReport r = quantize_checkpoint(a.in_dir, a.out_dir, options, pool);
  for (const auto& note : r.notes) fmt::print(stderr, "woq: note: {}\n", note);
  fmt::print(stderr,
             "woq: wrote {} (GPTQ {}, {} {}, {}): {} linear layers; tensors {:.2f} MiB -> {:.2f} MiB ({:.1f} %) in "
             "{:.2f} s\n",
             a.out_dir, a.gptq_format, a.low_bit,
             a.group_size == -1 ? std::string("per channel") : fmt::format("group_size {}", a.group_size), a.method,
             r.matrices, mib(r.bytes_before), mib(r.bytes_after),
             100.0 * static_cast<double>(r.bytes_after) / static_cast<double>(r.bytes_before), r.seconds);
  return 0;
}

}  // namespace

Run add_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Quantize a Hugging Face checkpoint's linear layers and save it in GPTQ format");
  cmd->add_option("-m,--model", args->in_dir, "Input model directory (Hugging Face format, float weights)")
      ->required();
  cmd->add_option("-o,--output", args->out_dir, "Output directory (must not exist unless --force)")->required();
  cmd->add_option("--low-bit", args->low_bit, "sym_int4, asym_int4 or sym_int8")->capture_default_str();
  cmd->add_option("--group-size", args->group_size,
                  "Weights per scale along the input dimension (even for 4-bit types); -1 = per output channel")
      ->capture_default_str();
  cmd->add_option("--int4-range", args->int4_range,
                  "sym_int4 range: full ([-8, 7], ggml Q4_0; signed scales) or clip ([-7, 7]; positive scales)")
      ->capture_default_str();
  cmd->add_option("--method", args->method, "Quantization algorithm: rtn (round to nearest)")->capture_default_str();
  cmd->add_option("--gptq-format", args->gptq_format,
                  "qzeros format: v1 (zero - 1, read everywhere) or v2 (the zero itself; needed when an "
                  "asym_int4 zero point is 0)")
      ->capture_default_str();
  cmd->add_option("--max-shard-size", args->max_shard_gb, "Largest safetensors shard, in GB (1e9 bytes)")
      ->capture_default_str();
  cmd->add_flag("--force", args->force, "Replace the output directory if it exists");
  cmd->add_option("-t,--threads", args->threads, "Worker threads; 0 = all cores")
      ->capture_default_str()
      ->check(kNonNegative);
  return [args] { return run_quantize(*args); };
}

}  // namespace woq::cli
