// woq bench: llama-bench-style pp/tg throughput against the memory roofline.
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "commands.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/memory.h"
#include "core/thread_pool.h"

namespace woq::cli {

namespace {

struct BenchArgs {
  std::string model_dir;
  std::int64_t n_prompt = 512;
  std::int64_t n_gen = 128;
  std::vector<int> threads = {0};
  int reps = 3;
  std::vector<std::string> low_bits = {""};  // "": the default (sym_int4; a quantized file's layers as stored)
  ModelFlags model;
  bool json = false;
  bool by_format = false;
};

// "1.173 GB", "262.4 KB": decimal units, as GB/s is.
std::string bytes_str(std::uint64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.3f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} KB", b / 1e3);
}

// One measured test: pp (prefill) or tg (decode) of one format at one thread count.
struct Row {
  std::string low_bit;
  std::string activations;  // LoadReport::activations: "sym_int8 int16"; empty for float formats
  int threads;
  bool is_pp;
  Stat ts;
  double latency_ms;  // pp: the whole prefill (time to first token); tg: one decode step
  std::uint64_t bytes_per_token;
  double read_bw;
  bool in_cache;  // the weights read per token fit in the last-level cache: no share of memory bandwidth
  std::uint64_t peak_rss;
  double gbps() const { return ts.mean * static_cast<double>(bytes_per_token) / 1e9; }  // weight bytes read per second
};

nlohmann::json or_null(bool applies, double value) { return applies ? nlohmann::json(value) : nlohmann::json(nullptr); }

void print_json_line(const Row& row, const BenchArgs& a) {
  const double gbps = row.gbps();
  const nlohmann::ordered_json j = {
      {"test", row.is_pp ? fmt::format("pp{}", a.n_prompt) : fmt::format("tg{}", a.n_gen)},
      {"n_prompt", row.is_pp ? a.n_prompt : 0},
      {"n_gen", row.is_pp ? 0 : a.n_gen},
      {"n_threads", row.threads},
      {"avg_ts", row.ts.mean},
      {"stddev_ts", or_null(a.reps > 1, row.ts.stddev)},
      {"low_bit", row.low_bit},
      {"activations", row.activations.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.activations)},
      {"isa", isa_name(active_isa())},
      {"bytes_per_token", row.is_pp ? nlohmann::json(nullptr) : nlohmann::json(row.bytes_per_token)},
      {"gbps", or_null(!row.is_pp, gbps)},
      {"bw_fraction", or_null(!row.is_pp && !row.in_cache, gbps * 1e9 / row.read_bw)},
      {"in_cache", row.is_pp ? nlohmann::json(nullptr) : nlohmann::json(row.in_cache)},
      {"read_bw_gbps", row.read_bw / 1e9},
      {"first_token_ms", or_null(row.is_pp, row.latency_ms)},
      {"next_token_ms", or_null(!row.is_pp, row.latency_ms)},
      {"peak_rss_bytes", row.peak_rss}};
  fmt::print("{}\n", j.dump());
}

void print_table_row(const Row& row, const BenchArgs& a) {
  const double gbps = row.gbps();
  fmt::print("| {} | {} | {} | {:.2f}{} | {} | {} | {} | {} | {} |\n", row.low_bit, row.threads,
             row.is_pp ? fmt::format("pp{}", a.n_prompt) : fmt::format("tg{}", a.n_gen), row.ts.mean,
             a.reps > 1 ? fmt::format(" ± {:.2f}", row.ts.stddev) : std::string(),
             row.is_pp ? fmt::format("{:.1f}", row.latency_ms) : "-",
             row.is_pp ? "-" : fmt::format("{:.2f}", row.latency_ms), row.is_pp ? "-" : bytes_str(row.bytes_per_token),
             row.is_pp ? "-" : fmt::format("{:.1f}", gbps),
             row.is_pp      ? "-"
             : row.in_cache ? "in cache"
                            : fmt::format("{:.0f} %", 100 * gbps * 1e9 / row.read_bw));
}

