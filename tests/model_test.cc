// The bundled stories260K model against the reference produced by llama2.c
// and a PyTorch forward pass (tests/data/stories260K_greedy_once_upon_a_time.json),
// and the accuracy of each low-bit format against fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "eval/logit_compare.h"
#include "generate/generate.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {
namespace {

nlohmann::json reference() {
  std::ifstream in(WOQ_TEST_DATA "/stories260K_greedy_once_upon_a_time.json");
  return nlohmann::json::parse(in);
}

std::unique_ptr<LlamaModel> load(ThreadPool& pool, QuantSpec spec) {
  return LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{spec, std::nullopt, std::nullopt, {}}, pool);
}

const QuantSpec kFp32{LowBit::kFp32, 32, Int4Range::kFull};

TEST(Stories260K, TokenizesPromptLikeReference) {
  const auto tok = Tokenizer::load(WOQ_MODEL_DIR);
  const auto ref = reference();
  EXPECT_EQ(tok.encode("Once upon a time"), ref["prompt_ids"].get<std::vector<std::int32_t>>());
}

// Streaming deltas add up to the full decode, also through byte-fallback
// pieces (the emoji and accents are not in the 512-piece vocabulary).
TEST(Stories260K, TextStreamReassemblesTheText) {
  const auto tok = Tokenizer::load(WOQ_MODEL_DIR);
  const std::string text = "Once upon a time, h\xC3\xA9llo \xF0\x9F\x99\x82 world. The end.";
  const auto ids = tok.encode(text);
  std::vector<std::int32_t> body(ids.begin() + 1, ids.end());  // without BOS
  TextStream stream(tok);
  std::string streamed;
  for (const auto id : body) {
    const std::string piece = stream.push(id);
    EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << "streamed a replacement character";
    streamed += piece;
  }
  streamed += stream.flush();
  EXPECT_EQ(streamed, tok.decode(body));
  EXPECT_EQ(streamed, text);
}

TEST(Stories260K, GreedyFp32MatchesReferenceTokensAndText) {
  ThreadPool pool(2);
  auto model = load(pool, kFp32);
  const auto tok = Tokenizer::load(WOQ_MODEL_DIR);
  const auto ref = reference();
  const auto ids = ref["ids"].get<std::vector<std::int32_t>>();
  GenerateOptions opt;
  opt.max_new_tokens = 60;
  opt.sampling.temperature = 0;
  std::string text;
  const GenerateResult r = generate(*model, tok, "Once upon a time", opt, [&](std::string_view s) { text += s; });
  std::vector<std::int32_t> all = r.prompt_ids;
  all.insert(all.end(), r.generated_ids.begin(), r.generated_ids.end());
  EXPECT_EQ(r.generated_ids.size(), 60u);
  EXPECT_EQ(all, ids);
  EXPECT_EQ(text, ref["text"].get<std::string>());
}

