// Tokenizer throughput: encoding WikiText-2's test split (bench/data,
// 1.29 MB) and decoding its ids, per tokenizer. Reports bytes of text per
// second (bytes_per_second) and tokens per second (counter "tokens/s").
//   build/bin/tokenizer_bench
// The BPE word cache is warm after the first iteration, as in a long-running
// server; "cold" rebuilds the tokenizer each iteration (load time excluded).
#include <benchmark/benchmark.h>

#include <map>
#include <memory>

#include "io/json_file.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

const std::string& wiki_text() {
  static const std::string text = read_text_file(WOQ_BENCH_DATA "/wiki.test.raw");
  return text;
}

const Tokenizer& tokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  auto& slot = cache[name];
  if (!slot) slot = std::make_unique<Tokenizer>(Tokenizer::load(WOQ_ASSETS_DIR "/tokenizers/" + name));
  return *slot;
}

void encode(benchmark::State& state, const std::string& name, bool cold) {
  const std::string& text = wiki_text();
  const Tokenizer& warm = tokenizer(name);  // loaded before timing
  std::size_t tokens = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      const Tokenizer fresh = Tokenizer::load(WOQ_ASSETS_DIR "/tokenizers/" + name);
      state.ResumeTiming();
      tokens = fresh.encode(text).size();
    } else {
      tokens = warm.encode(text).size();
    }
    benchmark::DoNotOptimize(tokens);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * text.size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tokens"] = static_cast<double>(tokens);
}

void decode(benchmark::State& state, const std::string& name) {
  const std::vector<std::int32_t> ids = tokenizer(name).encode(wiki_text());
  for (auto _ : state) benchmark::DoNotOptimize(tokenizer(name).decode(ids));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * wiki_text().size()));
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(ids.size()), benchmark::Counter::kIsIterationInvariantRate);
}

void register_all() {
  for (const std::string name : {"llama3", "qwen3", "gpt2", "llama2"}) {
    benchmark::RegisterBenchmark(("encode/" + name).c_str(), [name](benchmark::State& s) { encode(s, name, false); })
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("encode_cold/" + name).c_str(), [name](benchmark::State& s) { encode(s, name, true); })
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
    benchmark::RegisterBenchmark(("decode/" + name).c_str(), [name](benchmark::State& s) { decode(s, name); })
        ->Unit(benchmark::kMillisecond);
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