// --by-format: one decode step's GEMVs per weight format of one model at one thread count, beside its tg row.
struct ByFormat {
  std::string low_bit;
  int threads;
  double next_token_ms;
  double read_bw;
  std::optional<std::int64_t> llc;  // last-level cache bytes, when known
  std::vector<FormatShare> parts;
};

void print_by_format(const ByFormat& b, bool json) {
  double total = 0;
  for (const FormatShare& p : b.parts) total += p.seconds;
  for (const FormatShare& p : b.parts) {
    const double gbps = static_cast<double>(p.bytes) / p.seconds / 1e9;
    // A part is timed alone, pass after pass: one that fits the last-level cache is read from it.
    const bool in_cache = b.llc && p.bytes <= static_cast<std::uint64_t>(*b.llc);
    if (json) {
      const nlohmann::ordered_json j = {{"test", "tg_by_format"},
                                        {"low_bit", b.low_bit},
                                        {"n_threads", b.threads},
                                        {"format", p.format},
                                        {"matrices", p.matrices},
                                        {"bytes_per_token", p.bytes},
                                        {"ms_per_token", p.seconds * 1e3},
                                        {"gbps", gbps},
                                        {"bw_fraction", or_null(!in_cache, gbps * 1e9 / b.read_bw)},
                                        {"in_cache", in_cache},
                                        {"share_of_next_token", p.seconds * 1e3 / b.next_token_ms}};
      fmt::print("{}\n", j.dump());
    } else {
      fmt::print("| {} | {} | {} | {:.3f} | {:.1f} | {} | {:.0f} % |\n", p.format, p.matrices, bytes_str(p.bytes),
                 p.seconds * 1e3, gbps, in_cache ? "in cache" : fmt::format("{:.0f} %", 100 * gbps * 1e9 / b.read_bw),
                 100 * p.seconds * 1e3 / b.next_token_ms);
    }
  }
  if (!json)
    fmt::print("(the formats' GEMVs {:.3f} ms against the {:.3f} ms next-token time, {:.0f} %; the rest is "
               "attention, norms, RoPE, activations' quantization and sampling. Each matrix is timed alone here, "
               "while decode runs q/k/v and gate/up as one pass over a shared input: with several threads the "
               "sum can exceed the step)\n",
               total * 1e3, b.next_token_ms, 100 * total * 1e3 / b.next_token_ms);
}

