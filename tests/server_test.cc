// woq serve's engine and API layer without HTTP: continuous batching gives
// every greedy request the tokens it gets alone; cancellation frees slots;
// request validation names the field.
#include "server/engine.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "eval/tasks.h"
#include "generate/generate.h"
#include "server/openai_api.h"
#include "server/tokenize_api.h"

namespace woq::server {
namespace {

struct Result {
  std::string text;
  std::vector<std::int32_t> ids;
  std::vector<double> logprobs;  ///< with EngineRequest::logprobs
  FinishEvent finish;
};

// A request and a future of its result.
std::pair<std::shared_ptr<EngineRequest>, std::future<Result>> make_request(const Tokenizer& tok, const std::string& prompt,
                                                                            std::int64_t max_tokens, float temperature,
                                                                            std::uint64_t seed) {
  auto promise = std::make_shared<std::promise<Result>>();
  auto result = std::make_shared<Result>();
  auto r = std::make_shared<EngineRequest>();
  r->prompt = tok.encode(prompt);
  r->max_tokens = max_tokens;
  r->sampling = {temperature, 0, 1.0f, seed};
  r->on_token = [result](const TokenEvent& ev) {
    result->text += ev.text;
    result->ids.push_back(ev.token.id);
    result->logprobs.push_back(ev.token.logprob);
  };
  r->on_finish = [result, promise](const FinishEvent& f) {
    result->text += f.text;
    result->finish = f;
    promise->set_value(*result);
  };
  return {r, promise->get_future()};
}

// Submits a request and returns a future of its result.
std::future<Result> submit(Engine& engine, const Tokenizer& tok, const std::string& prompt, std::int64_t max_tokens,
                           float temperature, std::uint64_t seed, std::shared_ptr<EngineRequest>* handle = nullptr) {
  auto [r, result] = make_request(tok, prompt, max_tokens, temperature, seed);
  if (handle) *handle = r;
  engine.submit(r);
  return std::move(result);
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{{LowBit::kSymInt4, 32, Int4Range::kFull}, std::nullopt, std::nullopt, {}}, pool_);
  }
  ThreadPool pool_{2};
  std::unique_ptr<LlamaModel> model_;
  const Tokenizer tok_ = Tokenizer::load(WOQ_MODEL_DIR);
  Metrics metrics_;
};

// The acceptance test of batch invariance at the engine level: 8 requests
// at once (greedy and sampled mixed, different prompt and output lengths),
// each greedy one identical to the same request run alone.
TEST_F(ServerTest, GreedyTokensDoNotDependOnTheBatch) {
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom went to the park",
                                            "One day", "A big red ball", "The sun was hot", "Tim had a toy car", "Sue"};
  std::vector<Result> alone;
  {
    Engine engine(*model_, tok_, metrics_, {1, 0});
    for (std::size_t i = 0; i < prompts.size(); ++i)
      alone.push_back(submit(engine, tok_, prompts[i], 20 + static_cast<std::int64_t>(i) * 7, 0.0f, 0).get());
  }
  Engine engine(*model_, tok_, metrics_, {8, 0});
  for (int round = 0; round < 2; ++round) {
    std::vector<std::future<Result>> greedy, sampled;
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      greedy.push_back(submit(engine, tok_, prompts[i], 20 + static_cast<std::int64_t>(i) * 7, 0.0f, 0));
      sampled.push_back(submit(engine, tok_, prompts[(i + 3) % prompts.size()], 30, 0.9f, 100 + i));
    }
    for (std::size_t i = 0; i < prompts.size(); ++i) {
      const Result r = greedy[i].get();
      EXPECT_EQ(r.ids, alone[i].ids) << prompts[i];
      EXPECT_EQ(r.text, alone[i].text) << prompts[i];
      EXPECT_EQ(r.finish.reason, alone[i].finish.reason);
      EXPECT_GT(r.ids.size(), 0u);
      EXPECT_EQ(sampled[i].get().finish.reason.empty(), false);
    }
  }
  // Seeded sampling is reproducible as well.
  const Result a = submit(engine, tok_, "Once upon a time", 25, 0.8f, 7).get();
  const Result b = submit(engine, tok_, "Once upon a time", 25, 0.8f, 7).get();
  EXPECT_EQ(a.ids, b.ids);
}

