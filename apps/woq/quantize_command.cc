// woq quantize: write a GPTQ-format checkpoint.
#include <malloc.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <memory>
#include <optional>
#include <string>

#include <fmt/core.h>

#include "commands.h"
#include "core/thread_pool.h"
#include "quantize/plan_request.h"
#include "quantize/quantize_request.h"

namespace woq::cli {

namespace {

struct QuantizeArgs {
  QuantizeRequest request;
  // The flags' values; copied into `request` only when given (unset = the library's default).
  std::int64_t group_size = 128;
  std::string low_bit = "sym_int4", method = "rtn", recipe;
  std::string int4_range = "full", rounding = "woq", gptq_format = "v1", calib = "random", calib_file;
  double max_shard_gb = 5.0, damp_percent = 0.01;
  bool desc_act = false, static_groups = false, true_sequential = false;
  std::int64_t block_size = 128, nsamples = 32, seqlen = 512;
  std::uint64_t seed = 0;
  int threads = 0;
  int awq_grid = 20;
  std::int64_t awq_search_tokens = 512;
  std::string awq_propagate = "float";
  bool no_clip = false;
  // Plan search (--measure / --target-kl / --target-bpw).
  bool measure = false;
  double target_kl = 0, target_bpw = 0;
  std::string measurement, verify_file, candidates = "all", plan;
  int refine = 3;
  bool estimate = false;
  std::int64_t estimate_rows = kEstimateRows;
  CLI::App* cmd = nullptr;
};

// Set by the first Ctrl-C: the run stops after the decoder block in progress (a second one stops it at once).
std::atomic<bool> stop_requested{false};

extern "C" void on_sigint(int) {
  stop_requested = true;
  std::signal(SIGINT, SIG_DFL);
  constexpr char kSay[] = "\nwoq: stopping after this decoder block (Ctrl-C again stops at once)\n";
  [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kSay, sizeof kSay - 1);
}

// The value of `flag` when it was given, else unset.
template <class T>
std::optional<T> given(const CLI::App* cmd, const char* flag, const T& value) {
  return cmd->count(flag) > 0 ? std::optional<T>(value) : std::nullopt;
}

// --measure / --target-kl / --target-bpw: a plan (or a measurement) instead of a checkpoint.
int run_plan_search(const QuantizeArgs& a) {
  const CLI::App* c = a.cmd;
  for (const char* flag : {"--low-bit", "--group-size", "--method", "--recipe", "--format", "--int4-range", "--rounding",
                           "--calib", "--gptq-format", "--max-shard-size", "--damp-percent", "--desc-act",
                           "--static-groups", "--true-sequential", "--block-size", "--seed", "--resume", "--plan",
                           "--awq-grid", "--no-clip", "--awq-search-tokens", "--awq-propagate"})
    if (c->count(flag) > 0) fail("{} does not apply to a plan search (--measure / --target-kl / --target-bpw)", flag);
  PlanRequest p;
  p.input = a.request.input;
  p.output = a.request.output;
  p.force = a.request.force;
  p.measure_only = a.measure;
  if (c->count("--target-kl") > 0) p.target_kl = a.target_kl;
  if (c->count("--target-bpw") > 0) p.target_bpw = a.target_bpw;
  p.measurement = a.measurement;
  p.calib_file = a.calib_file;
  p.verify_file = a.verify_file;
  if (c->count("--seqlen") > 0) p.ctx = a.seqlen;
  if (c->count("--nsamples") > 0) p.chunks = a.nsamples;
  p.refine = a.refine;
  p.candidates = a.candidates;
  p.estimate = a.estimate;
  p.estimate_rows = given(c, "--estimate-rows", a.estimate_rows);
  ThreadPool pool(a.threads);
  run_plan_request(p, pool, [](const std::string& line) { fmt::print(stderr, "woq: {}\n", line); });
  return 0;
}

int run_quantize(QuantizeArgs& a) {
  QuantizeRequest& r = a.request;
  const CLI::App* c = a.cmd;
  if (a.measure || c->count("--target-kl") > 0 || c->count("--target-bpw") > 0) return run_plan_search(a);
  r.plan = given(c, "--plan", a.plan);
  for (const char* flag : {"--measurement", "--verify-file", "--refine", "--candidates", "--estimate", "--estimate-rows"})
    if (c->count(flag) > 0) fail("{} belongs to a plan search: give --measure, --target-kl or --target-bpw", flag);
  r.recipe = given(c, "--recipe", a.recipe);
  r.low_bit = given(c, "--low-bit", a.low_bit);
  r.method = given(c, "--method", a.method);
  r.group_size = given(c, "--group-size", a.group_size);
  r.int4_range = given(c, "--int4-range", a.int4_range);
  r.rounding = given(c, "--rounding", a.rounding);
  r.gptq_format = given(c, "--gptq-format", a.gptq_format);
  r.max_shard_gb = given(c, "--max-shard-size", a.max_shard_gb);
  r.damp_percent = given(c, "--damp-percent", a.damp_percent);
  r.desc_act = given(c, "--desc-act", a.desc_act);
  r.static_groups = given(c, "--static-groups", a.static_groups);
  r.true_sequential = given(c, "--true-sequential", a.true_sequential);
  r.block_size = given(c, "--block-size", a.block_size);
  r.calib = given(c, "--calib", a.calib);
  r.calib_file = given(c, "--calib-file", a.calib_file);
  r.nsamples = given(c, "--nsamples", a.nsamples);
  r.seqlen = given(c, "--seqlen", a.seqlen);
  r.seed = given(c, "--seed", a.seed);
  r.awq_grid = given(c, "--awq-grid", a.awq_grid);
  r.awq_search_tokens = given(c, "--awq-search-tokens", a.awq_search_tokens);
  r.awq_propagate = given(c, "--awq-propagate", a.awq_propagate);
  if (a.no_clip) r.awq_clip = false;
  // GPTQ's and AWQ's blocks allocate and free buffers of up to tens of MiB per candidate and linear: keep freed
  // memory in the heap for the next one (glibc would map each afresh, or return the heap's top, and fault its
  // pages in and zero them again on this thread: 1.3 s of a 7B preset's AWQ layer, the same bytes written).
  mallopt(M_MMAP_THRESHOLD, 32 << 20);   // glibc's largest
  mallopt(M_TRIM_THRESHOLD, 512 << 20);  // return the heap's free top beyond 512 MiB only
  ThreadPool pool(a.threads);
  std::signal(SIGINT, on_sigint);
  run_quantize_request(r, pool, {[](const std::string& line) { fmt::print(stderr, "woq: {}\n", line); }, nullptr,
                                 [] { return stop_requested.load(); }});
  return 0;
}

}  // namespace

Run add_quantize(CLI::App& app) {
  auto args = std::make_shared<QuantizeArgs>();
  QuantizeRequest& r = args->request;
  CLI::App* cmd = app.add_subcommand(
      "quantize", "Quantize a model's linear layers and save it in GPTQ or AWQ format or as GGUF");
  cmd->add_option("-m,--model", r.input,
                  "Input model: Hugging Face directory (float weights; for --format gguf also GPTQ) or .gguf file")
      ->required();
  cmd->add_option("-o,--output", r.output,
                  "Output directory (GPTQ, AWQ) or .gguf file (must not exist unless --force)")->required();
  cmd->add_option("--format", r.format, "gptq (a Hugging Face directory), awq (one in AutoAWQ's GEMM layout: "
                  "asym_int4 by default, group size 128) or gguf (one file llama.cpp runs); "
                  "default: gguf when --output ends in .gguf");
  cmd->add_option("--low-bit", args->low_bit, "gptq: sym_int4 (default), asym_int4 or sym_int8; awq: asym_int4 (its default) or sym_int4; "
                  "gguf: sym_int4 (Q4_0), "
                  "sym_int8 (Q8_0), q4_1, q5_1, fp16, bf16, fp32, or llama-quantize's K-quant file types q2_k, q3_k_s, q3_k_m, "
                  "q3_k_l, q4_k_s, q4_k_m, q5_k_s, q5_k_m, q6_k (its bytes, tensor by tensor)");
  cmd->add_option("--rounding", args->rounding, "gguf: woq (the default for sym_int4/sym_int8; fp16-rounded scale, nearest even: the blocks equal woq's "
                  "in-memory sym_int4/sym_int8) or ggml (llama-quantize's reference rounding, byte for byte; the only one for "
                  "K-quant types, q4_1 and q5_1)");
  cmd->add_option("--group-size", args->group_size,
                  "Weights per scale along the input dimension (even for 4-bit types); -1 = per output channel")
      ->capture_default_str();
  cmd->add_option("--int4-range", args->int4_range,
                  "sym_int4 range: full ([-8, 7], ggml Q4_0; signed scales) or clip ([-7, 7]; positive scales)")
      ->capture_default_str();
  cmd->add_option("--method", args->method,
                  "Quantization algorithm: rtn (round to nearest), gptq, awq (activation-aware scales folded into the "
                  "norms and preceding linears, clipping, then round to nearest) or awq+gptq (AWQ's scales and "
                  "clipping, then GPTQ)")
      ->capture_default_str();
  cmd->add_option("--awq-grid", args->awq_grid, "AWQ: scale exponents searched per group (0, 1/N, ..., (N-1)/N)")
      ->capture_default_str();
  cmd->add_option("--awq-search-tokens", args->awq_search_tokens,
                  "AWQ: calibration tokens each scale search measures its loss on, evenly spaced (q/k/v: whole "
                  "sequences); 0: all")
      ->capture_default_str();
  cmd->add_option("--awq-propagate", args->awq_propagate,
                  "AWQ: the next decoder block's calibration inputs: this block's float outputs (AutoAWQ's order) "
                  "or its outputs as quantized (as GPTQ's; one more forward per block)")
      ->capture_default_str();
  cmd->add_flag("--no-clip", args->no_clip, "AWQ: skip the weight-clipping search");
  cmd->add_option("--damp-percent", args->damp_percent, "GPTQ, awq+gptq: dampening, as a fraction of mean(diag H)")
      ->capture_default_str();
  cmd->add_flag("--desc-act", args->desc_act, "GPTQ, awq+gptq: quantize columns by decreasing activation size (act order)");
  cmd->add_flag("--static-groups", args->static_groups, "GPTQ, awq+gptq: fit all group scales on the original weights first");
  cmd->add_flag("--true-sequential", args->true_sequential,
                "GPTQ: quantize q/k/v, o, gate/up, down in turn, each on inputs through the quantized ones");
  cmd->add_option("--block-size", args->block_size, "GPTQ, awq+gptq: columns per lazy batch update")
      ->capture_default_str()
      ->check(kPositive);
  cmd->add_option("--calib", args->calib, "GPTQ / AWQ calibration: random (--nsamples x --seqlen) or random:NxL")
      ->capture_default_str();
  cmd->add_option("--calib-file", args->calib_file, "Calibration text (GPTQ, AWQ: --nsamples windows of --seqlen tokens; plan search: at most --nsamples chunks of --seqlen tokens, default 16 x 128, each scored on its second half)");
  cmd->add_option("--nsamples", args->nsamples, "GPTQ / AWQ: calibration sequences")->capture_default_str()->check(kPositive);
  cmd->add_option("--seqlen", args->seqlen, "GPTQ / AWQ: tokens per calibration sequence (default: 512, or the context when shorter)")
                          ->capture_default_str()
                          ->check(kPositive);
  cmd->add_option("--seed", args->seed, "GPTQ / AWQ: seed of the random calibration tokens")->capture_default_str();
  cmd->add_option("--gptq-format", args->gptq_format,
                  "qzeros format: v1 (zero - 1, read everywhere) or v2 (the zero itself; needed when an "
                  "asym_int4 zero point is 0)")
      ->capture_default_str();
  cmd->add_option("--max-shard-size", args->max_shard_gb, "Largest safetensors shard, in GB (1e9 bytes)")
      ->capture_default_str();
  cmd->add_option("--recipe", args->recipe,
                  "A model card's recipe for the options not given: w8a16 (gptq, sym_int8 per channel, damp_percent "
                  "0.01, no desc_act, random tokens: Neural Magic's Llama-2-7b w8a16) or w4a16 (gptq, sym_int4 "
                  "group_size 128, desc_act)");
  cmd->add_flag("--resume", r.resume,
                "GPTQ and AWQ: continue an interrupted run on this output (same input, options and calibration) from its "
                "last finished decoder block, kept in .OUTPUT.partial beside it");
  cmd->add_flag("--measure", args->measure,
                "Plan search: measure each linear layer's KL contribution per candidate format on --calib-file text "
                "(an untied model's lm_head and input embeddings too) and write the measurement (JSON) to --output");
  cmd->add_option("--target-kl", args->target_kl,
                  "Plan search: write to --output (JSON) the plan of fewest bytes whose mean KL (nats per token) on "
                  "--verify-file text (required) is at most this; measured first unless --measurement is given")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--target-bpw", args->target_bpw,
                  "Plan search: the plan of least predicted KL within this many bits per weight (embeddings and "
                  "lm_head counted), verified on --verify-file text (required)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--measurement", args->measurement, "Plan search: solve from this saved --measure output");
  cmd->add_option("--candidates", args->candidates,
                  "Plan search: the formats --measure tries: all (fp16, sym_int8, sym_int4 / asym_int4 at several "
                  "group sizes, K-quants) or gguf (fp16, Q8_0, Q4_0, K-quants: a plan --plan can write as GGUF)")
      ->capture_default_str();
  cmd->add_flag("--estimate", args->estimate,
                "Plan search: measure one candidate's KL per layer and scale the others' by their output error on "
                "the layer's calibration inputs (one forward pass per linear layer instead of one per linear layer and candidate)");
  cmd->add_option("--estimate-rows", args->estimate_rows,
                  "Plan search, --estimate: calibration rows the output errors are taken on (one from each of that many "
                  "equal stretches of all chunks' tokens); 0: all (the KL is always measured on every scored position)")
      ->capture_default_str();
  cmd->add_option("--plan", args->plan,
                  "Write each linear layer in its format from this plan file (GGUF output: Q4_0 = sym_int4 g32, "
                  "Q8_0 = sym_int8 g32, K-quants, fp16; measure with --candidates gguf)");
  cmd->add_option("--verify-file", args->verify_file,
                  "Plan search: held-out text the plan is verified on (predicted against measured KL)");
  cmd->add_option("--refine", args->refine,
                  "Plan search: re-solves with a tighter target when the measured KL misses --target-kl")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_flag("--force", r.force, "Replace the output (directory or .gguf file) if it exists");
  add_threads_flag(cmd, args->threads);
  args->cmd = cmd;
  return [args] { return run_quantize(*args); };
}

}  // namespace woq::cli
