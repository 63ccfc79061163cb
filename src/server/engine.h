// Continuous batching: up to `parallel` sequences run together, one batched
// forward pass (LlamaModel::forward_batch) per step holding a decode token of
// every sequence past its prompt and chunks of the prompts still prefilling
// (vLLM's chunked prefill, Agrawal et al. 2024 "Sarathi-Serve"): a long
// prompt joins the running streams a chunk per step instead of stalling them.
// New requests join between steps and a finished or cancelled sequence frees
// its slot at once (the scheduling of Orca, Yu et al. 2022, and vLLM). Each
// sequence's KV cache is its own pages, some of them shared read-only with
// the prefix cache: a prompt that starts like an earlier or running sequence
// prefills only the rest.
//
// Batch invariance: forward_batch's rows are bit-identical to running each
// sequence alone, and a prefill split in chunks or resumed after reused
// positions gives the same bits as one prefill, so a greedy request returns
// the same tokens whatever else is running and whatever the prefix cache held.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "generate/sampler.h"
#include "model/llama.h"
#include "server/metrics.h"
#include "server/sequence_caches.h"
#include "tokenizer/tokenizer.h"

namespace woq::server {

/// A token and its log-probability (natural log, under the model's
/// distribution before penalties and temperature).
struct TokenLogprob {
  std::int32_t id = 0;
  double logprob = 0;
};

/// One generated token, as it streams.
struct TokenEvent {
  std::string text;  ///< text completed by this token (may be empty; never part of a stop string)
  TokenLogprob token;
  std::vector<TokenLogprob> top;  ///< the most likely tokens, when top_logprobs > 0
};

/// How a request ended.
struct FinishEvent {
  std::string reason;  ///< "stop" (EOS or stop string), "length", "cancelled" or "error"
  std::string text;    ///< text held back until the end (may be empty)
  std::string error;   ///< what went wrong, for "error"
  std::int64_t prompt_tokens = 0;
  std::int64_t cached_tokens = 0;  ///< prompt tokens taken from the prefix cache, not prefilled
  std::int64_t completion_tokens = 0;
  double first_token_seconds = 0;  ///< from submit to the first generated token
  double seconds = 0;              ///< from submit to the end
  /// With EngineRequest::prompt_logprobs: entry i is prompt token i + 1 with its
  /// log-probability after tokens 0..i (and its `top` alternatives); the first
  /// prompt token has none. Empty otherwise, and for "cancelled" / "error".
  std::vector<TokenEvent> prompt;
};

/// A generation request. Callbacks run on the engine's thread and must not block.
struct EngineRequest {
  std::vector<std::int32_t> prompt;  ///< token ids (BOS included when the tokenizer adds it); not empty
  std::int64_t max_tokens = 16;      ///< generated tokens at most; the context also limits them
  SamplingParams sampling;
  std::vector<std::string> stop;     ///< stop strings
  float presence_penalty = 0, frequency_penalty = 0;  ///< OpenAI's, over the generated tokens
  Penalties penalties;  ///< llama.cpp's repeat penalty over a window of prompt and generated tokens (off by default)
  int top_logprobs = 0;              ///< alternatives reported per token (0 = none)
  bool logprobs = false;             ///< report the chosen token's log-probability
  /// Score the prompt too (OpenAI's echo with logprobs, lm-eval's loglikelihood):
  /// FinishEvent::prompt, from the same prefill (its logits kept for every
  /// position, in chunks of at most EngineOptions::prompt_logit_floats floats).
  bool prompt_logprobs = false;
  std::function<void(const TokenEvent&)> on_token;
  std::function<void(const FinishEvent&)> on_finish;  ///< called exactly once
  std::atomic<bool> cancelled{false};                 ///< set by the client's thread to stop early
};

/// Logits held at once while scoring a prompt (256 MiB): a 128k vocabulary prefills 512 tokens per chunk.
inline constexpr std::int64_t kMaxPromptLogitFloats = std::int64_t{64} << 20;

/// EngineOptions::prefill_chunk sized by the engine from measured times.
inline constexpr std::int64_t kAutoPrefillChunk = -1;

struct EngineOptions {
  std::int64_t parallel = 4;  ///< sequences decoded together
  /// Tokens per sequence (prompt + generated); 0 = the model's context, lowered (to whole KV
  /// pages) when `parallel` full caches would not fit in memory.
  std::int64_t ctx_size = 0;
  /// Memory the KV caches may take at most, in bytes; 0 = 90 % of available_memory_bytes().
  std::int64_t memory_bytes = 0;
  std::int64_t max_queued = 256;  ///< requests waiting for a slot; submit() refuses more (EngineBusy)
  /// Logits a scored prompt (prompt_logprobs) holds at once: it prefills in chunks of this / vocab tokens.
  std::int64_t prompt_logit_floats = kMaxPromptLogitFloats;
  /// Prompt tokens prefilled per step between decode steps at most (all prefilling sequences together);
  /// 0 = each prompt whole in one step; kAutoPrefillChunk = as many as take about 3/4 of a decode step's
  /// time while sequences decode (their time per output token stays under twice what it is without the
  /// prefill), a whole prompt when none does.
  std::int64_t prefill_chunk = kAutoPrefillChunk;
  /// KV bytes the prefix cache may hold; 0 = no prefix caching; -1 = what the memory budget leaves beside
  /// the `parallel` caches, at most as much as they take.
  std::int64_t cache_bytes = -1;
  /// The ranks of a pipeline (LlamaModel::set_pipeline) whose rank 0 runs this engine; the other ranks run
  /// SequenceCaches::follow until the engine is destroyed. Null (or one rank): one process.
  Ranks* pipeline = nullptr;
};

/// submit() when max_queued requests already wait: try again later (an HTTP 503).
class EngineBusy : public Error {
 public:
  using Error::Error;
};

/// submit_all() of more requests than the engine ever holds at once: not worth retrying (an HTTP 400).
class EngineTooLarge : public Error {
 public:
  using Error::Error;
};

class Engine {
 public:
  /// Starts the scheduling thread. The model, tokenizer and metrics must
  /// outlive the engine. Throws woq::Error for parallel < 1, a ctx_size
  /// outside [1, context_limit()], or a given ctx_size whose `parallel` full KV
  /// caches exceed the memory budget (so that no request can run out of memory later).
  Engine(LlamaModel& model, const Tokenizer& tokenizer, Metrics& metrics, EngineOptions options);
  /// Cancels what is running and queued (their on_finish says "cancelled") and joins the thread.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// Queues a request. Throws EngineBusy when max_queued requests wait, woq::Error for an empty prompt, one of
  /// ctx_size tokens or more, bad sampling settings or a stop string that is
  /// not UTF-8 (nothing is called back then).
  void submit(std::shared_ptr<EngineRequest> request);
  /// Queues several requests (a batch of prompts) all at once or none: throws
  /// EngineBusy when they do not all fit now, EngineTooLarge (nothing queued)
  /// when more than max_queued + parallel could never fit, and woq::Error as
  /// submit() for any of them.
  void submit_all(std::span<const std::shared_ptr<EngineRequest>> requests);
  /// Most requests that can wait or run at once (max_queued + parallel).
  std::int64_t capacity() const { return options_.max_queued + options_.parallel; }
  std::int64_t ctx_size() const { return options_.ctx_size; }
  /// Token ids a prompt may hold: [0, vocab_size()) (the model's vocabulary).
  std::int64_t vocab_size() const { return model_.config().vocab_size; }
  std::int64_t parallel() const { return options_.parallel; }
  /// The prefix cache's bound in bytes (0: off).
  std::int64_t cache_bytes() const { return options_.cache_bytes; }

