#include "generate/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "core/error.h"

namespace woq {
namespace {

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};

TEST(Sampler, GreedyTakesFirstMaximum) {
  Sampler s({0.0f, 40, 0.95f, 1});
  EXPECT_EQ(s.sample(kLogits), 1);
}

TEST(Sampler, SameSeedSameTokens) {
  Sampler a({1.0f, 0, 1.0f, 42}), b({1.0f, 0, 1.0f, 42}), c({1.0f, 0, 1.0f, 43});
  std::vector<std::int32_t> ta, tb, tc;
  for (int i = 0; i < 50; ++i) {
    ta.push_back(a.sample(kLogits));
    tb.push_back(b.sample(kLogits));
    tc.push_back(c.sample(kLogits));
  }
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampler, FrequenciesFollowSoftmax) {
  const float temperature = 0.7f;
  Sampler s({temperature, 0, 1.0f, 9});
  std::vector<double> p(kLogits.size());
  double z = 0;
  for (std::size_t i = 0; i < p.size(); ++i) z += p[i] = std::exp(kLogits[i] / temperature);
  std::vector<int> count(p.size());
  const int n = 200000;
  for (int i = 0; i < n; ++i) count[static_cast<std::size_t>(s.sample(kLogits))]++;
  for (std::size_t i = 0; i < p.size(); ++i) {
    const double want = p[i] / z;
    EXPECT_NEAR(count[i] / static_cast<double>(n), want, 5 * std::sqrt(want * (1 - want) / n) + 1e-4) << i;
  }
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  Sampler k2({5.0f, 2, 1.0f, 3});  // high temperature, only ids 1 and 3 may appear
  Sampler p({5.0f, 0, 0.3f, 3});   // ids 1 and 3 hold 0.44 > 0.3 of the mass at T = 5
  std::map<std::int32_t, int> seen_k, seen_p;
  for (int i = 0; i < 2000; ++i) {
    seen_k[k2.sample(kLogits)]++;
    seen_p[p.sample(kLogits)]++;
  }
  EXPECT_EQ(seen_k.size(), 2u);
  EXPECT_TRUE(seen_k.count(1) && seen_k.count(3));
  EXPECT_EQ(seen_p.size(), 2u);
  EXPECT_TRUE(seen_p.count(1) && seen_p.count(3));
}

TEST(Sampler, RejectsBadTopP) {
  EXPECT_THROW(Sampler({1.0f, 0, 0.0f, 1}), Error);
  EXPECT_THROW(Sampler({1.0f, 0, 1.5f, 1}), Error);
}

// OpenAI's definition: logit -= presence · [count > 0] + frequency · count.
TEST(Sampler, PresenceAndFrequencyPenalties) {
  std::vector<float> logits = {1.0f, 2.0f, 3.0f, 4.0f};
  const std::vector<std::pair<std::int32_t, std::int32_t>> counts = {{3, 2}, {1, 1}, {0, 0}};
  apply_penalties(logits, counts, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(logits[0], 1.0f);               // count 0: untouched
  EXPECT_FLOAT_EQ(logits[1], 2.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[2], 3.0f);
  EXPECT_FLOAT_EQ(logits[3], 4.0f - 0.5f - 0.5f);
  EXPECT_EQ(argmax(logits), 2);                   // the repeated token lost its lead
  apply_penalties(logits, counts, -2.0f, 0.0f);   // negative values encourage repeats
  EXPECT_FLOAT_EQ(logits[3], 5.0f);
}

}  // namespace
}  // namespace woq

namespace woq {
namespace {

// llama.cpp's penalties by hand: only the last `last_n` ids count; positive logits are divided by the repeat
// penalty, negative ones multiplied; presence once and frequency per occurrence are subtracted after that.
TEST(Penalties, ByHand) {
  std::vector<float> logits = {2.0f, -1.0f, 3.0f, 0.5f, 4.0f};
  const std::vector<std::int32_t> history = {4, 0, 1, 1, 3, 99};  // 4 is outside the window, 99 outside the vocab
  Penalties p;
  p.repeat = 2.0f;
  p.last_n = 5;
  p.presence = 0.25f;
  p.frequency = 0.5f;
  apply_penalties(logits, history, p);
  EXPECT_FLOAT_EQ(logits[0], 2.0f / 2 - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(logits[1], -1.0f * 2 - 0.25f - 2 * 0.5f);
  EXPECT_FLOAT_EQ(logits[2], 3.0f);  // not in the history
  EXPECT_FLOAT_EQ(logits[3], 0.5f / 2 - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(logits[4], 4.0f);  // only before the window
  std::vector<float> all = {2.0f, -1.0f, 3.0f, 0.5f, 4.0f};
  p.last_n = -1;  // every id of the history (llama.cpp's -1): 4 too
  apply_penalties(all, history, p);
  EXPECT_FLOAT_EQ(all[4], 4.0f / 2 - 0.25f - 0.5f);
  EXPECT_FLOAT_EQ(all[1], logits[1]);
  std::vector<float> same = {1.0f, 2.0f};
  p.last_n = 0;
  apply_penalties(same, std::vector<std::int32_t>{0, 1}, p);
  EXPECT_EQ(same, (std::vector<float>{1.0f, 2.0f}));
}

TEST(Penalties, BadValues) {
  Penalties p;
  p.repeat = 0;
  EXPECT_THROW(validate(p), Error);
  p.repeat = 1e-45f;  // would turn a logit into inf
  EXPECT_THROW(validate(p), Error);
  p.repeat = 1;
  p.last_n = -2;
  EXPECT_THROW(validate(p), Error);
  p.last_n = -1;
  EXPECT_NO_THROW(validate(p));
  p.last_n = 64;
  p.presence = std::numeric_limits<float>::infinity();
  EXPECT_THROW(validate(p), Error);
}

}  // namespace
}  // namespace woq