// A GGUF file's ggml numerics: forward() takes llama.cpp's one-token order for a lone row (token-by-token
// logits differ from the prompt batch's in their last bits), the engine the batched order for every pass, so
// that its greedy requests still do not depend on the batch.
TEST(ServerGguf, GreedyTokensDoNotDependOnTheBatch) {
  const std::string file = WOQ_TEST_DATA "/gguf_kquant/tiny-Q3_K_M.gguf";
  ThreadPool pool(2);
  auto model = LlamaModel::load(file, {}, pool);
  ASSERT_EQ(model->config().numerics, Numerics::kGgml);
  const std::vector<std::int32_t> ids = {1, 403, 407, 261, 378, 80, 65, 11, 300, 42, 17, 99};
  const auto logits = [&](bool one_by_one) {
    KVCache cache = model->make_cache(16);
    std::vector<float> all, step;
    if (!one_by_one) {
      model->forward(ids, cache, true, all);
      return all;
    }
    for (const std::int32_t id : ids) {
      model->forward(std::span(&id, 1), cache, false, step);
      all.insert(all.end(), step.begin(), step.end());
    }
    return all;
  };
  EXPECT_NE(logits(true), logits(false));  // the one-token order differs (it is checked against ggml elsewhere)
  model->set_batch_invariant(true);
  EXPECT_EQ(logits(true), logits(false));
  model->set_batch_invariant(false);

  const Tokenizer tok = Tokenizer::load(file);
  Metrics metrics;
  const std::vector<std::string> prompts = {"Once upon a time", "The little dog", "Lily and Tom went", "One day"};
  // Greedy, with each token's log-probability (its bits show the order a lone decode step took).
  const auto request = [&](Engine& engine, const std::string& prompt) {
    auto [r, result] = make_request(tok, prompt, 24, 0.0f, 0);
    r->logprobs = true;
    engine.submit(r);
    return std::move(result);
  };
  std::vector<Result> alone;
  {
    Engine engine(*model, tok, metrics, {1, 0});
    for (const std::string& p : prompts) alone.push_back(request(engine, p).get());
  }
  Engine engine(*model, tok, metrics, {4, 0});
  std::vector<std::future<Result>> batched;
  for (const std::string& p : prompts) batched.push_back(request(engine, p));
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const Result r = batched[i].get();
    EXPECT_EQ(r.ids, alone[i].ids) << prompts[i];
    EXPECT_EQ(r.logprobs, alone[i].logprobs) << prompts[i];
  }
}

// A story from the held-out text, cut to about `chars` characters.
std::string story(std::size_t chars) {
  std::ifstream in(WOQ_TEST_DATA "/tinystories_heldout.txt");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return text.substr(0, std::min(chars, text.size()));
}

// Prefix caching and chunked prefill change no token: prompts sharing a long prefix with an earlier
// request (its prompt, or its prompt and generated text, as a chat's next turn) and with each other,
// run 4 at a time with prefills cut in chunks of 5 tokens between decode steps, give exactly the tokens
// each gets alone on an engine without a prefix cache; the reused tokens are reported per request and
// in /metrics.
TEST_F(ServerTest, PrefixCacheAndChunkedPrefillGiveTheColdTokens) {
  const std::string base = story(900);
  std::vector<std::string> prompts = {base, base + " The end.", base + " Then", base.substr(0, 600) + " Tom was sad."};
  EngineOptions cold_options{.parallel = 1, .prefill_chunk = 0, .cache_bytes = 0};
  Engine cold(*model_, tok_, metrics_, cold_options);
  const Result first = submit(cold, tok_, base, 24, 0.0f, 0).get();
  EXPECT_EQ(first.finish.cached_tokens, 0);
  prompts.push_back(base + first.text + " Next day");  // a chat's next turn: the generated tokens' KV reused
  std::vector<Result> alone;
  for (const std::string& p : prompts) alone.push_back(submit(cold, tok_, p, 24, 0.0f, 0).get());

  Metrics metrics;
  Engine warm(*model_, tok_, metrics, {.parallel = 4, .prefill_chunk = 5});
  EXPECT_GT(warm.cache_bytes(), 0);
  const Result again = submit(warm, tok_, base, 24, 0.0f, 0).get();
  EXPECT_EQ(again.ids, first.ids);
  EXPECT_EQ(again.finish.cached_tokens, 0);
  std::vector<std::future<Result>> futures;
  for (const std::string& p : prompts) futures.push_back(submit(warm, tok_, p, 24, 0.0f, 0));
  const auto base_tokens = static_cast<std::int64_t>(tok_.encode(base).size());
  std::int64_t hits = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    const Result r = futures[i].get();
    EXPECT_EQ(r.ids, alone[i].ids) << i;
    EXPECT_EQ(r.text, alone[i].text) << i;
    EXPECT_GT(r.finish.cached_tokens, i == 3 ? base_tokens / 2 : base_tokens - 3) << i;
    EXPECT_LT(r.finish.cached_tokens, r.finish.prompt_tokens) << i;
    hits += r.finish.cached_tokens;
  }
  EXPECT_NE(metrics.text().find(fmt::format("woq_prefix_cache_hit_tokens_total {}\n", hits)), std::string::npos)
      << metrics.text();

  // Prompts with the same start arriving together: the first prefills it, the others wait for it to be kept
  // and take it (as 8 clients behind one system prompt), with the same tokens.
  Engine together(*model_, tok_, metrics, {.parallel = 4});
  std::vector<std::future<Result>> wave;
  std::vector<std::shared_ptr<EngineRequest>> requests;
  for (std::size_t i = 0; i < 4; ++i) {
    auto [r, result] = make_request(tok_, prompts[i], 24, 0.0f, 0);
    requests.push_back(r);
    wave.push_back(std::move(result));
  }
  together.submit_all(requests);
  for (std::size_t i = 0; i < 4; ++i) {
    const Result r = wave[i].get();
    EXPECT_EQ(r.ids, alone[i].ids) << i;
    if (i > 0) {
      EXPECT_GT(r.finish.cached_tokens, base_tokens / 2) << i;
    }
  }
}

// The first generated piece keeps its leading space: the same text as woq generate.
TEST_F(ServerTest, CompletionTextContinuesThePromptLikeGenerate) {
  Engine engine(*model_, tok_, metrics_, {2, 0});
  for (const std::string prompt : {"Once upon a time there", "Once", "Lily and"}) {
    GenerateOptions o;
    o.max_new_tokens = 6;
    o.sampling.temperature = 0;
    const GenerateResult want = generate(*model_, tok_, prompt, o, [](std::string_view) {});
    const Result got = submit(engine, tok_, prompt, 6, 0.0f, 0).get();
    EXPECT_EQ(got.text, want.text) << prompt;
    EXPECT_EQ(got.text.substr(0, 1), " ") << prompt;
  }
}