// Asked for more tokens than the context holds, generation stops where it is full and says so (as llama.cpp);
// a prompt that fills the context alone is an error.
TEST(Stories260K, GenerationStopsAtTheContext) {
  ThreadPool pool(2);
  auto model = load(pool, kFp32);
  const auto tok = Tokenizer::load(WOQ_MODEL_DIR);
  std::string prompt;
  for (int i = 0; i < 60; ++i) prompt += "Once upon a time, ";
  const auto prompt_len = static_cast<std::int64_t>(tok.encode(prompt).size());
  ASSERT_LT(prompt_len, model->context_limit());
  GenerateOptions opt;
  opt.max_new_tokens = 1000;
  opt.sampling.temperature = 0;
  opt.stop_ids = {-1};  // no stop token: only the context can end it
  const GenerateResult r = generate(*model, tok, prompt, opt, [](std::string_view) {});
  EXPECT_TRUE(r.context_full);
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(static_cast<std::int64_t>(r.generated_ids.size()), model->context_limit() - prompt_len);
  opt.max_new_tokens = 5;
  EXPECT_FALSE(generate(*model, tok, prompt, opt, [](std::string_view) {}).context_full);
  std::string long_prompt;
  for (int i = 0; i < 200; ++i) long_prompt += "Once upon a time, ";
  try {
    generate(*model, tok, long_prompt, opt, [](std::string_view) {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fills the model's context of 512 tokens"), std::string::npos) << e.what();
  }
}

// Chat prompts: the text of control tokens becomes their ids (BOS not doubled);
// logprobs show each token's own text.
TEST(Stories260K, SpecialTokensInTextAndTokenText) {
  const auto tok = Tokenizer::load(WOQ_MODEL_DIR);
  const auto hello = tok.encode("Hello");  // BOS + pieces
  std::vector<std::int32_t> want = hello;
  want.push_back(2);
  const auto world = tok.encode(" world");
  want.insert(want.end(), world.begin() + 1, world.end());
  EXPECT_EQ(tok.encode_with_special("<s>Hello</s> world"), want);
  EXPECT_EQ(tok.encode_with_special("Hello</s> world"), want);  // BOS added once
  EXPECT_EQ(tok.encode_with_special(""), std::vector<std::int32_t>{1});
  const auto once = tok.encode("Once upon");
  ASSERT_GE(once.size(), 3u);
  std::string joined;
  for (std::size_t i = 1; i < once.size(); ++i) joined += tok.token_text(once[i]);
  EXPECT_EQ(joined, " Once upon");
  EXPECT_EQ(tok.token_text(13), "\n");  // the byte token <0x0A>
  EXPECT_EQ(tok.token_text(1), "<s>");
  EXPECT_EQ(tok.token_text(100000), "<100000?>");
}

// Stop strings end generation inside or across tokens; the text from the stop
// string on is neither streamed nor returned; a held-back prefix that never
// completes is released at the end.
TEST(Stories260K, StopStringsCutTheTextWhereTheyBegin) {
  ThreadPool pool(2);
  auto model = load(pool, kFp32);
  const auto tok = Tokenizer::load(WOQ_MODEL_DIR);
  const std::string full = reference()["text"].get<std::string>();
  const std::string prompt = "Once upon a time";
  const std::string generated = full.substr(prompt.size());
  auto run = [&](std::vector<std::string> stops, std::string& streamed) {
    GenerateOptions opt;
    opt.max_new_tokens = 60;
    opt.sampling.temperature = 0;
    opt.stop_strings = std::move(stops);
    streamed.clear();
    return generate(*model, tok, prompt, opt, [&](std::string_view s) { streamed += s; });
  };
  std::string streamed;
  // Of two stop strings the one that appears first in the text wins ("park" before "ball. S").
  GenerateResult r = run({"ball. S", "park"}, streamed);
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.stop_token, -1);
  EXPECT_EQ(r.stop_string, "park");
  EXPECT_EQ(r.text, generated.substr(0, generated.find("park")));
  EXPECT_EQ(streamed, prompt + r.text);
  EXPECT_LT(r.generated_ids.size(), 60u);
  // The token that completed the stop string is the last one generated.
  EXPECT_NE(tok.decode(r.generated_ids).find("park"), std::string::npos);
  EXPECT_EQ(tok.decode(std::vector<std::int32_t>(r.generated_ids.begin(), r.generated_ids.end() - 1)).find("park"),
            std::string::npos);

  r = run({"ball. S"}, streamed);  // spans several tokens
  EXPECT_EQ(r.stop_string, "ball. S");
  EXPECT_EQ(r.text, generated.substr(0, generated.find("ball. S")));
  EXPECT_EQ(streamed, prompt + r.text);

  EXPECT_THROW(run({"\x80\x9d"}, streamed), Error);  // not UTF-8: could match inside a character

  // "\nLily" ends the text; "\nLily!" never matches: held back, then released.
  r = run({"\nLily!", ""}, streamed);
  EXPECT_FALSE(r.stopped);
  EXPECT_EQ(r.text, generated);
  EXPECT_EQ(streamed, full);
}

// Continuous batching with chunked prefill: one pass of several sequences (different lengths), each
// continued by one token (a decode step) or several (a prompt's chunk), gives each exactly the logits of
// its own forward().
TEST(Stories260K, BatchedPassRowsEqualEachSequenceAlone) {
  ThreadPool pool(2);
  // sym_int8 takes the bf16 path by default (amx's tiles for every token count).
  for (const QuantSpec spec : {kFp32, QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt8, -1, Int4Range::kFull}}) {
    auto model = load(pool, spec);
    const std::vector<std::vector<std::int32_t>> prompts = {{1, 403, 407, 261}, {1, 9}, {1, 66, 67, 68, 69, 70, 71}};
    std::vector<KVCache> caches, alone;
    std::vector<float> logits;
    for (const auto& p : prompts) {
      caches.push_back(model->make_cache(64));
      model->forward(p, caches.back(), false, logits);
      alone.push_back(model->make_cache(64));
      model->forward(p, alone.back(), false, logits);
    }
    std::vector<KVCache*> ptrs = {&caches[0], &caches[1], &caches[2]};
    std::vector<float> batched;
    for (const std::vector<std::int64_t>& rows : {std::vector<std::int64_t>{1, 1, 1}, {5, 1, 2}, {1, 17, 1}}) {
      std::vector<std::int32_t> tokens;
      std::vector<std::vector<std::int32_t>> each(3);
      for (std::size_t i = 0; i < 3; ++i)
        for (std::int64_t r = 0; r < rows[i]; ++r) {
          each[i].push_back(static_cast<std::int32_t>(300 + 7 * i + 3 * r));
          tokens.push_back(each[i].back());
        }
      model->forward_batch(tokens, rows, ptrs, batched);
      ASSERT_EQ(batched.size(), 3u * 512);
      for (std::size_t i = 0; i < 3; ++i) {
        model->forward(each[i], alone[i], false, logits);
        EXPECT_EQ(caches[i].size(), alone[i].size());
        for (std::size_t v = 0; v < 512; ++v) ASSERT_EQ(batched[i * 512 + v], logits[v]) << "seq " << i << " rows " << rows[i];
      }
    }
    const std::vector<std::int32_t> three = {300, 301, 302};
    const std::vector<std::int64_t> ones = {1, 1, 1};
    EXPECT_THROW(model->forward_batch(three, ones, std::vector<KVCache*>{&caches[0], &caches[0], &caches[1]}, batched), Error);
    EXPECT_THROW(model->forward_batch(std::vector<std::int32_t>{1, 2}, ones, ptrs, batched), Error);
    EXPECT_THROW(model->forward_batch(three, std::vector<std::int64_t>{2, 1, 0}, ptrs, batched), Error);
  }
}

