#include "server/engine.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "core/memory.h"
#include "generate/generate.h"
#include "generate/decode_step.h"
#include "kernels/ops.h"

namespace woq::server {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// An exponential moving average over the last few samples (the first sets it).
void average(double& mean, double sample) { mean = mean <= 0 ? sample : 0.75 * mean + 0.25 * sample; }

// log-softmax of the chosen token (as woq eval computes it: token_nll) and, when asked, the `top` most likely tokens.
void logprobs_of(const float* logits, std::int64_t vocab, std::int32_t chosen, int top, TokenEvent& ev) {
  const double log_z = log_sum_exp(logits, vocab);
  ev.token = {chosen, static_cast<double>(logits[chosen]) - log_z};
  if (top <= 0) return;
  std::vector<std::int32_t> order(static_cast<std::size_t>(vocab));
  for (std::int32_t v = 0; v < static_cast<std::int32_t>(vocab); ++v) order[static_cast<std::size_t>(v)] = v;
  const auto k = static_cast<std::ptrdiff_t>(std::min<std::int64_t>(top, vocab));
  std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](std::int32_t a, std::int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
  for (std::ptrdiff_t i = 0; i < k; ++i) ev.top.push_back({order[static_cast<std::size_t>(i)], logits[order[static_cast<std::size_t>(i)]] - log_z});
}

}  // namespace

// The decoding choices of a request, its stop ids the model's.
DecodeOptions decode_options(const EngineRequest& r, const std::vector<std::int32_t>& eos) {
  DecodeOptions o;
  o.sampling = r.sampling;
  o.penalties = r.penalties;
  o.presence_penalty = r.presence_penalty;
  o.frequency_penalty = r.frequency_penalty;
  o.stop_ids = eos;
  o.stop_strings = r.stop;
  return o;
}

struct Engine::Slot {
  Slot(std::shared_ptr<EngineRequest> r, const Tokenizer& tokenizer, const std::vector<std::int32_t>& eos)
      : req(std::move(r)), step(tokenizer, decode_options(*req, eos), req->prompt) {}

  std::shared_ptr<EngineRequest> req;
  DecodeStep step;
  std::int64_t id = 0;        ///< its KV cache's in SequenceCaches
  KVCache* cache = nullptr;  ///< SequenceCaches' for `id`, once started
  /// The tokens fed so far: the prompt, then each generated token once a decode step wrote its keys and
  /// values (the cache holds the first cache->size()).
  std::vector<std::int32_t> tokens{req->prompt};
  /// Whether prompt tokens remain to prefill (once all are in, prompt_done samples the first token).
  bool prefilling() const { return cache->size() < static_cast<std::int64_t>(req->prompt.size()); }
  std::int64_t cached = 0;  ///< prompt tokens the prefix cache gave
  std::int64_t generated = 0;
  std::int32_t next = -1;  ///< the token the next decode step feeds
  Clock::time_point submitted = Clock::now(), last_token;
  double first_token_seconds = 0;
  std::vector<TokenEvent> prompt;  ///< prompt_logprobs: FinishEvent::prompt
};