 private:
  struct Slot;
  void loop();
  /// Gives a newly admitted slot its (empty) KV cache.
  void start(Slot& slot);
  /// Before a slot prefills any token itself: takes the longest prefix of its prompt the prefix cache holds
  /// now, when longer than what it took before (a prompt before it with the same start was kept meanwhile).
  void reuse_prefix(Slot& slot);
  /// Whether the slot, not started, shares its first PrefixCache::kBlockTokens tokens with a prompt before
  /// it still prefilling: then it waits for that prompt to be kept rather than prefilling the same tokens.
  bool waits_for_leader(const Slot& slot) const;
  /// One pass of the sequences past their prompt (a decode token each) and of chunks of the prompts
  /// waiting, oldest first, within prefill_budget(); a scored prompt prefills alone (score_chunk).
  void step();
  /// The next chunk of a scored prompt's prefill (prompt_logprobs: its logits for every position, at
  /// most prompt_logit_floats of them and `budget` tokens), alone; lowers `budget`. False when the
  /// sequence ended.
  bool score_chunk(Slot& slot, std::int64_t& budget);
  /// The prompt is in: keeps it in the prefix cache and samples the first token from `logits` (the last
  /// prompt position's). False when the sequence ended.
  bool prompt_done(Slot& slot, const float* logits);
  /// Prompt tokens the next step may prefill (EngineOptions::prefill_chunk); `decoding`: whether
  /// sequences wait for that step's decode.
  std::int64_t prefill_budget(bool decoding) const;
  /// Samples from `logits` and emits; returns false when the sequence ended.
  bool advance(Slot& slot, const float* logits);
  void finish(Slot& slot, const char* reason, std::string error = {});

  LlamaModel& model_;
  const Tokenizer& tokenizer_;
  Metrics& metrics_;
  EngineOptions options_;
  std::vector<std::int32_t> eos_;
  std::unique_ptr<SequenceCaches> caches_;  ///< the sequences' KV caches and the prefix cache (engine thread)
  std::int64_t next_id_ = 0;                ///< the next started sequence's id (engine thread)
  /// Moving averages of the last decode-only steps' seconds and of the seconds a prompt token adds to a
  /// step (engine thread).
  double decode_seconds_ = 0, prefill_token_seconds_ = 0;

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::unique_ptr<Slot>> queue_;
  bool stopping_ = false;
  std::int64_t running_ = 0;  ///< sequences in slots (guarded by mu_)
  std::vector<std::unique_ptr<Slot>> active_;  ///< engine thread only
  std::thread thread_;
};

}  // namespace woq::server
