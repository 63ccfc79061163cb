// Comparing a candidate model with a reference on the same scored tokens
// (llama-perplexity --kl-divergence): KL divergence per position with its
// quantiles, same-top-token rate, both perplexities and RMS of the change in
// the probability of the correct token. The reference's log-probabilities are
// streamed through a file, so the two models never need to be in memory
// together and an expensive reference can be reused (--save-ref/--load-ref).
#pragma once

#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "core/ranks.h"
#include "eval/perplexity.h"

namespace woq {

/// Whether `path` starts as llama-perplexity's --kl-divergence-base file does ("_logits_").
bool is_llama_logits_file(const std::string& path);

/// The chunks of a llama-perplexity --kl-divergence-base file, and whether
/// their first tokens were made BOS.
struct LlamaLogitsPlan {
  ScoringPlan plan;
  bool bos = false;
};

/// The scoring plan of a llama-perplexity --kl-divergence-base file
/// (examples/perplexity/perplexity.cpp, llama.cpp c392e5094): its n_chunk
/// chunks of n_ctx tokens, scored from n_ctx / 2. When the file's first token
/// is `bos_id` (the model's BOS; -1: none), llama-perplexity's tokenizer added
/// BOS and it made every chunk's first token BOS, so this plan does too. The
/// file: "_logits_", int32 n_ctx, int32 n_vocab, int32 n_chunk, int32 tokens
/// [n_chunk · n_ctx] (the text's, before that replacement), then per chunk and
/// scored position nv = 2·⌈n_vocab / 2⌉ + 4 uint16: float scale, float
/// min_log_prob, round((logit − min_logit) / scale) per token, where min_logit
/// = max(lowest logit, highest − 16) and a 0 stands for min_logit or below.
/// Throws woq::Error naming the file and field when the header is not such a
/// file's, n_ctx exceeds `context_limit` or the tokens exceed 2^27 (checked
/// before anything is allocated), its size is not what the header says,
/// n_vocab differs from `vocab` or a token id is outside it.
LlamaLogitsPlan llama_logits_plan(const std::string& path, std::int32_t bos_id, std::int64_t vocab,
                                  std::int64_t context_limit);

/// Writes a llama-perplexity --kl-divergence-base file (the layout of
/// llama_logits_plan) for a chunk plan, encoding each row as its log_softmax
/// does, so that `llama-perplexity --kl-divergence` (and eval compare
/// --load-ref) score other models against it. Written to PATH.tmp and renamed
/// by finish(). Throws woq::Error naming the path on I/O failure, and for a
/// plan that is not llama-perplexity's (per-document, unequal chunks).
class LlamaLogitsWriter {
 public:
  LlamaLogitsWriter(const std::string& path, const ScoringPlan& plan, std::int64_t vocab);
  ~LlamaLogitsWriter();
  LlamaLogitsWriter(const LlamaLogitsWriter&) = delete;
  LlamaLogitsWriter& operator=(const LlamaLogitsWriter&) = delete;
  /// Appends one scored position's raw logits [vocab], in plan order.
  void write(const float* logits);
  /// Checks every scored position was written and renames PATH.tmp to PATH.
  void finish();

 private:
  std::FILE* file_ = nullptr;
  std::string path_;
  std::int64_t vocab_, rows_left_;
  std::vector<std::uint16_t> packed_;
};

/// Reference log-probabilities file: "WOQREF01", int64 vocab, int64
/// first_scored, int64 sequences, per sequence int64 length and its int32
/// token ids, then fp32 log-softmax rows [scored positions, vocab] in plan
/// order (all little-endian). open() also reads llama-perplexity's
/// --kl-divergence-base files (llama_logits_plan), whose rows it decodes to
/// scale · q + min_log_prob.
class RefLogprobFile {
 public:
  /// Creates `path` for writing the reference of `plan` (written to
  /// PATH.tmp, renamed by finish()); an empty path uses an anonymous
  /// temporary file. Throws woq::Error naming the path on I/O failure.
  static RefLogprobFile create(const std::string& path, const ScoringPlan& plan, std::int64_t vocab);
  /// Opens `path` and checks it was computed on exactly `plan`'s tokens with
  /// `vocab` entries (else throws woq::Error saying what differs).
  static RefLogprobFile open(const std::string& path, const ScoringPlan& plan, std::int64_t vocab);
  ~RefLogprobFile();
  RefLogprobFile(RefLogprobFile&& other) noexcept;
  RefLogprobFile& operator=(RefLogprobFile&&) = delete;