// echo with logprobs (lm-eval's loglikelihood request): the prompt's log-probabilities come from the
// same prefill and equal what woq eval computes (eval's loglikelihood) for a context and continuation, bit
// for bit; with max_tokens 0 nothing is generated, with 1 the first token is the one a plain request gets;
// chunks of the prefill (a small kMaxPromptLogitFloats would cut a long prompt) give the same numbers.
TEST_F(ServerTest, PromptLogprobsEqualEvalsLoglikelihood) {
  Engine engine(*model_, tok_, metrics_, {2, 0});
  Engine three_at_a_time(*model_, tok_, metrics_, {1, 0, 0, 256, 3 * model_->config().vocab_size});
  const auto score = [&](Engine& e, const std::vector<std::int32_t>& prompt, std::int64_t max_tokens, int top) {
    auto promise = std::make_shared<std::promise<FinishEvent>>();
    auto text = std::make_shared<std::string>();
    auto r = std::make_shared<EngineRequest>();
    r->prompt = prompt;
    r->max_tokens = max_tokens;
    r->sampling = {0.0f, 0, 1.0f, 1};
    r->logprobs = true;
    r->top_logprobs = top;
    r->prompt_logprobs = true;
    r->on_token = [text](const TokenEvent& ev) { *text += ev.text; };
    r->on_finish = [promise, text](const FinishEvent& f) {
      FinishEvent g = f;
      g.text = *text + f.text;  // the whole completion
      promise->set_value(g);
    };
    e.submit(r);
    return promise->get_future().get();
  };
  for (const auto& [context, continuation] : std::vector<std::pair<std::string, std::string>>{
           {"Once upon a time, there was a little girl named Lily. She", " liked to play outside."},
           {"Tom had a red ball.", " He threw it to his dog"}}) {
    const std::vector<std::int32_t> ctx_ids = tok_.encode(context), all = tok_.encode(context + continuation);
    ASSERT_GT(all.size(), ctx_ids.size());
    const FinishEvent f = score(engine, all, 0, 2);
    EXPECT_EQ(f.reason, "length");
    EXPECT_EQ(f.completion_tokens, 0);
    ASSERT_EQ(f.prompt.size(), all.size() - 1);
    double sum = 0;
    for (std::size_t i = ctx_ids.size(); i < all.size(); ++i) {
      EXPECT_EQ(f.prompt[i - 1].token.id, all[i]);
      ASSERT_EQ(f.prompt[i - 1].top.size(), 2u);
      EXPECT_GE(f.prompt[i - 1].top[0].logprob, f.prompt[i - 1].token.logprob);
      sum += f.prompt[i - 1].token.logprob;
    }
    EXPECT_EQ(sum, woq::loglikelihood(*model_, tok_, context, continuation)) << context;
    const FinishEvent one = score(engine, all, 1, 1);
    EXPECT_EQ(one.completion_tokens, 1);
    ASSERT_EQ(one.prompt.size(), f.prompt.size());
    for (std::size_t i = 0; i < f.prompt.size(); ++i) EXPECT_EQ(one.prompt[i].token.logprob, f.prompt[i].token.logprob);
    const FinishEvent chunked = score(three_at_a_time, all, 0, 2);  // prefilled 3 tokens at a time
    ASSERT_EQ(chunked.prompt.size(), f.prompt.size());
    for (std::size_t i = 0; i < f.prompt.size(); ++i) EXPECT_EQ(chunked.prompt[i].token.logprob, f.prompt[i].token.logprob);
    GenerateOptions o;
    o.max_new_tokens = 1;
    o.sampling.temperature = 0;
    EXPECT_EQ(one.text, generate(*model_, tok_, context + continuation, o, [](std::string_view) {}).text);
  }
}

// The server's decoding is the CLI's (one DecodeStep): with llama.cpp's repeat penalty over a window (the prompt's
// tokens included) and OpenAI's presence/frequency penalties, a request gives generate()'s tokens, and the
// penalties change them (greedy stories260K repeats itself without them).
TEST_F(ServerTest, PenaltiesGiveGeneratesTokens) {
  Engine engine(*model_, tok_, metrics_, {2, 0});
  const std::string prompt = "Once upon a time there was a little girl. The little girl";
  struct Case {
    Penalties window;
    float presence, frequency;
  };
  std::vector<std::vector<std::int32_t>> outputs;
  for (const Case& c : {Case{{1.0f, 64, 0.0f, 0.0f}, 0.0f, 0.0f}, Case{{1.5f, 16, 0.0f, 0.0f}, 0.0f, 0.0f},
                        Case{{1.3f, 64, 0.2f, 0.1f}, 0.0f, 0.0f}, Case{{1.0f, 64, 0.0f, 0.0f}, 1.5f, 0.5f}}) {
    auto r = std::make_shared<EngineRequest>();
    r->prompt = tok_.encode(prompt);
    r->max_tokens = 40;
    r->sampling = {0.0f, 0, 1.0f, 0};
    r->penalties = c.window;
    r->presence_penalty = c.presence;
    r->frequency_penalty = c.frequency;
    auto promise = std::make_shared<std::promise<std::vector<std::int32_t>>>();
    auto ids = std::make_shared<std::vector<std::int32_t>>();
    r->on_token = [ids](const TokenEvent& ev) { ids->push_back(ev.token.id); };
    r->on_finish = [ids, promise](const FinishEvent&) { promise->set_value(*ids); };
    engine.submit(r);
    const std::vector<std::int32_t> got = promise->get_future().get();
    if (c.presence == 0.0f) {  // generate() has llama.cpp's penalties (OpenAI's are the server's own)
      GenerateOptions o;
      o.max_new_tokens = 40;
      o.sampling.temperature = 0;
      o.penalties = c.window;
      EXPECT_EQ(got, generate(*model_, tok_, prompt, o, [](std::string_view) {}).generated_ids)
          << "repeat " << c.window.repeat << " last_n " << c.window.last_n;
    }
    for (const auto& earlier : outputs) EXPECT_NE(got, earlier) << "a penalty changed nothing";
    outputs.push_back(got);
  }
}