Engine::Engine(LlamaModel& model, const Tokenizer& tokenizer, Metrics& metrics, EngineOptions options)
    : model_(model), tokenizer_(tokenizer), metrics_(metrics), options_(options) {
  if (options_.parallel < 1) fail("--parallel must be >= 1, got {}", options_.parallel);
  if (options_.max_queued < 0) fail("--max-queue must be >= 0, got {}", options_.max_queued);
  if (options_.prompt_logit_floats < 1) fail("prompt_logit_floats must be >= 1, got {}", options_.prompt_logit_floats);
  const bool defaulted = options_.ctx_size == 0;
  if (defaulted) options_.ctx_size = model.context_limit();
  if (options_.ctx_size < 1 || options_.ctx_size > model.context_limit())
    fail("--ctx-size {} is outside [1, {}] (the model's context)", options_.ctx_size, model.context_limit());
  // Caches grow as sequences do, but all `parallel` of them may reach ctx_size at once.
  std::int64_t budget = options_.memory_bytes;
  if (budget == 0) budget = static_cast<std::int64_t>(0.9 * static_cast<double>(available_memory_bytes().value_or(INT64_MAX / 2)));
  const auto gib = [](std::int64_t b) { return static_cast<double>(b) / (1 << 30); };
  // A prefix cache bound given comes out of the budget first; the sequences' caches get the rest.
  if (options_.cache_bytes > budget)
    fail("--cache-gb {:.2f} exceeds the {:.2f} GiB of memory available", gib(options_.cache_bytes), gib(budget));
  const std::int64_t kv_budget = budget - std::max<std::int64_t>(options_.cache_bytes, 0);
  const ModelConfig& c = model.config();
  const std::int64_t per_token = KVCache::bytes_for(c.num_hidden_layers, KVCache::kPageTokens, c.kv_dim()) / KVCache::kPageTokens;
  if (KVCache::bytes_for(c.num_hidden_layers, options_.ctx_size, c.kv_dim()) > kv_budget / options_.parallel) {
    const std::int64_t fits = kv_budget / options_.parallel / per_token / KVCache::kPageTokens * KVCache::kPageTokens;
    if (!defaulted || fits < 1)
      fail("--parallel {} x --ctx-size {} needs {:.2f} GiB of KV cache, but {:.2f} GiB of memory is available for it{}; "
           "lower --ctx-size or --parallel",
           options_.parallel, options_.ctx_size, gib(options_.parallel * KVCache::bytes_for(c.num_hidden_layers, options_.ctx_size, c.kv_dim())),
           gib(kv_budget), options_.cache_bytes > 0 ? " beside --cache-gb" : "");
    options_.ctx_size = fits;
  }
  const std::int64_t caches = options_.parallel * KVCache::bytes_for(c.num_hidden_layers, options_.ctx_size, c.kv_dim());
  if (options_.cache_bytes < 0) options_.cache_bytes = std::clamp<std::int64_t>(budget - caches, 0, caches);
  if (options_.prefill_chunk < kAutoPrefillChunk)
    fail("--prefill-chunk must be >= 0 (or {} for auto), got {}", kAutoPrefillChunk, options_.prefill_chunk);
  caches_ = std::make_unique<SequenceCaches>(model, options_.cache_bytes, options_.pipeline);
  eos_ = end_of_generation_ids(model.config(), tokenizer);
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Engine::submit(std::shared_ptr<EngineRequest> request) { submit_all(std::span(&request, 1)); }

void Engine::submit_all(std::span<const std::shared_ptr<EngineRequest>> requests) {
  const auto count = static_cast<std::int64_t>(requests.size());
  if (count > capacity())
    throw EngineTooLarge(fmt::format("{} prompts in one request; this server holds at most {} at once ({} sequence slots "
                                     "and --max-queue {})", count, capacity(), options_.parallel, options_.max_queued));
  std::vector<std::unique_ptr<Slot>> slots;
  for (const auto& request : requests) {
    const auto n = static_cast<std::int64_t>(request->prompt.size());
    if (n == 0) fail("the prompt has no tokens");
    if (n >= options_.ctx_size)
      fail("the prompt has {} tokens; the context is {} tokens (including at least one generated)", n, options_.ctx_size);
    slots.push_back(std::make_unique<Slot>(request, tokenizer_, eos_));
  }
  {
    std::lock_guard lock(mu_);
    if (stopping_) fail("the server is shutting down");
    // Queued requests that a free slot will take at the next step are not waiting.
    const std::int64_t room = options_.max_queued + std::max<std::int64_t>(0, options_.parallel - running_);
    if (static_cast<std::int64_t>(queue_.size()) + count > room)
      throw EngineBusy(count == 1 ? fmt::format("{} requests are already waiting for one of the {} sequence slots; "
                                                "retry later", queue_.size(), options_.parallel)
                                  : fmt::format("{} requests are already waiting for one of the {} sequence slots, "
                                                "and a batch of {} prompts does not fit beside them; retry later",
                                                queue_.size(), options_.parallel, count));
    for (auto& slot : slots) queue_.push_back(std::move(slot));
    metrics_.set_load(static_cast<std::int64_t>(queue_.size()), metrics_.active());
  }
  wake_.notify_all();
}

void Engine::finish(Slot& slot, const char* reason, std::string error) {
  FinishEvent ev;
  ev.reason = reason;
  ev.error = std::move(error);
  // What the detokenizer and the stop strings still hold ends the text, unless a stop string cut it (as generate()).
  if (ev.reason == "length" || (ev.reason == "stop" && !slot.step.stopped_by_string())) ev.text = slot.step.finish();
  ev.prompt_tokens = static_cast<std::int64_t>(slot.req->prompt.size());
  ev.cached_tokens = slot.cached;
  if (slot.cached > 0) metrics_.prefix_hit(slot.cached);
  ev.completion_tokens = slot.generated;
  ev.first_token_seconds = slot.first_token_seconds;
  ev.seconds = since(slot.submitted);
  if (ev.reason != "cancelled" && ev.reason != "error") ev.prompt = std::move(slot.prompt);
  if (ev.reason == "cancelled") metrics_.cancelled();
  metrics_.tokens(ev.prompt_tokens, ev.completion_tokens);
  if (slot.cache && ev.reason != "error") {  // an error may have left the cache's last pass half written
    caches_->keep(slot.id, std::span(slot.tokens).first(static_cast<std::size_t>(slot.cache->size())));
    metrics_.set_prefix_cache_bytes(caches_->prefix_cache().bytes());
  }
  if (slot.cache) caches_->release(slot.id);
  slot.cache = nullptr;
  if (slot.req->on_finish) slot.req->on_finish(ev);
}

bool Engine::advance(Slot& slot, const float* logits) {
  const EngineRequest& r = *slot.req;
  const std::int64_t vocab = model_.config().vocab_size;
  const DecodeStep::Token next = slot.step.next(std::span(logits, static_cast<std::size_t>(vocab)));
  const std::int32_t id = next.id;
  const auto now = Clock::now();
  if (slot.generated == 0) {
    slot.first_token_seconds = std::chrono::duration<double>(now - slot.submitted).count();
    metrics_.first_token(slot.first_token_seconds);
  } else {
    metrics_.inter_token(std::chrono::duration<double>(now - slot.last_token).count());
  }
  slot.last_token = now;
  if (next.stop_id) {
    finish(slot, "stop");
    return false;
  }
  ++slot.generated;
  TokenEvent ev;
  ev.text = next.text;
  if (r.logprobs || r.top_logprobs > 0) logprobs_of(logits, vocab, id, r.top_logprobs, ev);
  else ev.token.id = id;
  if (r.on_token) r.on_token(ev);
  if (slot.step.stopped_by_string()) {
    finish(slot, "stop");
    return false;
  }
  // The context holds the prompt and every generated token (OpenAI's rule).
  if (slot.generated >= r.max_tokens || static_cast<std::int64_t>(r.prompt.size()) + slot.generated >= options_.ctx_size ||
      slot.cache->size() + 1 > slot.cache->capacity) {
    finish(slot, "length");
    return false;
  }
  slot.next = id;
  return true;
}

void Engine::start(Slot& slot) {
  const EngineRequest& r = *slot.req;
  const auto n = static_cast<std::int64_t>(r.prompt.size());
  slot.id = next_id_++;
  slot.cache = &caches_->start(slot.id, std::min(options_.ctx_size, n + std::max<std::int64_t>(r.max_tokens, 1)));
}

void Engine::reuse_prefix(Slot& slot) {
  const EngineRequest& r = *slot.req;
  // A scored prompt needs the logits of every position: nothing of it can be skipped.
  if (r.prompt_logprobs || slot.cache->size() != slot.cached) return;
  const auto n = static_cast<std::int64_t>(r.prompt.size());
  const std::int64_t reused = caches_->reuse(slot.id, r.prompt, n - 1, slot.cached);
  if (reused > 0) slot.cached = reused;
}

bool Engine::waits_for_leader(const Slot& slot) const {
  const std::vector<std::int32_t>& prompt = slot.req->prompt;
  const auto block = static_cast<std::ptrdiff_t>(PrefixCache::kBlockTokens);
  if (slot.req->prompt_logprobs || slot.cache->size() != slot.cached || std::ssize(prompt) <= block) return false;
  for (const auto& s : active_) {
    if (s.get() == &slot) return false;  // only earlier prompts lead
    if (!s->req) continue;  // ended in this step
    const std::vector<std::int32_t>& other = s->req->prompt;
    // Waiting gains nothing when the leader's prompt could not be kept.
    const ModelConfig& c = model_.config();  // the prefix cache counts the whole model's pages (pipeline stages too)
    const std::int64_t pages = KVCache::bytes_for(c.num_hidden_layers, std::ssize(other), c.kv_dim());
    if (s->prefilling() && !s->req->prompt_logprobs && std::ssize(other) > block && pages <= caches_->prefix_cache().max_bytes() &&
        std::equal(prompt.begin(), prompt.begin() + block, other.begin()))
      return true;
  }
  return false;
}

bool Engine::score_chunk(Slot& slot, std::int64_t& budget) {
  const EngineRequest& r = *slot.req;
  const auto n = static_cast<std::int64_t>(r.prompt.size());
  const std::int64_t vocab = model_.config().vocab_size;
  const std::int64_t begin = slot.cache->size();
  const std::int64_t count = std::min({n - begin, budget, std::max<std::int64_t>(1, options_.prompt_logit_floats / vocab)});
  std::vector<float> logits;
  caches_->forward(slot.id, std::span(r.prompt).subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(count)),
                   true, logits);
  budget -= count;
  slot.prompt.reserve(static_cast<std::size_t>(n - 1));
  for (std::int64_t i = begin; i < begin + count && i + 1 < n; ++i) {
    TokenEvent ev;
    logprobs_of(logits.data() + (i - begin) * vocab, vocab, r.prompt[static_cast<std::size_t>(i + 1)], r.top_logprobs, ev);
    slot.prompt.push_back(std::move(ev));
  }
  return begin + count < n || prompt_done(slot, logits.data() + (count - 1) * vocab);
}

