// Microbenchmarks of GPTQ's solve at Llama-2-7B shapes, the parts
// `woq quantize --method gptq` reports per layer as "solve":
//   prepare/K        the damped Hessian's inverse Cholesky factor (prepare_gptq)
//   quantize/N/K     the column-by-column solve of one [N, K] weight (gptq_quantize)
//   hessian/K        X^T X of 512 calibration rows (ssyrk)
// Counter "FLOPS": 2K^3/3 (prepare), N * K^2 (quantize's lazy batch updates),
// T * K^2 (hessian).
//   build/bin/gptq_bench --benchmark_filter=quantize
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "core/thread_pool.h"
#include "quantize/gptq.h"

namespace woq {
namespace {

ThreadPool& pool() {
  static ThreadPool p(0);
  return p;
}

std::vector<float> normal(std::int64_t count, std::uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(static_cast<std::size_t>(count));
  for (float& x : v) x = d(rng);
  return v;
}

// A Hessian of 2K rows of correlated inputs (positive definite).
std::vector<double> hessian(std::int64_t k) {
  const std::int64_t t = 2 * k;
  std::vector<float> x = normal(t * k, 1, 1.0f);
  for (std::int64_t r = 0; r < t; ++r)
    for (std::int64_t j = 1; j < k; ++j) x[static_cast<std::size_t>(r * k + j)] += 0.5f * x[static_cast<std::size_t>(r * k + j - 1)];
  Hessian h(k);
  h.add(x.data(), t);
  return h.matrix();
}

GptqOptions options() {
  GptqOptions o;
  o.spec = {LowBit::kSymInt4, 128, Int4Range::kFull};
  return o;
}

void BM_Prepare(benchmark::State& state) {
  const std::int64_t k = state.range(0);
  const auto kd = static_cast<double>(k);
  const std::vector<double> h = hessian(k);
  for (auto _ : state) benchmark::DoNotOptimize(prepare_gptq(h, k, options()));
  state.counters["FLOPS"] = benchmark::Counter(2.0 * kd * kd * kd / 3.0, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Prepare)->Name("prepare")->Arg(4096)->Arg(11008)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Quantize(benchmark::State& state) {
  const std::int64_t n = state.range(0), k = state.range(1);
  const auto kd = static_cast<double>(k);
  const GptqHessian prepared = prepare_gptq(hessian(k), k, options());
  const std::vector<float> w = normal(n * k, 2, 0.02f);
  for (auto _ : state) benchmark::DoNotOptimize(gptq_quantize(w.data(), n, k, prepared, options(), pool()));
  state.counters["FLOPS"] =
      benchmark::Counter(static_cast<double>(n) * kd * kd, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Quantize)->Name("quantize")->Args({4096, 4096})->Args({11008, 4096})->Args({4096, 11008})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_Hessian(benchmark::State& state) {
  const std::int64_t k = state.range(0), t = 512;
  const auto kd = static_cast<double>(k);
  const std::vector<float> x = normal(t * k, 3, 1.0f);
  Hessian h(k);
  for (auto _ : state) h.add(x.data(), t);
  state.counters["FLOPS"] =
      benchmark::Counter(static_cast<double>(t) * kd * kd, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Hessian)->Name("hessian")->Arg(4096)->Arg(11008)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace woq

BENCHMARK_MAIN();