// A stop string half matched when the end-of-sequence token comes: the held text ends the completion, as in
// generate() ("...happily " + "ever after." with the stop "ever after.XYZ").
TEST_F(ServerTest, HeldTextEndsTheCompletionAtEos) {
  Engine engine(*model_, tok_, metrics_, {1, 0});
  for (const std::string stop : {"ever after.XYZ", "Lily and Ben are best friends. The"}) {
    GenerateOptions o;
    o.max_new_tokens = 400;
    o.sampling.temperature = 0;
    o.stop_strings = {stop};
    const GenerateResult want = generate(*model_, tok_, "Once upon a time", o, [](std::string_view) {});
    auto r = std::make_shared<EngineRequest>();
    r->prompt = tok_.encode("Once upon a time");
    r->max_tokens = 400;
    r->sampling = {0.0f, 0, 1.0f, 0};
    r->stop = {stop};
    auto promise = std::make_shared<std::promise<std::string>>();
    auto text = std::make_shared<std::string>();
    r->on_token = [text](const TokenEvent& ev) { *text += ev.text; };
    r->on_finish = [text, promise](const FinishEvent& f) { promise->set_value(*text + f.text); };
    engine.submit(r);
    EXPECT_EQ(promise->get_future().get(), want.text) << stop;
    if (stop == "ever after.XYZ") {
      EXPECT_TRUE(want.stop_token >= 0) << "the case needs the end-of-sequence token to end it";
      EXPECT_EQ(want.text.substr(want.text.size() - 11), "ever after.");
    }
  }
}