bool Engine::prompt_done(Slot& slot, const float* logits) {
  caches_->keep(slot.id, slot.req->prompt);  // later prompts may share it while this one decodes
  metrics_.set_prefix_cache_bytes(caches_->prefix_cache().bytes());
  if (slot.req->max_tokens <= 0) {
    finish(slot, "length");
    return false;
  }
  return advance(slot, logits);
}

std::int64_t Engine::prefill_budget(bool decoding) const {
  constexpr std::int64_t kWhole = INT64_MAX;
  if (options_.prefill_chunk != kAutoPrefillChunk) return options_.prefill_chunk > 0 ? options_.prefill_chunk : kWhole;
  if (!decoding) return kWhole;
  if (decode_seconds_ <= 0 || prefill_token_seconds_ <= 0) return 16;  // before the first measurements
  return std::max<std::int64_t>(1, static_cast<std::int64_t>(0.75 * decode_seconds_ / prefill_token_seconds_));
}

void Engine::step() {
  std::vector<Slot*> seqs;
  std::vector<std::int32_t> tokens;
  std::vector<std::int64_t> rows;
  std::vector<std::int64_t> ids;
  for (const auto& s : active_)
    if (!s->prefilling()) {
      seqs.push_back(s.get());
      tokens.push_back(s->next);
      rows.push_back(1);
      ids.push_back(s->id);
    }
  const std::size_t decoders = seqs.size();
  std::int64_t budget = prefill_budget(decoders > 0), prompt_tokens = 0;
  for (const auto& s : active_) {
    if (!s->req || !s->prefilling() || budget <= 0) continue;
    // A prompt that starts like one prefilling before it waits for that one's keys and values to be kept.
    if (waits_for_leader(*s)) continue;
    reuse_prefix(*s);  // before its first chunk: what the prefix cache holds of it now
    if (s->req->prompt_logprobs) {
      try {
        if (!score_chunk(*s, budget)) s->req.reset();
      } catch (const std::exception& e) {
        finish(*s, "error", e.what());
        s->req.reset();
      }
      continue;
    }
    const std::span<const std::int32_t> prompt(s->req->prompt);
    const std::int64_t begin = s->cache->size();
    const std::int64_t count = std::min(static_cast<std::int64_t>(prompt.size()) - begin, budget);
    tokens.insert(tokens.end(), prompt.begin() + begin, prompt.begin() + begin + count);
    seqs.push_back(s.get());
    rows.push_back(count);
    ids.push_back(s->id);
    budget -= count;
    prompt_tokens += count;
  }
  if (seqs.empty()) return;
  std::vector<float> logits;
  const auto t0 = Clock::now();
  try {
    caches_->forward_batch(tokens, rows, ids, logits);
  } catch (const std::exception& e) {
    for (Slot* s : seqs) {
      finish(*s, "error", e.what());
      s->req.reset();
    }
    return;
  }
  // The cost of a prompt token beside the decode tokens, at least a quarter of the pass's mean (the
  // chunk grows at most 3x a step when the measured decode time is stale).
  const double seconds = since(t0);
  if (prompt_tokens == 0) average(decode_seconds_, seconds);
  else
    average(prefill_token_seconds_, std::max(seconds - (decoders > 0 ? decode_seconds_ : 0), 0.25 * seconds) /
                                        static_cast<double>(prompt_tokens));
  const std::int64_t vocab = model_.config().vocab_size;
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    Slot& s = *seqs[i];
    const float* row = logits.data() + static_cast<std::int64_t>(i) * vocab;
    if (i < decoders) {
      s.tokens.push_back(s.next);
      if (!advance(s, row)) s.req.reset();
    } else if (!s.prefilling() && !prompt_done(s, row)) {
      s.req.reset();
    }
  }
}