  /// Appends log_softmax(logits) [vocab].
  void write_logits(const float* logits);
  /// Completes writing and positions the file for reading (renames PATH.tmp to PATH).
  void finish();
  /// Reads the next row [vocab]; throws woq::Error at a premature end or
  /// when the row is not a log-probability distribution (a corrupt file).
  void read(float* row);
  /// Throws woq::Error unless every row has been read (trailing bytes).
  void expect_end();
  /// Positions the file at its first row again (to compare a second candidate).
  void rewind();
  /// Positions the file at row `row` of the plan's scored positions (one rank's first: plan_share). Throws
  /// woq::Error when the plan has fewer rows, or when the file cannot seek.
  void seek(std::int64_t row);
  /// The rows of the plan the file was created or opened for (its scored positions).
  std::int64_t rows() const { return rows_; }
  /// The row read() reads next.
  std::int64_t next_row() const { return rows_read_; }
  /// Log-probabilities at or below this are left out of the KL divergence: −16
  /// for llama-perplexity's files (which hold no finer ones, and leave them out
  /// too), −∞ for woq's.
  float kl_floor() const;

 private:
  RefLogprobFile(std::FILE* f, std::string path, bool rename, std::int64_t vocab, long data_start);
  void read_llama_row(float* row);
  std::string name() const { return path_.empty() ? std::string("temporary reference file") : path_; }
  std::FILE* file_;
  std::string path_;  ///< the file (final path when writing); empty for anonymous
  bool rename_;       ///< written to PATH.tmp, renamed by finish()
  std::int64_t rows_read_ = 0;
  std::int64_t rows_ = 0;
  std::int64_t vocab_;
  long data_start_;
  std::vector<float> row_;
  bool llama_ = false;  ///< a llama-perplexity --kl-divergence-base file
  std::vector<std::uint16_t> packed_;  ///< its row being read
};

/// What eval compare prints.
struct CompareStats {
  std::int64_t positions = 0;
  /// nats; quantiles linear between the nearest ranks, as llama-perplexity's
  double mean_kl = 0, kl_stderr = 0, median_kl = 0, p90_kl = 0, p99_kl = 0, max_kl = 0;
  double same_top = 0;  ///< fraction of positions whose argmax tokens agree
  double same_top_stderr = 0;  ///< its binomial standard error sqrt(p (1 - p) / (n - 1)); 0 for one position
  Perplexity ref, cand;
  double ppl_ratio = 0;  ///< cand / ref
  double rms_dp = 0;     ///< RMS of p_cand(target) - p_ref(target), as a fraction
};

/// Accumulates the comparison one scored position at a time.
class CompareAccumulator {
 public:
  /// kl_floor: reference log-probabilities at or below it are left out of the
  /// KL divergence (RefLogprobFile::kl_floor).
  explicit CompareAccumulator(std::int64_t vocab, float kl_floor = -std::numeric_limits<float>::infinity())
      : vocab_(vocab), kl_floor_(kl_floor) {}
  /// ref_logprobs: the reference's log-softmax row; cand_logits: raw logits.
  void add(const float* ref_logprobs, const float* cand_logits, std::int32_t target);
  /// Every rank's positions, in rank order, on every rank (collective): after each rank has added its share
  /// of the positions (contiguous, in rank order), result() is then one process's, bit for bit.
  void gather(Ranks& ranks);
  /// Throws woq::Error when nothing was added.
  CompareStats result() const;

 private:
  std::int64_t vocab_;
  float kl_floor_;
  std::vector<double> kl_, nll_ref_, nll_cand_, dp_;
  std::int64_t same_ = 0;
};

}  // namespace woq