TEST_F(ServerTest, CancelledRequestsFreeTheirSlot) {
  Engine engine(*model_, tok_, metrics_, {1, 0});
  std::shared_ptr<EngineRequest> first;
  auto running = submit(engine, tok_, "Once upon a time", 400, 0.0f, 0, &first);
  auto queued = submit(engine, tok_, "The little dog", 5, 0.0f, 0);  // waits for the only slot
  first->cancelled = true;
  EXPECT_EQ(running.get().finish.reason, "cancelled");
  const Result next = queued.get();
  EXPECT_EQ(next.finish.reason, "length");
  EXPECT_EQ(next.ids.size(), 5u);
  // The engine updates its gauges after the step that finished the request.
  for (int i = 0; i < 100 && metrics_.active() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metrics_.active(), 0);
  EXPECT_NE(metrics_.text().find("woq_cancelled_total 1"), std::string::npos);
  // A cancelled request with nothing else to run: the gauge drops to 0 without a later request.
  std::shared_ptr<EngineRequest> lone;
  auto alone = submit(engine, tok_, "Once upon a time", 400, 0.0f, 0, &lone);
  for (int i = 0; i < 100 && metrics_.active() != 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  lone->cancelled = true;
  EXPECT_EQ(alone.get().finish.reason, "cancelled");
  for (int i = 0; i < 100 && metrics_.active() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(metrics_.active(), 0);
}

TEST_F(ServerTest, StopsAtStopStringsEosAndTheContext) {
  Engine engine(*model_, tok_, metrics_, {2, 12});
  const Result r = submit(engine, tok_, "Once upon a time", 100, 0.0f, 0).get();
  EXPECT_EQ(r.finish.reason, "length");
  EXPECT_EQ(r.finish.prompt_tokens + r.finish.completion_tokens, 12);  // the context (--ctx-size) ends it
  auto req = std::make_shared<EngineRequest>();
  req->prompt = std::vector<std::int32_t>(12, 1);
  EXPECT_THROW(engine.submit(req), Error);  // prompt fills the context
  req->prompt.clear();
  EXPECT_THROW(engine.submit(req), Error);
  req->prompt = {1, 400};
  req->stop = {"\x80"};
  EXPECT_THROW(engine.submit(req), Error);
}

// --parallel x --ctx-size is checked against the memory budget at startup: a
// given context that cannot fit is an error, the model's default is lowered.
TEST_F(ServerTest, KvCacheBudgetIsCheckedAtStartup) {
  const ModelConfig& c = model_->config();
  const std::int64_t page = KVCache::bytes_for(c.num_hidden_layers, KVCache::kPageTokens, c.kv_dim());
  ASSERT_GT(model_->context_limit(), KVCache::kPageTokens);
  // Room for 4 sequences of one page each.
  EXPECT_THROW(Engine(*model_, tok_, metrics_, {4, model_->context_limit(), 4 * page}), Error);
  {
    Engine engine(*model_, tok_, metrics_, {4, 0, 4 * page});
    EXPECT_EQ(engine.ctx_size(), KVCache::kPageTokens);
    EXPECT_EQ(submit(engine, tok_, "Once upon a time", 5, 0.0f, 0).get().finish.completion_tokens, 5);
  }
  EXPECT_THROW(Engine(*model_, tok_, metrics_, {4, 0, 3 * page}), Error);  // not one page each
  Engine roomy(*model_, tok_, metrics_, {4, 0, 0});                         // 90 % of what the machine has
  EXPECT_EQ(roomy.ctx_size(), model_->context_limit());
  // The prefix cache: by default what the budget leaves (none here); a bound given comes out of the budget
  // first, lowering a default context, and one beyond the budget is refused.
  EXPECT_EQ(Engine(*model_, tok_, metrics_, {4, 0, 4 * page}).cache_bytes(), 0);
  ASSERT_EQ(model_->context_limit(), 2 * KVCache::kPageTokens);  // 4 full caches: 8 pages
  EXPECT_EQ(Engine(*model_, tok_, metrics_, {4, 0, 12 * page}).cache_bytes(), 4 * page);
  EXPECT_EQ(Engine(*model_, tok_, metrics_, {4, 0, 20 * page}).cache_bytes(), 8 * page);  // at most what the caches take
  {
    Engine given(*model_, tok_, metrics_, {.parallel = 4, .memory_bytes = 8 * page, .cache_bytes = 4 * page});
    EXPECT_EQ(given.ctx_size(), KVCache::kPageTokens);
    EXPECT_EQ(given.cache_bytes(), 4 * page);
  }
  EXPECT_THROW(Engine(*model_, tok_, metrics_, {.parallel = 4, .memory_bytes = 8 * page, .cache_bytes = 9 * page}), Error);
  EXPECT_THROW(Engine(*model_, tok_, metrics_, {.parallel = 4, .ctx_size = 2 * KVCache::kPageTokens,
                                                .memory_bytes = 8 * page, .cache_bytes = 4 * page}), Error);
}

// At most max_queued requests wait for a slot; more are refused with EngineBusy.
TEST_F(ServerTest, QueueIsBounded) {
  Engine engine(*model_, tok_, metrics_, {1, 0, 0, 2});
  std::vector<std::future<Result>> accepted;
  int busy = 0;
  std::shared_ptr<EngineRequest> first;
  accepted.push_back(submit(engine, tok_, "Once upon a time", 400, 0.9f, 1, &first));
  for (int i = 0; i < 4; ++i) {
    try {
      accepted.push_back(submit(engine, tok_, "Once upon a time", 4, 0.0f, 0));
    } catch (const EngineBusy&) {
      ++busy;
    }
  }
  EXPECT_GE(busy, 2);  // one running + two waiting of five
  first->cancelled = true;
  for (auto& f : accepted) f.get();
  // max_queued 0: a request that a free slot takes is not waiting.
  Engine no_queue(*model_, tok_, metrics_, {2, 0, 0, 0});
  EXPECT_EQ(submit(no_queue, tok_, "Once upon a time", 3, 0.0f, 0).get().finish.completion_tokens, 3);
}

// A batch of prompts is queued whole or not at all: more than parallel + max_queued is EngineTooLarge, one that
// does not fit beside the waiting requests EngineBusy, and neither leaves any of its prompts in the queue.
TEST_F(ServerTest, BatchIsQueuedWholeOrNotAtAll) {
  Engine engine(*model_, tok_, metrics_, {1, 0, 0, 2});
  const auto batch = [&](std::size_t n) {
    std::vector<std::shared_ptr<EngineRequest>> requests;
    for (std::size_t i = 0; i < n; ++i) {
      auto r = std::make_shared<EngineRequest>();
      r->prompt = tok_.encode("Once upon a time");
      r->max_tokens = 2;
      requests.push_back(r);
    }
    return requests;
  };
  EXPECT_THROW(engine.submit_all(batch(4)), EngineTooLarge);
  EXPECT_EQ(metrics_.queued(), 0);
  std::shared_ptr<EngineRequest> first;
  auto running = submit(engine, tok_, "Once upon a time", 400, 0.9f, 1, &first);
  for (int i = 0; i < 100 && metrics_.active() != 1; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto waiting = submit(engine, tok_, "Once upon a time", 2, 0.0f, 0);
  EXPECT_THROW(engine.submit_all(batch(2)), EngineBusy);  // one slot busy, one of two queue places taken
  EXPECT_EQ(metrics_.queued(), 1);
  first->cancelled = true;
  running.get();
  waiting.get();
  for (int i = 0; i < 100 && metrics_.active() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::vector<std::promise<void>> done(3);
  auto fits = batch(3);
  for (std::size_t i = 0; i < fits.size(); ++i) fits[i]->on_finish = [&done, i](const FinishEvent&) { done[i].set_value(); };
  engine.submit_all(fits);
  for (auto& d : done) d.get_future().wait();
}

// Request bodies are parsed within budgets: depth, values, messages.
TEST(OpenAiApi, BodiesOverTheBudgetsAreRefused) {
  const auto status_of = [](const std::string& body) {
    try {
      parse_request(body, true, "m");
    } catch (const ApiError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  std::string deep = R"({"messages":[{"role":"user","content":"hi","x":)";
  for (int i = 0; i < 20000; ++i) deep += '[';
  for (int i = 0; i < 20000; ++i) deep += ']';
  deep += "}]}";
  EXPECT_NE(status_of(deep).find("nested deeper than 64"), std::string::npos) << status_of(deep);
  std::string many = R"({"messages":[)";
  for (std::size_t i = 0; i < kMaxJsonValues; ++i) many += "{},";
  many += "{}]}";
  EXPECT_NE(status_of(many).find("too many JSON values"), std::string::npos);
  std::string messages = R"({"messages":[)";
  for (std::size_t i = 0; i <= kMaxMessages; ++i) messages += std::string(i ? "," : "") + R"({"role":"user","content":"a"})";
  messages += "]}";
  EXPECT_NE(status_of(messages).find("at most 4096"), std::string::npos) << status_of(messages);
  EXPECT_EQ(status_of(R"({"messages":[{"role":"user","content":"hi","x":[[[[1]]]]}]})"), "accepted");
  // Keys of one object (logit_bias with 200 000 keys took 39 s to parse), refused before parsing.
  std::string keys = R"({"messages":[{"role":"user","content":"hi"}],"logit_bias":{)";
  for (std::size_t i = 0; i <= kMaxJsonKeys; ++i) keys += fmt::format("{}\"{}\":0", i ? "," : "", i);
  keys += "}}";
  EXPECT_NE(status_of(keys).find("too many keys (at most 4096)"), std::string::npos) << status_of(keys);
  // Fields of the wrong type where a string is compared are 400s, not escaping type errors (found by fuzz/).
  EXPECT_NE(status_of(R"({"messages":[{"role":"user","content":[{"type":1,"text":"x"}]}]})").find("messages[0].content"), std::string::npos);
  EXPECT_NE(status_of(R"({"messages":[{"role":"user","content":"x"}],"response_format":{"type":1}})").find("response_format"), std::string::npos);
}

TEST(OpenAiApi, ValidatesFieldsAndDefaults) {
  auto error_of = [](const std::string& body, bool chat) {
    try {
      parse_request(body, chat, "m");
    } catch (const ApiError& e) {
      return std::to_string(e.status) + " " + e.param + ": " + e.what();
    }
    return std::string("ok");
  };
  EXPECT_EQ(error_of(R"({"prompt": "x"})", false), "ok");
  EXPECT_EQ(error_of(R"({"prompt": "x", "model": "other"})", false).substr(0, 9), "404 model");
  EXPECT_EQ(error_of(R"({"prompt": "x", "temperature": "hot"})", false), "400 temperature: 'temperature' must be a number, not string");
  EXPECT_EQ(error_of(R"({"prompt": "x", "temperature": 3})", false), "400 temperature: 'temperature' is 3; it must be in [0, 2]");
  EXPECT_EQ(error_of(R"({"prompt": "x", "max_tokens": -1})", false).substr(0, 14), "400 max_tokens");
  EXPECT_EQ(error_of(R"({"prompt": "x", "n": 2})", false), "400 n: only n = 1 is supported");
  // prompt: a string, token ids, or a batch of either (lm-eval's local-completions sends [[ids], [ids], ...]).
  EXPECT_EQ(parse_request(R"({"prompt": [1, 2]})", false, "m").prompts[0].ids, (std::vector<std::int32_t>{1, 2}));
  EXPECT_EQ(parse_request(R"({"prompt": [[3, 4]]})", false, "m").prompts[0].ids, (std::vector<std::int32_t>{3, 4}));
  EXPECT_EQ(parse_request(R"({"prompt": [[3, 4]]})", false, "m").prompts[0].param, "prompt[0]");
  EXPECT_EQ(parse_request(R"({"prompt": ["a b"]})", false, "m").prompts[0].text, "a b");
  const ApiRequest batch = parse_request(R"({"prompt": [[1], "two", [3, 4]]})", false, "m");
  ASSERT_EQ(batch.prompts.size(), 3u);
  EXPECT_EQ(batch.prompts[1].text, "two");
  EXPECT_FALSE(batch.prompts[1].ids);
  EXPECT_EQ(batch.prompts[2].ids, (std::vector<std::int32_t>{3, 4}));
  EXPECT_EQ(batch.prompts[2].param, "prompt[2]");
  std::string many = R"({"prompt": [)";
  for (std::size_t i = 0; i <= kMaxBatchPrompts; ++i) many += i == 0 ? "[1]" : ",[1]";
  EXPECT_EQ(error_of(many + "]}", false).substr(0, 49), "400 prompt: 'prompt' holds a batch of 257 prompts");
  EXPECT_EQ(error_of(R"({"prompt": [[1], 2]})", false), "400 prompt[1]: 'prompt[1]' must be a string or a list of token ids, not number");
  EXPECT_EQ(error_of(R"({"prompt": ["a", "b"], "stream": true})", false).substr(0, 10), "400 stream");
  EXPECT_EQ(error_of(R"({"prompt": [1, -2]})", false), "400 prompt[1]: 'prompt[1]' is -2, not a token id");
  EXPECT_EQ(error_of(R"({"prompt": [[1, 2.5]]})", false), "400 prompt[0][1]: 'prompt[0][1]' must be an integer token id, not number");
  EXPECT_EQ(error_of(R"({"prompt": [[]]})", false), "400 prompt[0]: 'prompt[0]' is an empty list of token ids");
  EXPECT_EQ(error_of(R"({"prompt": [1, 4294967296]})", false).substr(0, 13), "400 prompt[1]");
  EXPECT_EQ(error_of(R"({"prompt": []})", false).substr(0, 10), "400 prompt");
  EXPECT_EQ(error_of(R"({"prompt": [{}]})", false).substr(0, 10), "400 prompt");
  EXPECT_EQ(error_of(R"({"prompt": "x", "stop": [1]})", false).substr(0, 8), "400 stop");
  EXPECT_EQ(error_of(R"([1])", false), "400 : the request body must be a JSON object");
  EXPECT_EQ(error_of(R"({"messages": []})", true), "400 messages: 'messages' must be a non-empty list");
  EXPECT_EQ(error_of(R"({"messages": [{"content": "x"}]})", true), "400 messages[0].role: 'messages[0].role' must be a string");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", true).substr(0, 23),
            "400 messages[0].content");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})", true).substr(0, 16),
            "400 top_logprobs");
  EXPECT_TRUE(parse_request(R"({"prompt": "x", "echo": true, "max_tokens": 0, "logprobs": 1})", false, "m").echo);
  EXPECT_EQ(error_of(R"({"prompt": "x", "echo": true, "stream": true})", false),
            "400 echo: 'echo' with 'stream' is not supported by woq serve");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", true),
            "400 echo: 'echo' is not supported by woq serve");
  EXPECT_EQ(error_of(R"({"prompt": "x", "echo": false, "logit_bias": {}, "best_of": 1})", false), "ok");
  EXPECT_EQ(error_of(R"({"prompt": "x", "logit_bias": {"5": 10}})", false).substr(0, 14), "400 logit_bias");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", true).substr(0, 9),
            "400 tools");
  EXPECT_EQ(error_of(R"({"prompt": "x", "stream_options": {"include_usage": 1}})", false).substr(0, 32),
            "400 stream_options.include_usage");
  EXPECT_EQ(error_of(R"({"prompt": "x", "top_p": 0})", false), "400 top_p: 'top_p' must be in (0, 1]");
  EXPECT_EQ(error_of(R"({"prompt": "x", "repeat_penalty": 0})", false).substr(0, 18), "400 repeat_penalty");
  EXPECT_EQ(error_of(R"({"prompt": "x", "repeat_penalty": 1.1, "repetition_penalty": 1.1})", false).substr(0, 22),
            "400 repetition_penalty");
  EXPECT_EQ(error_of(R"({"prompt": "x", "repeat_last_n": -2})", false).substr(0, 17), "400 repeat_last_n");
  EXPECT_EQ(error_of(R"({"prompt": "x", "repetition_penalty": 1.2, "repeat_last_n": 8})", false).substr(0, 17),
            "400 repeat_last_n");
  {
    const ApiRequest llama = parse_request(R"({"prompt": "x", "repeat_penalty": 1.25, "repeat_last_n": 8})", false, "m");
    EXPECT_EQ(llama.penalties.repeat, 1.25f);
    EXPECT_EQ(llama.penalties.last_n, 8);
    const ApiRequest all = parse_request(R"({"prompt": "x", "repeat_penalty": 1.25, "repeat_last_n": -1})", false, "m");
    EXPECT_EQ(all.penalties.last_n, -1);  // every token, as llama-server
    const ApiRequest vllm = parse_request(R"({"prompt": "x", "repetition_penalty": 1.5})", false, "m");
    EXPECT_EQ(vllm.penalties.repeat, 1.5f);
    EXPECT_EQ(vllm.penalties.last_n, -1);
    const ApiRequest neutral = parse_request(R"({"prompt": "x", "repeat_penalty": 1.2, "repetition_penalty": 1.0})", false, "m");
    EXPECT_EQ(neutral.penalties.repeat, 1.2f);
    EXPECT_EQ(neutral.penalties.last_n, 64);
    EXPECT_FALSE(parse_request(R"({"prompt": "x"})", false, "m").penalties.active());
  }
  EXPECT_EQ(error_of("{\"prompt\": ", false).find("[json.exception"), std::string::npos);
  const ApiRequest r = parse_request(
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
          "max_completion_tokens": 9, "stop": "x", "stream": true, "stream_options": {"include_usage": true}, "seed": 5})",
      true, "m");
  EXPECT_EQ(r.messages[0]["content"], "ab");
  EXPECT_EQ(r.max_tokens, 9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"x"});
  EXPECT_TRUE(r.stream && r.include_usage);
  EXPECT_EQ(r.sampling.seed, 5u);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 1.0f);  // OpenAI's default
  EXPECT_EQ(parse_request(R"({"prompt": "x"})", false, "m").max_tokens, 16);  // completions' default
  EXPECT_EQ(parse_request(R"({"messages": [{"role": "user", "content": "x"}]})", true, "m").max_tokens, -1);
}

