// Microbenchmarks of matmul per weight format at Llama-2-7B shapes:
// matrix x vector (decode, m = 1) and matrix x matrix (prefill, m = 512), and
// quantizing to each format.
// Reports weight bytes streamed per second (bytes_per_second) and FLOP/s
// (counter "FLOPS", 2 * m * N * K per iteration).
//   build/bin/matmul_bench --benchmark_filter='gemv/sym_int4'
// (Debian's libbenchmark is a debug build and says so; the timed code is woq's,
// built with -O3.)
#include <benchmark/benchmark.h>
#include <fmt/format.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/kquant.h"
#include "formats/low_bit.h"
#include "kernels/matmul.h"

namespace woq {
namespace {

const QuantMatrix& weights(LowBit type, std::int64_t group, Activations act, std::int64_t n, std::int64_t k) {
  static std::map<std::tuple<LowBit, std::int64_t, Activations, std::int64_t, std::int64_t>, std::unique_ptr<QuantMatrix>>
      cache;
  auto& slot = cache[{type, group, act, n, k}];
  if (!slot && is_kquant(type)) {
    // Random blocks (every quant pattern) with N(0, 0.001) fp16 (super-)block scales and mins.
    const kquant::Format& f = *kquant::find(type);
    slot = std::make_unique<QuantMatrix>(allocate_matrix(n, k, {type, f.block}));
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 0.001f);
    for (auto& b : slot->data) b = static_cast<std::uint8_t>(rng());
    for (std::size_t at = 0; at < slot->data.size(); at += static_cast<std::size_t>(f.block_bytes))
      for (const std::int64_t offset : {f.d_offset, f.dmin_offset})
        if (offset >= 0) {
          const std::uint16_t h = fp32_to_fp16(normal(rng));
          std::memcpy(slot->data.data() + at + static_cast<std::size_t>(offset), &h, 2);
        }
  }
  if (!slot) {
    std::mt19937 rng(42);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    const RowReader read = [&](std::int64_t, float* out) {
      for (std::int64_t j = 0; j < k; ++j) out[j] = normal(rng);
    };
    slot = std::make_unique<QuantMatrix>(quantize_matrix(read, n, k, {type, group, Int4Range::kFull}));
    slot->activations = act;
    prepare_for_kernels(*slot);
  }
  return *slot;
}

ThreadPool& pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& p = pools[threads];
  if (!p) p = std::make_unique<ThreadPool>(threads);
  return *p;
}

// Args: N (output rows), K (inputs), m (tokens), threads.
void run_matmul(benchmark::State& state, Isa isa, LowBit type, std::int64_t group, Activations act) {
  const std::int64_t n = state.range(0), k = state.range(1), m = state.range(2);
  const QuantMatrix& w = weights(type, group, act, n, k);
  std::vector<float> x(static_cast<std::size_t>(m * k)), y(static_cast<std::size_t>(m * n));
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (auto& v : x) v = normal(rng);
  ThreadPool& p = pool(static_cast<int>(state.range(3)));
  for (auto _ : state) {
    matmul(w, x.data(), m, y.data(), p, isa);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(w.bytes()));
  state.counters["FLOPS"] =
      benchmark::Counter(2.0 * static_cast<double>(m * n * k), benchmark::Counter::kIsIterationInvariantRate);
}

// Quantizing an N(0, 0.02) [N, K] matrix to `type` (group `group`) on one thread: weights per second
// (items_per_second), the rate of in-memory --low-bit conversion, GGUF export and plan measurement's candidates.
// With `isa`, quantize_for_kernels instead (int16 activations, one thread): the rows fitted and rounded in
// that ISA's vectors and written straight into the interleaved layout, as AWQ's scale search quantizes each
// candidate (compare quantize/<format> then the interleave: quantize_matrix and prepare_for_kernels).
void run_quantize(benchmark::State& state, LowBit type, std::int64_t group, std::optional<Isa> isa = std::nullopt) {
  const std::int64_t n = state.range(0), k = state.range(1);
  std::vector<float> w(static_cast<std::size_t>(n * k));
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (auto& v : w) v = normal(rng);
  const RowReader read = [&](std::int64_t r, float* out) { std::memcpy(out, w.data() + r * k, 4 * k); };
  ThreadPool one(1);
  for (auto _ : state) {
    QuantMatrix q = isa ? quantize_for_kernels(read, n, k, {type, group, Int4Range::kFull}, Activations::kInt16, one, *isa)
                        : quantize_matrix(read, n, k, {type, group, Int4Range::kFull});
    benchmark::DoNotOptimize(q.data.data());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * n * k);
}