void Engine::loop() {
  for (;;) {
    std::vector<std::unique_ptr<Slot>> admitted;
    {
      std::unique_lock lock(mu_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty() || !active_.empty(); });
      if (stopping_) {
        for (auto& s : queue_) finish(*s, "cancelled");
        for (auto& s : active_) finish(*s, "cancelled");
        queue_.clear();
        active_.clear();
        return;
      }
      while (static_cast<std::int64_t>(active_.size() + admitted.size()) < options_.parallel && !queue_.empty()) {
        admitted.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      running_ = static_cast<std::int64_t>(active_.size() + admitted.size());
      metrics_.set_load(static_cast<std::int64_t>(queue_.size()), running_);
    }
    for (auto& slot : admitted) {
      if (slot->req->cancelled) {
        finish(*slot, "cancelled");
        continue;
      }
      try {
        start(*slot);
        active_.push_back(std::move(slot));
      } catch (const std::exception& e) {
        finish(*slot, "error", e.what());
      }
    }
    std::erase_if(active_, [&](std::unique_ptr<Slot>& s) {
      if (!s->req->cancelled) return false;
      finish(*s, "cancelled");
      return true;
    });
    step();
    std::erase_if(active_, [](const std::unique_ptr<Slot>& s) { return !s->req; });  // ended
    {
      std::lock_guard lock(mu_);
      running_ = static_cast<std::int64_t>(active_.size());
      metrics_.set_load(static_cast<std::int64_t>(queue_.size()), running_);
    }
  }
}

}  // namespace woq::server
