#include "server/sequence_caches.h"

#include <array>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <utility>

#include <fmt/core.h>

#include "core/error.h"

namespace woq::server {

enum class SequenceCaches::Op : std::int64_t { kOpen = 1, kStart, kReuse, kKeep, kRelease, kForward, kForwardBatch, kStop };

// One operation as the leader broadcasts it: a fixed header (op, id, a, b, c and the two arrays' lengths),
// then the int64 array and the int32 array when not empty.
struct SequenceCaches::Message {
  Op op{};
  std::int64_t id = 0, a = 0, b = 0, c = 0;
  std::vector<std::int64_t> longs;
  std::vector<std::int32_t> ints;

  static Message receive(Ranks& ranks) {
    std::array<std::int64_t, 7> header{};
    ranks.broadcast(0, std::as_writable_bytes(std::span(header)));
    if (header[0] < static_cast<std::int64_t>(Op::kOpen) || header[0] > static_cast<std::int64_t>(Op::kStop) ||
        header[5] < 0 || header[6] < 0)
      fail("pipeline: rank {} received a malformed operation from rank 0 (op {})", ranks.rank(), header[0]);
    Message m{static_cast<Op>(header[0]), header[1], header[2], header[3], header[4], {}, {}};
    m.longs.resize(static_cast<std::size_t>(header[5]));
    m.ints.resize(static_cast<std::size_t>(header[6]));
    if (!m.longs.empty()) ranks.broadcast(0, std::as_writable_bytes(std::span(m.longs)));
    if (!m.ints.empty()) ranks.broadcast(0, std::as_writable_bytes(std::span(m.ints)));
    return m;
  }
};

namespace {

// What a page counts for in the prefix cache: the whole model's page, on every stage.
std::int64_t model_page_bytes(const ModelConfig& c) {
  return KVCache::bytes_for(c.num_hidden_layers, KVCache::kPageTokens, c.kv_dim());
}

}  // namespace

SequenceCaches::SequenceCaches(LlamaModel& model, std::int64_t cache_bytes, Ranks* pipeline)
    : model_(model),
      pipeline_(pipeline != nullptr && pipeline->size() > 1 ? pipeline : nullptr),
      prefix_(cache_bytes, model_page_bytes(model.config())) {
  if (pipeline_ != nullptr && !pipeline_->leader()) fail("SequenceCaches: only rank 0 leads a pipeline");
  // A sequence's tokens must not depend on its neighbours or prompt chunks, on any stage: with ggml numerics a
  // lone row would otherwise take llama.cpp's one-token order.
  model_.set_batch_invariant(true);
  if (pipeline_ != nullptr) tell({Op::kOpen, 0, cache_bytes, 0, 0, {}, {}});
}

SequenceCaches::~SequenceCaches() {
  if (pipeline_ == nullptr) return;
  try {
    tell({Op::kStop, 0, 0, 0, 0, {}, {}});
  } catch (const std::exception& e) {
    std::fprintf(stderr, "woq: error: pipeline: stopping the other ranks: %s\n", e.what());
  }
}

void SequenceCaches::tell(const Message& m) {
  std::array<std::int64_t, 7> header{static_cast<std::int64_t>(m.op), m.id, m.a, m.b, m.c,
                                     static_cast<std::int64_t>(m.longs.size()), static_cast<std::int64_t>(m.ints.size())};
  pipeline_->broadcast(0, std::as_writable_bytes(std::span(header)));
  // broadcast takes writable bytes on every rank; the root's are only read.
  if (!m.longs.empty()) pipeline_->broadcast(0, std::as_writable_bytes(std::span(const_cast<std::int64_t*>(m.longs.data()), m.longs.size())));
  if (!m.ints.empty()) pipeline_->broadcast(0, std::as_writable_bytes(std::span(const_cast<std::int32_t*>(m.ints.data()), m.ints.size())));
}

KVCache& SequenceCaches::at(std::int64_t id) {
  const auto it = caches_.find(id);
  if (it == caches_.end()) fail("sequence {} has no KV cache", id);
  return it->second;
}

KVCache& SequenceCaches::start(std::int64_t id, std::int64_t capacity) {
  if (caches_.contains(id)) fail("sequence {} already has a KV cache", id);
  KVCache& cache = caches_.emplace(id, model_.make_cache(capacity)).first->second;
  if (pipeline_ != nullptr) tell({Op::kStart, id, capacity, 0, 0, {}, {}});
  return cache;
}

std::int64_t SequenceCaches::reuse(std::int64_t id, std::span<const std::int32_t> prompt, std::int64_t limit,
                                   std::int64_t longer_than) {
  KVCache& cache = at(id);
  KVCache fresh = model_.make_cache(cache.capacity);
  const std::int64_t reused = prefix_.reuse(prompt, limit, fresh, longer_than);
  if (reused > 0) cache = std::move(fresh);
  // A lookup that found nothing changes nothing anywhere: not sent.
  if (pipeline_ != nullptr && reused > 0) tell({Op::kReuse, id, limit, longer_than, reused, {}, {prompt.begin(), prompt.end()}});
  return reused;
}

void SequenceCaches::keep(std::int64_t id, std::span<const std::int32_t> tokens) {
  prefix_.keep(tokens, at(id));
  if (pipeline_ != nullptr) tell({Op::kKeep, id, 0, 0, 0, {}, {tokens.begin(), tokens.end()}});
}

void SequenceCaches::release(std::int64_t id) {
  if (caches_.erase(id) == 0) fail("sequence {} has no KV cache", id);
  if (pipeline_ != nullptr) tell({Op::kRelease, id, 0, 0, 0, {}, {}});
}

template <typename Pass>
void SequenceCaches::pass(Pass&& run) {
  try {
    run();
  } catch (const TransportError& e) {
    if (pipeline_ == nullptr) throw;
    end_pipeline(e);
  } catch (const Error&) {
    throw;  // refused alike by every stage before any transfer (LlamaModel's checks)
  } catch (const std::exception& e) {
    if (pipeline_ == nullptr) throw;
    end_pipeline(e);
  }
}

void SequenceCaches::end_pipeline(const std::exception& e) {
  // The other stages finished their part of this pass or wait for it: the pipeline cannot go on.
  std::fprintf(stderr, "woq: error (rank 0 of %d): a pipeline forward pass failed: %s\n", pipeline_->size(), e.what());
  std::fflush(stderr);
  pipeline_->abort(1);
  std::_Exit(1);  // not reached (the compiler cannot see abort's [[noreturn]] through the virtual call)
}

void SequenceCaches::forward(std::int64_t id, std::span<const std::int32_t> tokens, bool all_logits,
                             std::vector<float>& logits) {
  KVCache& cache = at(id);
  if (pipeline_ != nullptr) tell({Op::kForward, id, all_logits ? 1 : 0, 0, 0, {}, {tokens.begin(), tokens.end()}});
  pass([&] { model_.forward(tokens, cache, all_logits, logits); });
}

void SequenceCaches::forward_batch(std::span<const std::int32_t> tokens, std::span<const std::int64_t> rows,
                                   std::span<const std::int64_t> ids, std::vector<float>& logits) {
  std::vector<KVCache*> caches;
  for (const std::int64_t id : ids) caches.push_back(&at(id));
  if (pipeline_ != nullptr) {
    Message m{Op::kForwardBatch, 0, static_cast<std::int64_t>(ids.size()), 0, 0, {ids.begin(), ids.end()}, {tokens.begin(), tokens.end()}};
    m.longs.insert(m.longs.end(), rows.begin(), rows.end());
    tell(m);
  }
  pass([&] { model_.forward_batch(tokens, rows, caches, logits); });
}

void SequenceCaches::follow(LlamaModel& model, Ranks& ranks) {
  Message m = Message::receive(ranks);
  if (m.op != Op::kOpen) fail("pipeline: rank {} expected rank 0 to open its caches first", ranks.rank());
  SequenceCaches caches(model, m.a);
  std::vector<float> logits;
  for (;;) {
    m = Message::receive(ranks);
    try {
      switch (m.op) {
        case Op::kStart:
          caches.start(m.id, m.a);
          break;
        case Op::kReuse:
          if (const std::int64_t reused = caches.reuse(m.id, m.ints, m.a, m.b); reused != m.c)
            fail("its prefix cache gave sequence {} {} tokens where rank 0's gave {}", m.id, reused, m.c);
          break;
        case Op::kKeep:
          caches.keep(m.id, m.ints);
          break;
        case Op::kRelease:
          caches.release(m.id);
          break;
        case Op::kForward:
        case Op::kForwardBatch: {
          const bool batch = m.op == Op::kForwardBatch;
          if (batch && (m.a < 1 || static_cast<std::int64_t>(m.longs.size()) != 2 * m.a))
            fail("a batch of {} sequences with {} ids and row counts", m.a, m.longs.size());
          const std::span<const std::int64_t> longs(m.longs);
          const auto n = static_cast<std::size_t>(m.a);
          try {
            if (batch) caches.forward_batch(m.ints, longs.subspan(n), longs.first(n), logits);
            else caches.forward(m.id, m.ints, m.a != 0, logits);
          } catch (const TransportError&) {
            throw;  // the ranks may no longer agree: the job ends
          } catch (const Error&) {
            // Refused before any transfer, as rank 0 refused it (it reports to its client).
          }
          break;
        }
        case Op::kStop:
          return;
        case Op::kOpen:
          fail("told to open its caches twice");
      }
    } catch (const Error& e) {
      fail("pipeline: rank {} could not replay rank 0's operation {} on sequence {}: {}", ranks.rank(),
           static_cast<std::int64_t>(m.op), m.id, e.what());
    }
  }
}

}  // namespace woq::server