TEST(Stories260K, LastPromptLogitsMatchPyTorch) {
  ThreadPool pool(2);
  auto model = load(pool, kFp32);
  const auto ref = reference();
  const auto want = ref["last_prompt_position_logits"].get<std::vector<float>>();
  KVCache cache = model->make_cache(8);
  std::vector<float> logits;
  model->forward(ref["prompt_ids"].get<std::vector<std::int32_t>>(), cache, false, logits);
  ASSERT_EQ(logits.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(logits[i], want[i], 1e-4) << i;
}

// The KV cache takes memory as the sequence grows, a page at a time, and a
// prefill that crosses pages gives the logits of one that is split at any point.
TEST(Stories260K, KvCacheGrowsInPagesAndPageBoundariesDoNotChangeLogits) {
  ThreadPool pool(2);
  auto model = load(pool, kFp32);
  const std::int64_t ctx = model->context_limit();
  ASSERT_GT(ctx, KVCache::kPageTokens + 40);
  KVCache whole = model->make_cache(ctx);
  EXPECT_EQ(whole.allocated(), 0);
  std::vector<std::int32_t> ids;
  for (std::int64_t i = 0; i < KVCache::kPageTokens + 40; ++i) ids.push_back(static_cast<std::int32_t>(3 + (i * 37) % 500));
  std::vector<float> a, b;
  model->forward(std::span(ids).first(10), whole, false, a);
  EXPECT_EQ(whole.allocated(), KVCache::kPageTokens);  // one page for 10 tokens, not the whole context
  model->forward(std::span(ids).subspan(10), whole, false, a);
  EXPECT_EQ(whole.allocated(), 2 * KVCache::kPageTokens);
  KVCache split = model->make_cache(ctx);
  model->forward(std::span(ids).first(KVCache::kPageTokens - 3), split, false, b);
  model->forward(std::span(ids).subspan(KVCache::kPageTokens - 3), split, false, b);
  EXPECT_EQ(a, b);
  EXPECT_EQ(KVCache::bytes_for(2, 1, 8), 2 * 2 * KVCache::kPageTokens * 8 * 4);
}

// A pipeline stage's cache holds its blocks' layers only (its share of the KV memory), addressed by the model's
// layer numbers.
TEST(KvCache, APipelineStageCachesItsBlocksOnly) {
  ThreadPool pool(1);
  LoadOptions options{QuantSpec{LowBit::kFp32}, std::nullopt, std::nullopt, {}};
  options.first_block = 1;
  options.last_block = 3;
  const auto stage = LlamaModel::load(WOQ_MODEL_DIR, options, pool);
  KVCache cache = stage->make_cache(8);
  EXPECT_EQ(cache.layers, 2);
  EXPECT_EQ(cache.first_layer, 1);
  EXPECT_EQ(cache.page_bytes(), KVCache::bytes_for(2, KVCache::kPageTokens, stage->config().kv_dim()));
  EXPECT_EQ(LlamaModel::load(WOQ_MODEL_DIR, LoadOptions{QuantSpec{LowBit::kFp32}, std::nullopt, std::nullopt, {}}, pool)
                ->make_cache(8).layers, stage->config().num_hidden_layers);
  cache.grow(2);
  const std::int64_t dim = cache.kv_dim;
  EXPECT_EQ(cache.key(1, 0) + KVCache::kPageTokens * dim, cache.key(2, 0));  // layer 1 is the page's first
  EXPECT_EQ(cache.key(2, 1), cache.key(2, 0) + dim);
  EXPECT_NE(cache.key(1, 0), cache.value(1, 0));
}

// One batched prefill gives the same logits as feeding tokens one by one,
// bit for bit (every output is computed by the same operations whatever the
// batch), and the thread count does not change a single bit either.
TEST(Stories260K, PrefillEqualsStepwiseDecodeAndThreadsAreDeterministic) {
  const auto ids = reference()["ids"].get<std::vector<std::int32_t>>();
  // sym_int8 takes the bf16 path by default (amx's tiles for every token count).
  for (const QuantSpec spec : {kFp32, QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}, QuantSpec{LowBit::kSymInt8, -1, Int4Range::kFull}}) {
    ThreadPool pool1(1), pool2(2);
    auto m1 = load(pool1, spec);
    auto m2 = load(pool2, spec);
    KVCache c1 = m1->make_cache(64), c2 = m2->make_cache(64), c3 = m2->make_cache(64);
    std::vector<float> batch1, batch2, step;
    m1->forward(std::span(ids).first(40), c1, true, batch1);
    m2->forward(std::span(ids).first(40), c2, true, batch2);
    EXPECT_EQ(batch1, batch2);
    const std::size_t vocab = static_cast<std::size_t>(m1->config().vocab_size);
    for (std::size_t t = 0; t < 40; ++t) {
      m2->forward(std::span(ids).subspan(t, 1), c3, false, step);
      for (std::size_t v = 0; v < vocab; ++v) ASSERT_EQ(step[v], batch2[t * vocab + v]) << t;
    }
  }
}

