// woq bench: llama-bench-style pp/tg throughput against the memory roofline.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "bench/bench.h"
#include "commands.h"
#include "core/cpu.h"
#include "core/thread_pool.h"

namespace woq::cli {

namespace {

struct BenchArgs {
  std::string model_dir;
  std::int64_t n_prompt = 512;
  std::int64_t n_gen = 128;
  std::vector<int> threads = {0};
  int reps = 3;
  std::vector<std::string> low_bits = {"sym_int4"};
  ModelFlags model;
  bool json = false;
};

// "1.173 GB", "262.4 KB": decimal units, as GB/s is.
std::string bytes_str(std::uint64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (b >= 1e9) return fmt::format("{:.3f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.1f} MB", b / 1e6);
  return fmt::format("{:.1f} KB", b / 1e3);
}

struct Row {
  std::string low_bit;
  int threads;
  bool is_pp;
  Stat ts;
  BenchResult r;
  std::uint64_t bytes_per_token;
  double read_bw;
  std::uint64_t peak_rss;
};

int run_bench_command(const BenchArgs& a) {
  std::map<int, double> bandwidth;  // threads -> bytes/s
  std::vector<int> threads;
  for (const int t : a.threads) threads.push_back(t > 0 ? t : ThreadPool(0).size());
  for (const int t : threads) {
    if (bandwidth.count(t)) continue;
    bandwidth[t] = measure_read_bandwidth(t);
    fmt::print(stderr, "woq: memory read bandwidth, {} thread{}: {:.1f} GB/s\n", t, t > 1 ? "s" : "",
               bandwidth[t] / 1e9);
  }
  std::vector<Row> rows;
  for (const auto& low_bit : a.low_bits) {
    const LoadOptions options = load_options(a.model, low_bit);
    ThreadPool load_pool(0);
    auto model = load_model(a.model_dir, options, load_pool);  // once per format
    for (const int t : threads) {
      ThreadPool pool(t);
      model->set_thread_pool(pool);
      const BenchResult r = run_bench(*model, a.n_prompt, a.n_gen, a.reps);
      const std::uint64_t bpt = model->weight_bytes_per_token();
      if (a.n_prompt > 0)
        rows.push_back({low_bit, t, true, mean_stddev(r.pp_tokens_per_s), r, bpt, bandwidth[t], peak_rss_bytes()});
      if (a.n_gen > 0)
        rows.push_back({low_bit, t, false, mean_stddev(r.tg_tokens_per_s), r, bpt, bandwidth[t], peak_rss_bytes()});
    }
  }

  if (a.json) {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    for (const Row& row : rows) {
      const double gbps = row.is_pp ? 0.0 : row.ts.mean * static_cast<double>(row.bytes_per_token) / 1e9;
      out.push_back({{"test", row.is_pp ? fmt::format("pp{}", a.n_prompt) : fmt::format("tg{}", a.n_gen)},
                     {"n_prompt", row.is_pp ? a.n_prompt : 0},
                     {"n_gen", row.is_pp ? 0 : a.n_gen},
                     {"n_threads", row.threads},
                     {"avg_ts", row.ts.mean},
                     {"stddev_ts", row.ts.stddev},
                     {"low_bit", row.low_bit},
                     {"isa", isa_name(active_isa())},
                     {"bytes_per_token", row.bytes_per_token},
                     {"gbps", gbps},
                     {"bw_fraction", row.is_pp ? 0.0 : gbps * 1e9 / row.read_bw},
                     {"read_bw_gbps", row.read_bw / 1e9},
                     {"first_token_ms", row.r.first_token_ms},
                     {"next_token_ms", row.r.next_token_ms},
                     {"peak_rss_bytes", row.peak_rss}});
    }
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("| low_bit | threads | test | t/s | first token ms | next token ms | bytes/token | GB/s | % of read BW |\n");
  fmt::print("|---|---:|---|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& row : rows) {
    const double gbps = row.ts.mean * static_cast<double>(row.bytes_per_token) / 1e9;
    fmt::print("| {} | {} | {} | {:.2f} ± {:.2f} | {:.1f} | {:.2f} | {} | {} | {} |\n", row.low_bit, row.threads,
               row.is_pp ? fmt::format("pp{}", a.n_prompt) : fmt::format("tg{}", a.n_gen), row.ts.mean, row.ts.stddev,
               row.r.first_token_ms, row.r.next_token_ms, bytes_str(row.bytes_per_token),
               row.is_pp ? "-" : fmt::format("{:.1f}", gbps),
               row.is_pp ? "-" : fmt::format("{:.0f} %", 100 * gbps * 1e9 / row.read_bw));
  }
  fmt::print("peak RSS {:.2f} GiB; {} kernels\n", static_cast<double>(peak_rss_bytes()) / (1u << 30),
             isa_name(active_isa()));
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
  cmd->add_option("--low-bit", args->low_bits, "Formats to test, comma-separated")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print one JSON array (llama-bench keys where they exist)");
  add_model_flags(cmd, args->model);
  // bench takes a list of thread counts: replace the shared single -t.
  cmd->remove_option(cmd->get_option("--threads"));
  cmd->add_option("-t,--threads", args->threads, "Thread counts to test, comma-separated; 0 = all cores")
      ->delimiter(',')
      ->check(kNonNegative);
  return [args] { return run_bench_command(*args); };
}

}  // namespace woq::cli
