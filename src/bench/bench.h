// Speed measurement in the manner of llama.cpp's llama-bench: prompt
// processing (pp, one batched prefill of n_prompt tokens) and text
// generation (tg, n_gen single-token decode steps), both from an empty KV
// cache on random token ids, plus the machine's memory read bandwidth for
// a roofline.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/llama.h"

namespace woq {

/// Read bandwidth of main memory in bytes/s with `threads` threads: the best
/// of `reps` passes summing a buffer of `bytes` (much larger than the
/// last-level cache), each thread reading its own contiguous part.
double measure_read_bandwidth(int threads, std::uint64_t bytes = 1ull << 30, int reps = 5);

/// Mean and sample standard deviation.
struct Stat {
  double mean = 0;
  double stddev = 0;
};
Stat mean_stddev(const std::vector<double>& v);

struct BenchResult {
  std::vector<double> pp_tokens_per_s;  ///< one per repetition (empty when n_prompt = 0)
  std::vector<double> tg_tokens_per_s;  ///< one per repetition (empty when n_gen = 0)
  double first_token_ms = 0;  ///< mean time of the n_prompt-token prefill (time to first token)
  double next_token_ms = 0;   ///< mean time of one decode step
};

/// One weight format's part of a decode step (bench's per-format rows): the
/// model's block linears in that format (lm_head is a part of its own), their
/// bytes, and the time one token's GEMVs (m = 1) over all of them take.
struct FormatShare {
  std::string format;  ///< "sym_int4 g32, int8 activations", "q4_K, q8_K activations", "fp16"; "lm_head " + it
  std::int64_t matrices = 0;
  std::uint64_t bytes = 0;
  double seconds = 0;  ///< the best of the passes: every matrix of the part times one token's activations
};

/// The parts of `model`'s decode by weight format, in the order the formats
/// first appear in the blocks, lm_head last. One warm-up and `reps` timed
/// passes on `pool`; a pass multiplies every matrix of a part by one token's
/// activations (N(0, 1)), in the model's order, as a decode step streams
/// them: what the kernels reach on that format's bytes inside this model.
/// Throws woq::Error for reps < 1.
std::vector<FormatShare> decode_by_format(LlamaModel& model, ThreadPool& pool, int reps);

/// Runs one warm-up, then `reps` repetitions of pp (n_prompt tokens) and tg
/// (n_gen tokens) on `model` with its thread pool. Token ids are drawn from
/// [0, vocab) with a fixed seed. Throws woq::Error if n_prompt or n_gen
/// exceed the model's context.
BenchResult run_bench(LlamaModel& model, std::int64_t n_prompt, std::int64_t n_gen, int reps);

}  // namespace woq