// forward_block keeps its buffers between calls: calls of other lengths in between change nothing.
TEST(Stories260K, ForwardBlockReusedBuffersEqualFreshOnes) {
  const auto ids = reference()["ids"].get<std::vector<std::int32_t>>();
  ThreadPool pool(2);
  auto reused = load(pool, kFp32);
  const std::int64_t hidden = reused->config().hidden_size;
  const auto run = [&](LlamaModel& m, std::int64_t t) {
    std::vector<float> x(static_cast<std::size_t>(t * hidden));
    m.embed(std::span(ids).first(static_cast<std::size_t>(t)), x.data());
    for (std::int64_t l = 0; l < m.config().num_hidden_layers; ++l) m.forward_block(l, x.data(), t, nullptr);
    return x;
  };
  std::vector<std::vector<float>> got;
  for (const std::int64_t t : {40, 17, 40, 3, 17}) got.push_back(run(*reused, t));
  std::size_t i = 0;
  for (const std::int64_t t : {40, 17, 40, 3, 17}) {
    auto fresh = load(pool, kFp32);
    EXPECT_EQ(got[i++], run(*fresh, t)) << t;
  }
  EXPECT_NE(got[0], std::vector<float>(got[0].size(), 0.0f));
}

// forward_block on several sequences at once (one after another in x, each with its own positions from 0
// and its own KV) gives every sequence what it gets alone, bit for bit, and an observer sees all rows at once.
TEST(Stories260K, ForwardBlockOnSeveralSequencesEqualsEachAlone) {
  const auto ids = reference()["ids"].get<std::vector<std::int32_t>>();
  ThreadPool pool(2);
  for (const QuantSpec spec : {kFp32, QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}}) {
    auto m = load(pool, spec);
    const std::int64_t hidden = m->config().hidden_size;
    const std::vector<std::int64_t> lengths{23, 5, 35, 1};  // sequence i: ids from i on
    std::vector<std::vector<float>> alone;
    std::vector<float> together;
    std::int64_t start = 0, observed = 0;
    for (const std::int64_t t : lengths) {
      std::vector<float> x(static_cast<std::size_t>(t * hidden));
      m->embed(std::span(ids).subspan(alone.size(), static_cast<std::size_t>(t)), x.data());
      together.insert(together.end(), x.begin(), x.end());
      for (std::int64_t l = 0; l < m->config().num_hidden_layers; ++l) m->forward_block(l, x.data(), t, nullptr);
      alone.push_back(std::move(x));
      start += t;
    }
    for (std::int64_t l = 0; l < m->config().num_hidden_layers; ++l)
      m->forward_block(l, together.data(), lengths, [&](LinearRole, const float*, std::int64_t rows) {
        EXPECT_EQ(rows, start);
        ++observed;
      });
    EXPECT_EQ(observed, m->config().num_hidden_layers * 7);
    std::size_t at = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      const std::vector<float> got(together.begin() + static_cast<std::ptrdiff_t>(at),
                                   together.begin() + static_cast<std::ptrdiff_t>(at + alone[i].size()));
      EXPECT_EQ(got, alone[i]) << "sequence " << i << ", " << low_bit_name(spec.type);
      at += alone[i].size();
    }
    EXPECT_THROW(m->forward_block(0, together.data(), std::span<const std::int64_t>{}, nullptr), Error);
    const std::vector<std::int64_t> bad{4, 0};
    EXPECT_THROW(m->forward_block(0, together.data(), bad, nullptr), Error);
  }
}

