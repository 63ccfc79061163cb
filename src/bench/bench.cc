#include "bench/bench.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "core/error.h"
#include "formats/kquant.h"
#include "kernels/matmul.h"
#include "model/quant_plan.h"

namespace woq {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sum of 64-bit words; four accumulators so the loads are independent, and a software prefetch 4 KiB
// ahead as the decode kernels issue (without it one core reads ~40 % slower than they do, and decode
// showed above 100 % of this "read bandwidth").
std::uint64_t read_sum(const std::uint64_t* p, std::size_t n) {
  std::uint64_t a = 0, b = 0, c = 0, d = 0;
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    if (i % 8 == 0) __builtin_prefetch(p + i + 512);  // one per 64-byte line; past the end is harmless
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < n; ++i) a += p[i];
  return a + b + c + d;
}

double measure_in_process(int threads, std::uint64_t bytes, int reps) {
  const std::size_t words = bytes / sizeof(std::uint64_t);
  std::unique_ptr<std::uint64_t[]> buf(new std::uint64_t[words]);
  for (std::size_t i = 0; i < words; ++i) buf[i] = i;  // touch every page
  double best = 0;
  std::vector<std::uint64_t> sums(static_cast<std::size_t>(threads));
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const std::size_t b = words * static_cast<std::size_t>(t) / static_cast<std::size_t>(threads);
        const std::size_t e = words * static_cast<std::size_t>(t + 1) / static_cast<std::size_t>(threads);
        sums[static_cast<std::size_t>(t)] = read_sum(buf.get() + b, e - b);
      });
    }
    for (auto& th : pool) th.join();
    best = std::max(best, static_cast<double>(words * sizeof(std::uint64_t)) / seconds_since(t0));
  }
  // Use the sums so the reads cannot be optimised away.
  if (std::accumulate(sums.begin(), sums.end(), std::uint64_t{0}) == 42) best += 1e-9;
  return best;
}

}  // namespace

double measure_read_bandwidth(int threads, std::uint64_t bytes, int reps) {
  if (threads < 1) threads = 1;
  // Measured in a child process so the buffer does not count in this
  // process's peak RSS, which woq bench reports for the model.
  int fds[2];
  if (::pipe(fds) != 0) return measure_in_process(threads, bytes, reps);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return measure_in_process(threads, bytes, reps);
  }
  if (pid == 0) {
    ::close(fds[0]);
    const double bw = measure_in_process(threads, bytes, reps);
    const bool ok = ::write(fds[1], &bw, sizeof bw) == static_cast<ssize_t>(sizeof bw);
    ::_exit(ok ? 0 : 1);
  }
  ::close(fds[1]);
  double bw = 0;
  const bool ok = ::read(fds[0], &bw, sizeof bw) == static_cast<ssize_t>(sizeof bw);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  if (!ok) fail("bench: the memory bandwidth measurement failed");
  return bw;
}

Stat mean_stddev(const std::vector<double>& v) {
  Stat s;
  if (v.empty()) return s;
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  if (v.size() > 1) {
    double ss = 0;
    for (const double x : v) ss += (x - s.mean) * (x - s.mean);
    s.stddev = std::sqrt(ss / static_cast<double>(v.size() - 1));
  }
  return s;
}

namespace {

// "sym_int4 g32, int8 activations", "sym_int8 per channel, bf16 activations", "q4_K, q8_K activations", "fp16"
// (a group as long as the row is "per channel").
std::string format_label(const QuantMatrix& w) {
  QuantSpec spec{w.type};
  spec.group_size = w.groups_per_row == 1 ? -1 : w.group_size;
  std::string s = spec_name(spec);
  if (!is_float_format(w.type))
    s += fmt::format(", {} activations", kquant::activations_label(w.type, w.activations));
  return s;
}

}  // namespace

