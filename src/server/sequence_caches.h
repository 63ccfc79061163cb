// The KV caches of the engine's sequences and its prefix cache behind one seam: every operation that
// writes or shares keys and values passes here, so that the other stages of a pipeline can replay it.
#pragma once

#include <cstdint>
#include <exception>
#include <span>
#include <unordered_map>
#include <vector>

#include "core/ranks.h"
#include "model/kv_cache.h"
#include "model/llama.h"
#include "model/prefix_cache.h"

namespace woq::server {

/// The KV caches of the engine's sequences, by a sequence id the engine chooses, and its prefix cache.
///
/// In a pipeline (`pipeline` of more than one rank, the model's set_pipeline), the engine runs on rank 0 and
/// this object there (the leader) broadcasts each operation to the other ranks, which replay it through
/// follow() on the caches of their own blocks: every stage's caches then hold the same positions, its prefix
/// cache keeps and evicts the same entries (pages count as the whole model's, PrefixCache's page_bytes), and
/// the forward passes meet rank by rank as LlamaModel::set_pipeline requires. A local operation (start,
/// reuse, keep, release) is done before it is broadcast, so one that fails is not replayed; a forward pass
/// is broadcast first, and every stage refuses a bad token id or a full cache alike before any transfer. A
/// failure the other stages cannot share (memory) ends the whole job (Ranks::abort), never a hang.
/// Engine thread only.
class SequenceCaches {
 public:
  /// cache_bytes: the prefix cache's bound (PrefixCache's max_bytes; 0: off). Makes `model`'s passes
  /// batch-invariant (LlamaModel::set_batch_invariant). Leader of a pipeline: tells the followers to begin.
  SequenceCaches(LlamaModel& model, std::int64_t cache_bytes, Ranks* pipeline = nullptr);
  /// Leader of a pipeline: tells the followers to stop (follow() returns).
  ~SequenceCaches();
  SequenceCaches(const SequenceCaches&) = delete;
  SequenceCaches& operator=(const SequenceCaches&) = delete;

  /// A new empty cache for sequence `id` (not in use) of up to `capacity` tokens. Throws woq::Error as
  /// LlamaModel::make_cache does, or for an id in use.
  KVCache& start(std::int64_t id, std::int64_t capacity);
  /// Replaces sequence `id`'s cache by one holding the longest prefix of `prompt` the prefix cache keeps, at
  /// most `limit` tokens and longer than `longer_than` (PrefixCache::reuse); returns its length (0: nothing
  /// changed). The cache keeps its capacity.
  std::int64_t reuse(std::int64_t id, std::span<const std::int32_t> prompt, std::int64_t limit, std::int64_t longer_than);
  /// Keeps the first tokens.size() positions of sequence `id`'s cache, which hold `tokens` (PrefixCache::keep).
  void keep(std::int64_t id, std::span<const std::int32_t> tokens);
  /// Frees sequence `id`'s cache (pages the prefix cache keeps stay).
  void release(std::int64_t id);
  /// LlamaModel::forward on sequence `id`'s cache.
  void forward(std::int64_t id, std::span<const std::int32_t> tokens, bool all_logits, std::vector<float>& logits);
  /// LlamaModel::forward_batch on the caches of sequences `ids` (one per row count).
  void forward_batch(std::span<const std::int32_t> tokens, std::span<const std::int64_t> rows,
                     std::span<const std::int64_t> ids, std::vector<float>& logits);

  const PrefixCache& prefix_cache() const { return prefix_; }

  /// A pipeline stage other than rank 0: replays the leader's operations on `model` (this rank's blocks, its
  /// set_pipeline done) until the leader's SequenceCaches is destroyed. Throws woq::Error when the leader's
  /// and this rank's results differ (the caller ends the job).
  static void follow(LlamaModel& model, Ranks& ranks);

 private:
  enum class Op : std::int64_t;
  struct Message;
  KVCache& at(std::int64_t id);
  /// Leader of a pipeline: sends `m` to every other rank.
  void tell(const Message& m);
  /// Runs a forward pass; in a pipeline, a failure other than a woq::Error refusal every stage makes alike (a
  /// TransportError, memory) ends the job.
  template <typename Pass>
  void pass(Pass&& run);
  /// Leader of a pipeline: says why the pass failed and ends the job.
  [[noreturn]] void end_pipeline(const std::exception& e);

  LlamaModel& model_;
  Ranks* pipeline_;  ///< the ranks when this is a pipeline's leader; null otherwise
  PrefixCache prefix_;
  std::unordered_map<std::int64_t, KVCache> caches_;  ///< by sequence id (references stay valid)
};

}  // namespace woq::server
