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
  std::optional<KVCache> cache;
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
  const ModelConfig& c = model.config();
  const std::int64_t per_token = KVCache::bytes_for(c.num_hidden_layers, KVCache::kPageTokens, c.kv_dim()) / KVCache::kPageTokens;
  const auto gib = [](std::int64_t b) { return static_cast<double>(b) / (1 << 30); };
  if (KVCache::bytes_for(c.num_hidden_layers, options_.ctx_size, c.kv_dim()) > budget / options_.parallel) {
    const std::int64_t fits = budget / options_.parallel / per_token / KVCache::kPageTokens * KVCache::kPageTokens;
    if (!defaulted || fits < 1)
      fail("--parallel {} x --ctx-size {} needs {:.2f} GiB of KV cache, but {:.2f} GiB of memory is available for it; "
           "lower --ctx-size or --parallel",
           options_.parallel, options_.ctx_size, gib(options_.parallel * KVCache::bytes_for(c.num_hidden_layers, options_.ctx_size, c.kv_dim())),
           gib(budget));
    options_.ctx_size = fits;
  }
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
  ev.completion_tokens = slot.generated;
  ev.first_token_seconds = slot.first_token_seconds;
  ev.seconds = since(slot.submitted);
  if (ev.reason != "cancelled" && ev.reason != "error") ev.prompt = std::move(slot.prompt);
  if (ev.reason == "cancelled") metrics_.cancelled();
  metrics_.tokens(ev.prompt_tokens, ev.completion_tokens);
  slot.cache.reset();
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

bool Engine::start(Slot& slot) {
  const EngineRequest& r = *slot.req;
  const auto n = static_cast<std::int64_t>(r.prompt.size());
  slot.cache.emplace(model_.make_cache(std::min(options_.ctx_size, n + std::max<std::int64_t>(r.max_tokens, 1))));
  std::vector<float> logits;
  if (r.prompt_logprobs) {
    score_prompt(slot, logits);
  } else {
    model_.forward(r.prompt, *slot.cache, false, logits);
  }
  if (r.max_tokens <= 0) {
    finish(slot, "length");
    return false;
  }
  return advance(slot, logits.data());
}

void Engine::score_prompt(Slot& slot, std::vector<float>& last) {
  const EngineRequest& r = *slot.req;
  const auto n = static_cast<std::int64_t>(r.prompt.size());
  const std::int64_t vocab = model_.config().vocab_size;
  const std::int64_t chunk = std::max<std::int64_t>(1, options_.prompt_logit_floats / vocab);
  const std::span<const std::int32_t> prompt(r.prompt);
  std::vector<float> logits;
  slot.prompt.reserve(static_cast<std::size_t>(n - 1));
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    const std::int64_t end = std::min(n, begin + chunk);
    model_.forward(prompt.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(end - begin)), *slot.cache,
                   true, logits);
    for (std::int64_t i = begin; i < end && i + 1 < n; ++i) {
      TokenEvent ev;
      logprobs_of(logits.data() + (i - begin) * vocab, vocab, r.prompt[static_cast<std::size_t>(i + 1)], r.top_logprobs, ev);
      slot.prompt.push_back(std::move(ev));
    }
    if (end == n) last.assign(logits.end() - vocab, logits.end());
  }
}

void Engine::loop() {
  std::vector<float> logits;
  std::vector<std::int32_t> tokens;
  std::vector<KVCache*> caches;
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
    // New sequences: each prefills alone (as it would if it were the only one).
    for (auto& slot : admitted) {
      if (slot->req->cancelled) {
        finish(*slot, "cancelled");
        continue;
      }
      bool running = false;
      try {
        running = start(*slot);
      } catch (const std::exception& e) {
        finish(*slot, "error", e.what());
      }
      if (running) active_.push_back(std::move(slot));
    }
    std::erase_if(active_, [&](std::unique_ptr<Slot>& s) {
      if (!s->req->cancelled) return false;
      finish(*s, "cancelled");
      return true;
    });
    if (active_.empty()) {
      std::lock_guard lock(mu_);
      running_ = 0;
      metrics_.set_load(static_cast<std::int64_t>(queue_.size()), 0);
      continue;
    }
    tokens.clear();
    caches.clear();
    for (const auto& s : active_) {
      tokens.push_back(s->next);
      caches.push_back(&*s->cache);
    }
    try {
      model_.decode_batch(tokens, caches, logits);
    } catch (const std::exception& e) {
      for (auto& s : active_) finish(*s, "error", e.what());
      active_.clear();
      continue;
    }
    const std::int64_t vocab = model_.config().vocab_size;
    std::vector<std::unique_ptr<Slot>> still;
    for (std::size_t i = 0; i < active_.size(); ++i)
      if (advance(*active_[i], logits.data() + static_cast<std::int64_t>(i) * vocab)) still.push_back(std::move(active_[i]));
    active_ = std::move(still);
    {
      std::lock_guard lock(mu_);
      running_ = static_cast<std::int64_t>(active_.size());
      metrics_.set_load(static_cast<std::int64_t>(queue_.size()), running_);
    }
  }
}

}  // namespace woq::server