// Registers gemv/<isa>/<format>[_f32act|_bf16act|_int16act] (m = 1, decode) and gemm/<isa>/<format>
// (m = 512, prefill) for every ISA this CPU runs but scalar, at the q/o,
// gate/up and down projections of Llama-2-7B and its lm_head (too big for any
// cache), with 1 and 2 threads; ggml's block formats (K-quants, q4_1, q5_1) on random blocks. sym_int4 g16 shows the row path that group
// sizes not a multiple of 32 take (batch invariance).
void register_all() {
  const std::tuple<LowBit, std::int64_t, Activations> formats[] = {
      {LowBit::kSymInt4, 32, Activations::kInt8}, {LowBit::kAsymInt4, 32, Activations::kInt8},
      {LowBit::kSymInt8, 32, Activations::kInt8}, {LowBit::kSymInt8, -1, Activations::kInt8},
      {LowBit::kSymInt4, 32, Activations::kF32},  {LowBit::kSymInt8, -1, Activations::kF32},
      {LowBit::kSymInt4, 32, Activations::kBf16}, {LowBit::kSymInt8, -1, Activations::kBf16},
      {LowBit::kSymInt8, 128, Activations::kBf16},
      {LowBit::kSymInt8, 32, Activations::kInt16}, {LowBit::kSymInt8, -1, Activations::kInt16},
      {LowBit::kAsymInt4, 128, Activations::kInt16},  // AWQ's scale candidates (quantize/awq.cc)
      {LowBit::kFp32, 0, Activations::kInt8},     {LowBit::kFp16, 0, Activations::kInt8},
      {LowBit::kBf16, 0, Activations::kInt8},
      {LowBit::kSymInt4, 16, Activations::kInt8},
      {LowBit::kQ4_K, 0, Activations::kInt8},     {LowBit::kQ6_K, 0, Activations::kInt8},
      {LowBit::kQ5_K, 0, Activations::kInt8},     {LowBit::kQ3_K, 0, Activations::kInt8},
      {LowBit::kQ2_K, 0, Activations::kInt8},     {LowBit::kQ4_1, 0, Activations::kInt8},
      {LowBit::kQ5_1, 0, Activations::kInt8}};
  const std::pair<std::int64_t, std::int64_t> nk[] = {{4096, 4096}, {11008, 4096}, {4096, 11008}, {32000, 4096}};
  for (const auto& [type, group] : {std::pair{LowBit::kSymInt4, std::int64_t{32}}, {LowBit::kAsymInt4, 32},
                                    {LowBit::kSymInt8, 32}, {LowBit::kQ2_K, 256}, {LowBit::kQ3_K, 256},
                                    {LowBit::kQ4_K, 256}, {LowBit::kQ5_K, 256}, {LowBit::kQ6_K, 256},
                                    {LowBit::kQ4_1, 32}, {LowBit::kQ5_1, 32}})
    benchmark::RegisterBenchmark(fmt::format("quantize/{}", low_bit_name(type)).c_str(),
                                 [type = type, group = group](benchmark::State& st) { run_quantize(st, type, group); })
        ->Args({1024, 4096})
        ->ArgNames({"N", "K"})
        ->Unit(benchmark::kMillisecond);
  for (const Isa isa : available_isas())
    for (const auto& [type, group] : {std::pair{LowBit::kAsymInt4, std::int64_t{128}}, {LowBit::kSymInt4, 32},
                                      {LowBit::kSymInt8, 32}})
      benchmark::RegisterBenchmark(fmt::format("quantize_for_kernels/{}/{}_g{}", isa_name(isa), low_bit_name(type), group).c_str(),
                                   [isa, type = type, group = group](benchmark::State& st) {
                                     run_quantize(st, type, group, isa);
                                   })
          ->Args({1024, 4096})
          ->ArgNames({"N", "K"})
          ->Unit(benchmark::kMillisecond);
  for (const Isa isa : all_isas())
    if (!cpu_supports(isa)) fmt::print(stderr, "not measured here: {} (needs {})\n", isa_name(isa), isa_requirements(isa));
  for (const Isa isa : available_isas()) {
    if (isa == Isa::kScalar && available_isas().size() > 1) continue;  // the reference, not a contender
    for (const auto& [kind, m] : {std::pair<const char*, std::int64_t>{"gemv", 1}, {"gemm", 512}}) {
      for (const auto& [type, group, act] : formats) {
        const std::string name =
            fmt::format("{}/{}/{}{}{}", kind, isa_name(isa), low_bit_name(type),
                        group == -1  ? "_channel"
                        : group > 0 ? fmt::format("_g{}", group)
                                    : "",
                        is_quantized(type) && act != Activations::kInt8
                            ? fmt::format("_{}act", activations_name(act))
                            : "");
        auto* b = benchmark::RegisterBenchmark(
            name.c_str(), [isa, type = type, group = group, act = act](benchmark::State& st) {
              run_matmul(st, isa, type, group, act);
            });
        for (const auto& [n, k] : nk)
          for (const int threads : {1, 2}) b->Args({n, k, m, threads});
        b->ArgNames({"N", "K", "m", "threads"})->UseRealTime()->Unit(benchmark::kMillisecond);
      }
    }
  }
}

}  // namespace
}  // namespace woq

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  woq::register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