// The tokenizer endpoints, as lm-eval's remote tokenizer calls them: /tokenizer_info's
// eos_token tokenized without special tokens gives the EOS id; /tokenize's ids are the
// tokenizer's (with or without special tokens) and, for messages, what a chat completion
// prefills; /detokenize inverts /tokenize; every refusal names its field.
TEST(TokenizeApi, AnswersAsLmEvalsRemoteTokenizerReadsThem) {
  const Tokenizer tok = Tokenizer::load(WOQ_MODEL_DIR);
  const ChatTemplate chat = ChatTemplate::load(WOQ_MODEL_DIR);
  const std::string m = "m";
  const auto info = tokenizer_info(tok, chat, 512);
  ASSERT_TRUE(info["eos_token"].is_string());
  const auto ids_of = [&](const std::string& body) {
    return tokenize(body, tok, chat, 512, 1 << 20, m)["tokens"].get<std::vector<std::int32_t>>();
  };
  const nlohmann::json eos_text = info["eos_token"];
  EXPECT_EQ(ids_of(nlohmann::json{{"prompt", eos_text}, {"add_special_tokens", false}}.dump()),
            std::vector<std::int32_t>{tok.eos_id()});
  EXPECT_EQ(info["bos_token"], tok.token_text(tok.bos_id()));
  EXPECT_EQ(info["chat_template"], chat.source());
  EXPECT_EQ(info["model_max_length"], 512);

  const std::string text = "Once upon a time, Lily saw a big dog.";
  const auto with = tokenize(nlohmann::json{{"prompt", text}, {"model", "m"}}.dump(), tok, chat, 512, 1 << 20, m);
  EXPECT_EQ(with["tokens"].get<std::vector<std::int32_t>>(), tok.encode(text, true));
  EXPECT_EQ(with["count"], tok.encode(text, true).size());
  EXPECT_EQ(with["max_model_len"], 512);
  EXPECT_TRUE(with["token_strs"].is_null());
  const auto without = ids_of(nlohmann::json{{"prompt", text}, {"add_special_tokens", false}}.dump());
  EXPECT_EQ(without, tok.encode(text, false));
  EXPECT_NE(without, tok.encode(text, true));  // stories260K adds BOS: the flag matters here

  const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi there"}])");
  EXPECT_EQ(ids_of(nlohmann::json{{"messages", messages}}.dump()), tok.encode_with_special(chat.render(messages, true)));
  EXPECT_EQ(ids_of(nlohmann::json{{"messages", messages}, {"add_generation_prompt", false}}.dump()),
            tok.encode_with_special(chat.render(messages, false)));

  EXPECT_EQ(detokenize(nlohmann::json{{"tokens", without}}.dump(), tok, m)["prompt"], text);

  const auto error_of = [&](const std::string& body, bool detok = false) {
    try {
      if (detok) {
        detokenize(body, tok, m);
      } else {
        tokenize(body, tok, chat, 512, 64, m);
      }
    } catch (const ApiError& e) {
      return std::to_string(e.status) + " " + e.param + ": " + e.what();
    }
    return std::string("ok");
  };
  EXPECT_EQ(error_of(R"({"prompt": "x"})"), "ok");
  EXPECT_EQ(error_of(R"({})").substr(0, 10), "400 prompt");
  EXPECT_EQ(error_of(R"({"prompt": "x", "messages": [{"role": "user", "content": "x"}]})").substr(0, 10), "400 prompt");
  EXPECT_EQ(error_of(R"({"prompt": ["x"]})"), "400 prompt: 'prompt' must be a string");
  EXPECT_EQ(error_of(R"({"prompt": "x", "model": "other"})").substr(0, 9), "404 model");
  EXPECT_EQ(error_of(R"({"prompt": "x", "return_token_strs": true})"),
            "400 return_token_strs: 'return_token_strs' is not supported by woq serve");
  EXPECT_EQ(error_of(R"({"prompt": "x", "return_token_strs": false})"), "ok");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "add_special_tokens": true})").substr(0, 22),
            "400 add_special_tokens");
  EXPECT_EQ(error_of(R"({"messages": [{"role": "user", "content": "x"}], "continue_final_message": true})").substr(0, 26),
            "400 continue_final_message");
  EXPECT_EQ(error_of(R"({"messages": []})"), "400 messages: 'messages' must be a non-empty list");
  EXPECT_EQ(error_of(nlohmann::json{{"prompt", std::string(65, 'a')}}.dump()),
            "400 prompt: 'prompt' has 65 bytes, more than the 64 bytes this server accepts (--max-prompt-bytes)");
  EXPECT_EQ(error_of(nlohmann::json{{"messages", {{{"role", "user"}, {"content", std::string(40, 'a')}}}}}.dump()).substr(0, 12),
            "400 messages");  // 40 bytes of text, more than 64 once the template renders them
  EXPECT_EQ(error_of(R"({"tokens": [1, 2, 512]})", true), "400 tokens[2]: 'tokens[2]' is 512, outside the vocabulary [0, 512)");
  EXPECT_EQ(error_of(R"({"tokens": [-1]})", true), "400 tokens[0]: 'tokens[0]' is -1, outside the vocabulary [0, 512)");
  EXPECT_EQ(error_of(R"({"tokens": [18446744073709551615]})", true).substr(0, 13), "400 tokens[0]");
  EXPECT_EQ(error_of(R"({"tokens": [1.5]})", true), "400 tokens[0]: 'tokens[0]' must be an integer token id, not number");
  EXPECT_EQ(error_of(R"({"tokens": "1"})", true), "400 tokens: 'tokens' must be a list of token ids");
  EXPECT_EQ(error_of(R"({"tokens": []})", true), "ok");
}

}  // namespace
}  // namespace woq::server