std::vector<FormatShare> decode_by_format(LlamaModel& model, ThreadPool& pool, int reps) {
  if (reps < 1) fail("bench: -r must be >= 1");
  const ModelConfig& c = model.config();
  struct Part {
    FormatShare share;
    std::vector<const QuantMatrix*> members;
  };
  std::vector<Part> parts;
  const auto add = [&](const std::string& label, const QuantMatrix& w) {
    if (w.rows == 0) return;  // a block another pipeline rank holds
    auto it = std::find_if(parts.begin(), parts.end(), [&](const Part& p) { return p.share.format == label; });
    if (it == parts.end()) it = parts.insert(parts.end(), Part{{label, 0, 0, 0}, {}});
    ++it->share.matrices;
    it->share.bytes += w.bytes();
    it->members.push_back(&w);
  };
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (const LinearSpec& spec : kBlockLinears) {
      const QuantMatrix& w = model.block_linear(l, spec.role);
      add(format_label(w), w);
    }
  add("lm_head " + format_label(model.output_matrix()), model.output_matrix());
  std::int64_t widest = 0, tallest = 0;
  for (const Part& p : parts)
    for (const QuantMatrix* w : p.members) {
      widest = std::max(widest, w->cols);
      tallest = std::max(tallest, w->rows);
    }
  std::vector<float> x(static_cast<std::size_t>(widest)), y(static_cast<std::size_t>(tallest));
  std::mt19937 rng(99);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  Workspace ws;
  std::vector<FormatShare> shares;
  for (Part& p : parts) {
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r <= reps; ++r) {  // pass 0 warms up
      const auto t0 = Clock::now();
      for (const QuantMatrix* w : p.members) matmul(*w, x.data(), 1, y.data(), pool, ws);
      if (r > 0) best = std::min(best, seconds_since(t0));
    }
    p.share.seconds = best;
    shares.push_back(std::move(p.share));
  }
  return shares;
}

BenchResult run_bench(LlamaModel& model, std::int64_t n_prompt, std::int64_t n_gen, int reps) {
  if (n_prompt < 0 || n_gen < 0 || reps < 1) fail("bench: -p and -n must be >= 0 and -r >= 1");
  const std::int64_t vocab = model.config().vocab_size;
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::int32_t> token(0, static_cast<std::int32_t>(vocab - 1));
  std::vector<std::int32_t> prompt(static_cast<std::size_t>(n_prompt));
  for (auto& t : prompt) t = token(rng);
  std::vector<float> logits;

  auto run_pp = [&] {
    KVCache cache = model.make_cache(n_prompt);
    const auto t0 = Clock::now();
    model.forward(prompt, cache, false, logits);
    return seconds_since(t0);
  };
  auto run_tg = [&](std::int64_t steps) {
    KVCache cache = model.make_cache(std::max<std::int64_t>(steps, 1));
    std::int32_t next = token(rng);
    const auto t0 = Clock::now();
    for (std::int64_t i = 0; i < steps; ++i) {
      model.forward(std::span(&next, 1), cache, false, logits);
      next = static_cast<std::int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    }
    return seconds_since(t0);
  };

  // Warm-up (page faults, thread start, caches), as llama-bench does.
  if (n_prompt > 0) run_pp();
  if (n_gen > 0) run_tg(std::min<std::int64_t>(n_gen, 4));

  BenchResult r;
  double pp_total = 0, tg_total = 0;
  for (int i = 0; i < reps; ++i) {
    if (n_prompt > 0) {
      const double s = run_pp();
      pp_total += s;
      r.pp_tokens_per_s.push_back(static_cast<double>(n_prompt) / s);
    }
    if (n_gen > 0) {
      const double s = run_tg(n_gen);
      tg_total += s;
      r.tg_tokens_per_s.push_back(static_cast<double>(n_gen) / s);
    }
  }
  r.first_token_ms = n_prompt > 0 ? pp_total / reps * 1e3 : 0;
  r.next_token_ms = n_gen > 0 ? tg_total / (static_cast<double>(reps) * static_cast<double>(n_gen)) * 1e3 : 0;
  return r;
}

}  // namespace woq