// forward_block's skip (scoring's last block): the rows past each sequence's skip get the outputs they get
// without it, bit for bit, attending to the skipped rows' keys and values; the skipped rows are left as they
// were; the query, o, gate, up and down projections run on the kept rows only.
TEST(Stories260K, ForwardBlockWithSkipComputesTheKeptRowsOnly) {
  const auto ids = reference()["ids"].get<std::vector<std::int32_t>>();
  ThreadPool pool(2);
  for (const QuantSpec spec : {kFp32, QuantSpec{LowBit::kSymInt4, 32, Int4Range::kFull}}) {
    auto m = load(pool, spec);
    const std::int64_t hidden = m->config().hidden_size, last = m->config().num_hidden_layers - 1;
    const std::vector<std::int64_t> lengths{23, 5, 35, 1}, skip{10, 5, 0, 1};
    std::vector<float> x(static_cast<std::size_t>(64 * hidden));
    m->embed(std::span(ids).first(64), x.data());
    for (std::int64_t l = 0; l < last; ++l) m->forward_block(l, x.data(), lengths, nullptr);
    std::vector<float> full = x, part = x;
    m->forward_block(last, full.data(), lengths, nullptr);
    std::map<LinearRole, std::int64_t> rows_seen;
    m->forward_block(
        last, part.data(), lengths, [&](LinearRole role, const float*, std::int64_t rows) { rows_seen[role] = rows; },
        nullptr, skip);
    EXPECT_EQ(rows_seen[LinearRole::kK], 64);
    EXPECT_EQ(rows_seen[LinearRole::kV], 64);
    for (const LinearRole role : {LinearRole::kQ, LinearRole::kO, LinearRole::kGate, LinearRole::kDown})
      EXPECT_EQ(rows_seen[role], 13 + 35);
    std::int64_t row0 = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      for (std::int64_t t = 0; t < lengths[i]; ++t) {
        const auto at = static_cast<std::ptrdiff_t>((row0 + t) * hidden);
        const std::vector<float> got(part.begin() + at, part.begin() + at + hidden);
        const std::vector<float>& want = t < skip[i] ? x : full;
        EXPECT_EQ(got, std::vector<float>(want.begin() + at, want.begin() + at + hidden))
            << "sequence " << i << " row " << t << (t < skip[i] ? " (skipped)" : "") << ", " << low_bit_name(spec.type);
      }
      row0 += lengths[i];
    }
    const std::vector<std::int64_t> too_many{1, 6, 0, 0}, too_few{1, 2};
    EXPECT_THROW(m->forward_block(last, part.data(), lengths, nullptr, nullptr, too_many), Error);
    EXPECT_THROW(m->forward_block(last, part.data(), lengths, nullptr, nullptr, too_few), Error);
  }
}