int run_bench_command(const BenchArgs& a) {
  if (a.by_format && a.n_gen == 0) fail("--by-format times a decode step's GEMVs beside the tg test: it needs -n > 0");
  // Every format's options parsed (and refused if bad) before the bandwidth measurement and the table start.
  std::vector<LoadOptions> formats;
  for (const auto& low_bit : a.low_bits) formats.push_back(load_options(a.model, low_bit));
  std::map<int, double> bandwidth;  // threads -> bytes/s
  std::vector<int> threads;
  for (const int t : a.threads) threads.push_back(t > 0 ? t : ThreadPool(0).size());
  for (const int t : threads) {
    if (bandwidth.count(t)) continue;
    bandwidth[t] = measure_read_bandwidth(t);
    fmt::print(stderr, "woq: memory read bandwidth, {} thread{}: {:.1f} GB/s\n", t, t > 1 ? "s" : "",
               bandwidth[t] / 1e9);
  }
  const std::optional<std::int64_t> llc = last_level_cache_bytes();
  if (!a.json) {
    fmt::print("| low_bit | threads | test | t/s | first token ms | next token ms | bytes/token | GB/s | % of read BW |\n");
    fmt::print("|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
    std::fflush(stdout);
  }
  // Each row is printed (and flushed) as soon as it is measured, as llama-bench does.
  auto emit = [&](const Row& row) {
    a.json ? print_json_line(row, a) : print_table_row(row, a);
    std::fflush(stdout);
  };
  std::vector<ByFormat> by_format;
  for (std::size_t f = 0; f < a.low_bits.size(); ++f) {
    const LoadOptions& options = formats[f];
    const ModelSession session =
        open_scoring_session(a.model_dir, options, std::make_shared<ThreadPool>(0), ModelSession::Parts::kConfigOnly);
    LlamaModel* const model = session.model.get();  // loaded once per format
    const LoadReport& report = session.report;
    const std::string label = report.low_bit;  // what the linears are (a GGUF's own types, not --low-bit)
    const std::uint64_t bpt = model->weight_bytes_per_token();
    const bool in_cache = llc && bpt <= static_cast<std::uint64_t>(*llc);
    for (const int t : threads) {
      ThreadPool pool(t);
      model->set_thread_pool(pool);
      if (a.n_prompt > 0) {
        const BenchResult r = run_bench(*model, a.n_prompt, 0, a.reps);
        emit({label, report.activations, t, true, mean_stddev(r.pp_tokens_per_s), r.first_token_ms, bpt, bandwidth[t], in_cache,
              peak_rss_bytes()});
      }
      if (a.n_gen > 0) {
        const BenchResult r = run_bench(*model, 0, a.n_gen, a.reps);
        emit({label, report.activations, t, false, mean_stddev(r.tg_tokens_per_s), r.next_token_ms, bpt, bandwidth[t], in_cache,
              peak_rss_bytes()});
        if (a.by_format) {
          by_format.push_back({label, t, r.next_token_ms, bandwidth[t], llc, decode_by_format(*model, pool, a.reps)});
          if (a.json) print_by_format(by_format.back(), true);
        }
      }
    }
  }
  if (!a.json)
    for (const ByFormat& b : by_format) {
      fmt::print("\nDecode by weight format: {}, {} thread{} (one token's GEMVs over each format's matrices)\n",
                 b.low_bit, b.threads, b.threads > 1 ? "s" : "");
      fmt::print("| format | matrices | bytes/token | ms/token | GB/s | % of read BW | % of next token |\n");
      fmt::print("|---|---:|---:|---:|---:|---:|---:|\n");
      print_by_format(b, false);
    }
  if (!a.json)
    fmt::print("peak RSS {:.2f} GiB; {} kernels{}\n", static_cast<double>(peak_rss_bytes()) / (1u << 30),
               isa_name(active_isa()),
               llc ? fmt::format("; last-level cache {:.0f} MiB (\"in cache\": the weights read per token fit in it, "
                                 "so memory bandwidth does not bound decode)",
                                 static_cast<double>(*llc) / (1 << 20))
                   : std::string());
  return 0;
}

}  // namespace

Run add_bench(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill (pp) and decode (tg) speed, llama-bench style");
  cmd->add_option("-m,--model", args->model_dir, "Hugging Face model directory or .gguf file")->required();
  cmd->add_option("-p,--n-prompt", args->n_prompt, "Prompt tokens processed in one batch (pp test); 0 = skip")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_option("-n,--n-gen", args->n_gen, "Tokens generated one by one (tg test); 0 = skip")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_option("-r,--repetitions", args->reps, "Repetitions of each test")
      ->capture_default_str()
      ->check(kPositive);
  cmd->add_option("--low-bit", args->low_bits,
                  "Formats to test, comma-separated (default: sym_int4, and a quantized checkpoint's layers as "
                  "stored; see generate --help for the names)")
      ->check(kNotEmpty)
      ->delimiter(',');
  cmd->add_flag("--json", args->json,
                "Print one JSON object per line as each test finishes (llama-bench's jsonl keys where they exist)");
  cmd->add_flag("--by-format", args->by_format,
                "After each tg test, time one decode step's GEMVs per weight format (a mixed model's formats, "
                "lm_head apart): bytes, ms, GB/s and share of the next-token time of each");
  add_model_flags(cmd, args->model);
  // bench takes a list of thread counts: replace the shared single -t.
  cmd->remove_option(cmd->get_option("--threads"));
  cmd->add_option("-t,--threads", args->threads, "Thread counts to test, comma-separated; 0 = all cores")
      ->delimiter(',')
      ->check(kNonNegative);
  return [args] { return run_bench_command(*args); };
}

}  // namespace woq::cli
