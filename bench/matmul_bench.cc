// Microbenchmarks of matmul per weight format at Llama-2-7B shapes:
// matrix x vector (decode, m = 1) and matrix x matrix (prefill, m = 512).
// Reports weight bytes streamed per second (bytes_per_second) and FLOP/s
// (counter "FLOPS", 2 * m * N * K per iteration).
//   build/bin/matmul_bench --benchmark_filter=gemv
#include <benchmark/benchmark.h>

#include <map>
#include <memory>
#include <random>
#include <tuple>
#include <vector>

#include "core/thread_pool.h"
#include "formats/low_bit.h"
#include "kernels/matmul.h"

namespace woq {
namespace {

const QuantMatrix& weights(LowBit type, std::int64_t group, std::int64_t n, std::int64_t k) {
  static std::map<std::tuple<LowBit, std::int64_t, std::int64_t, std::int64_t>, std::unique_ptr<QuantMatrix>> cache;
  auto& slot = cache[{type, group, n, k}];
  if (!slot) {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    const RowReader read = [&](std::int64_t, float* out) {
      for (std::int64_t j = 0; j < k; ++j) out[j] = normal(rng);
    };
    slot = std::make_unique<QuantMatrix>(quantize_matrix(read, n, k, {type, group, Int4Range::kFull}));
  }
  return *slot;
}

ThreadPool& pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

// Args: format, group size, N (output rows), K (inputs), m (tokens), threads.
void BM_matmul(benchmark::State& state) {
  const auto type = static_cast<LowBit>(state.range(0));
  const std::int64_t group = state.range(1), n = state.range(2), k = state.range(3), m = state.range(4);
  const QuantMatrix& w = weights(type, group, n, k);
  std::vector<float> x(static_cast<std::size_t>(m * k)), y(static_cast<std::size_t>(m * n));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  ThreadPool& p = pool(static_cast<int>(state.range(5)));
  for (auto _ : state) {
    matmul(w, x.data(), m, y.data(), p);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(w.bytes()));
  state.counters["FLOPS"] = benchmark::Counter(2.0 * static_cast<double>(m * n * k),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(low_bit_name(type)));
}

void shapes(benchmark::internal::Benchmark* b, std::int64_t m) {
  const std::pair<LowBit, std::int64_t> formats[] = {
      {LowBit::kSymInt4, 32}, {LowBit::kAsymInt4, 32}, {LowBit::kSymInt8, 32},
      {LowBit::kSymInt8, -1}, {LowBit::kFp16, 0},      {LowBit::kBf16, 0}};
  // The q/o, gate/up and down projections of Llama-2-7B, and its lm_head (too big for any cache).
  const std::pair<std::int64_t, std::int64_t> nk[] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096}};
  for (const auto& [type, group] : formats)
    for (const auto& [n, k] : nk)
      for (const int threads : {1, 2})
        b->Args({static_cast<std::int64_t>(type), group, n, k, m, threads});
  b->ArgNames({"type", "group", "N", "K", "m", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_matmul)->Name("gemv")->Apply([](auto* b) { shapes(b, 1); });
BENCHMARK(BM_matmul)->Name("gemm")->Apply([](auto* b) { shapes(b, 512); });

}  // namespace
}  // namespace woq

BENCHMARK_MAIN();
