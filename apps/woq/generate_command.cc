// woq generate: load, quantize in memory, generate.
#include <cstdio>
#include <random>
#include <string>

#include <fmt/core.h>

#include "commands.h"
#include "core/cpu.h"
#include "core/thread_pool.h"
#include "formats/low_bit.h"
#include "generate/generate.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq::cli {

namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt;
  std::int64_t n = 128;
  float temperature = 0.8f;
  std::int32_t top_k = 40;
  float top_p = 0.95f;
  std::int64_t seed = -1;
  std::string low_bit = "sym_int4";
  std::int64_t group_size = 32;
  std::string int4_range = "full";
  int threads = 0;
};

double mib(std::uint64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

void print_load_report(const LoadReport& r, const QuantSpec& spec) {
  std::string format(low_bit_name(spec.type));
  if (is_quantized(spec.type)) {
    format += spec.group_size == -1 ? " (per channel" : fmt::format(" (group_size {}", spec.group_size);
    if (spec.type == LowBit::kSymInt4) format += fmt::format(", {} range", int4_range_name(spec.int4_range));
    format += ")";
  }
  fmt::print(stderr,
             "woq: {} linear layers (q/k/v/o/gate/up/down) {} -> {}: {:.2f} MiB -> {:.2f} MiB; "
             "embeddings, norms and lm_head kept as stored ({:.2f} MiB); loaded in {:.2f} s\n",
             r.linear_matrices, r.source_dtype, format, mib(r.linear_source_bytes), mib(r.linear_bytes),
             mib(r.other_bytes), r.seconds);
}

int run_generate(const GenerateArgs& a) {
  const QuantSpec spec{parse_low_bit(a.low_bit), a.group_size, parse_int4_range(a.int4_range)};
  ThreadPool pool(a.threads);
  LoadReport report;
  auto model = LlamaModel::load(a.model_dir, LoadOptions{spec}, pool, &report);
  print_load_report(report, spec);
  const Tokenizer tokenizer = Tokenizer::load(a.model_dir);

  GenerateOptions options;
  options.max_new_tokens = a.n;
  options.sampling = {a.temperature, a.top_k, a.top_p,
                      a.seed >= 0 ? static_cast<std::uint64_t>(a.seed) : std::random_device{}()};
  const GenerateResult r = generate(*model, tokenizer, a.prompt, options, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::fputc('\n', stdout);
  std::fflush(stdout);

  const auto prompt_n = static_cast<double>(r.prompt_ids.size());
  const auto gen_n = static_cast<double>(r.generated_ids.size());
  // The first generated token comes from the prefill pass; the decode passes produce the rest.
  const double decode_steps = r.stopped ? gen_n : gen_n - 1;
  fmt::print(stderr,
             "woq: prompt {} tokens, generated {} tokens ({}); prefill {:.1f} tok/s ({:.1f} ms), "
             "decode {:.1f} tok/s; {} threads, {} kernels, seed {}\n",
             r.prompt_ids.size(), r.generated_ids.size(), r.stopped ? "stopped at EOS" : "reached -n",
             r.prefill_seconds > 0 ? prompt_n / r.prefill_seconds : 0.0, r.prefill_seconds * 1e3,
             r.decode_seconds > 0 && decode_steps > 0 ? decode_steps / r.decode_seconds : 0.0,
             pool.size(), isa_name(active_isa()), options.sampling.seed);
  return 0;
}

}  // namespace

Run add_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate text from a prompt (streams to stdout)");
  cmd->add_option("-m,--model", args->model_dir, "Hugging Face model directory (config.json, *.safetensors, tokenizer.model)")
      ->required();
  cmd->add_option("-p,--prompt", args->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-predict", args->n, "Number of tokens to generate (not counting the prompt)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--top-k", args->top_k, "Sample from the K most likely tokens; 0 = all")->capture_default_str();
  cmd->add_option("--top-p", args->top_p, "Nucleus sampling: smallest set with probability >= P, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Random seed (default: random, printed in the summary)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--low-bit", args->low_bit,
                  "Format of the transformer blocks' linear layers: sym_int4, asym_int4, sym_int8, fp16, bf16, fp32")
      ->capture_default_str();
  cmd->add_option("--group-size", args->group_size,
                  "Weights per scale along the input dimension; -1 = per output channel")
      ->capture_default_str();
  cmd->add_option("--int4-range", args->int4_range,
                  "sym_int4 range: full ([-8, 7], ggml Q4_0) or clip ([-7, 7])")
      ->capture_default_str();
  cmd->add_option("-t,--threads", args->threads, "Worker threads; 0 = all cores")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  return [args] { return run_generate(*args); };
}

}  // namespace woq::cli