// Teacher-forced next-token agreement and KL divergence of each low-bit
// format against fp32 on the reference sequence.
TEST(Stories260K, LowBitAccuracyAgainstFp32) {
  ThreadPool pool(2);
  const auto ids = reference()["ids"].get<std::vector<std::int32_t>>();
  auto logits_for = [&](QuantSpec spec) {
    auto model = load(pool, spec);
    KVCache cache = model->make_cache(static_cast<std::int64_t>(ids.size()));
    std::vector<float> logits;
    model->forward(ids, cache, true, logits);
    return logits;
  };
  const auto ref = logits_for(kFp32);
  struct Expect {
    QuantSpec spec;
    const char* name;
    double min_top1;
    double max_kl;
  };
  // Bounds sit well outside the measured values (printed below), so a
  // broken codec or kernel fails while rounding noise does not.
  const Expect cases[] = {
      {{LowBit::kSymInt8, 32, Int4Range::kFull}, "sym_int8 g32", 0.95, 0.01},
      {{LowBit::kSymInt8, -1, Int4Range::kFull}, "sym_int8 per-channel", 0.95, 0.02},
      {{LowBit::kSymInt4, 32, Int4Range::kFull}, "sym_int4 g32 full", 0.70, 0.3},
      {{LowBit::kSymInt4, 32, Int4Range::kClip}, "sym_int4 g32 clip", 0.70, 0.3},
      {{LowBit::kAsymInt4, 32, Int4Range::kFull}, "asym_int4 g32", 0.70, 0.3},
      {{LowBit::kFp16, 32, Int4Range::kFull}, "fp16", 0.99, 1e-4},
      {{LowBit::kBf16, 32, Int4Range::kFull}, "bf16", 0.95, 1e-2},
  };
  const std::int64_t vocab = 512;
  for (const auto& c : cases) {
    const LogitAgreement a = compare_logits(ref, logits_for(c.spec), vocab);
    std::printf("%-22s top-1 agreement %5.1f %%  mean KL %.5f  max KL %.5f  (%lld positions)\n", c.name,
                100 * a.top1_agreement, a.mean_kl, a.max_kl, static_cast<long long>(a.positions));
    EXPECT_GE(a.top1_agreement, c.min_top1) << c.name;
    EXPECT_LE(a.mean_kl, c.max_kl) << c.name;
    EXPECT_GT(a.mean_kl, 0.0) << c.name << ": quantization changed nothing";
  }
}

}  // namespace
}  // namespace woq
