// Perplexity and the comparison of two models' next-token distributions on
// the same tokens, as llama.cpp's llama-perplexity computes them (chunks of
// ctx tokens from the text tokenized once, each scored on its second half;
// --kl-divergence statistics), plus a per-document mode.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/ranks.h"
#include "kernels/ops.h"  // log_sum_exp, token_nll
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// Token sequences to run and, in each, the positions whose next token is
/// scored: logits at position j predict token j + 1 for j in [first_scored, size - 1).
struct ScoringPlan {
  std::vector<std::vector<std::int32_t>> sequences;
  std::int64_t first_scored = 0;
  std::int64_t truncated = 0;  ///< documents cut to ctx tokens (per-document plans)

  /// Number of scored tokens over all sequences.
  std::int64_t scored_tokens() const;
  /// The plan of sequences [first, last) only (one rank's share of a data-parallel run).
  ScoringPlan slice(std::int64_t first, std::int64_t last) const;
};

/// One rank's share of a data-parallel evaluation of a plan: its sequences (core/ranks.h share()) and the
/// index of their first scored position among the whole plan's (their first row in a reference file of it).
struct PlanShare {
  ScoringPlan plan;
  std::int64_t first_row = 0;
};
PlanShare plan_share(const ScoringPlan& plan, Ranks& ranks);

/// The token llama-perplexity puts first in every chunk: BOS when the
/// tokenizer adds one (Llama 2/3), else -1 (Qwen adds none: chunks keep
/// their own first token).
std::int32_t chunk_bos(const Tokenizer& tokenizer);

/// llama-perplexity's plan: `tokens` cut into floor(size / ctx) chunks of ctx
/// tokens (at most `max_chunks` when > 0), each scored from ctx / 2; with
/// `bos` >= 0 the first token of every chunk is replaced by it (llama.cpp
/// does so when the tokenizer adds BOS). Throws woq::Error when ctx < 3 or
/// the text is shorter than one chunk (saying how many tokens it has).
ScoringPlan chunk_plan(const std::vector<std::int32_t>& tokens, std::int64_t ctx, std::int64_t max_chunks,
                       std::int32_t bos);

/// One sequence per document of `text` split on `separator` (empty documents
/// skipped), each tokenized with the tokenizer's BOS and scored from position 0;
/// documents longer than ctx tokens are cut to ctx (counted in `truncated`).
/// Throws woq::Error when no document has two tokens.
ScoringPlan document_plan(const Tokenizer& tokenizer, const std::string& text, const std::string& separator,
                          std::int64_t ctx, std::int64_t max_documents);

/// Receives the logits [vocab] at scored position `pos` of sequence `seq`
/// with the token that follows (`target`).
using ScoredLogits = std::function<void(std::int64_t seq, std::int64_t pos, std::int32_t target, const float* logits)>;

/// Runs every sequence of `plan` through `model` (batch tokens per forward
/// call; <= 0 means the whole sequence) and hands each scored position to
/// `sink`. `progress(done, total)` is called after each sequence. Returns
/// the wall time in seconds. Throws what LlamaModel::forward throws.
double run_plan(LlamaModel& model, const ScoringPlan& plan, std::int64_t batch, const ScoredLogits& sink,
                const std::function<void(std::int64_t, std::int64_t)>& progress = nullptr);

/// Perplexity of negative log-likelihoods: exp(mean), with the standard
/// error exp(mean) * stddev / sqrt(n - 1) as llama-perplexity prints it.
struct Perplexity {
  double ppl = 0;
  double ppl_stderr = 0;
  double mean_nll = 0;
  std::int64_t tokens = 0;
};
/// Throws woq::Error for an empty input.
Perplexity perplexity(const std::vector<double>& nll);

}  // namespace woq
