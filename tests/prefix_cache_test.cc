// Prefix caching's bookkeeping on KV caches filled with values that name their position: a reused prefix
// holds the kept sequence's rows, writing after it changes no other cache, the longest shared prefix wins,
// and the least recently used entries go when the bytes exceed the bound.
#include "model/prefix_cache.h"

#include <gtest/gtest.h>

#include <numeric>

#include "core/error.h"

namespace woq {
namespace {

constexpr std::int64_t kLayers = 2, kDim = 3, kPage = KVCache::kPageTokens;

// The value a sequence `seq` wrote at (layer, pos, element i).
float value_of(int seq, std::int64_t layer, std::int64_t pos, std::int64_t i) {
  return static_cast<float>(seq * 1000000 + layer * 100000 + pos * 10 + i);
}

// A cache of `n` positions as sequence `seq` writes them (keys; values negated).
KVCache filled(std::int64_t n, int seq, std::int64_t capacity = 4 * kPage) {
  KVCache c(kLayers, capacity, kDim);
  c.grow(n);
  for (std::int64_t l = 0; l < kLayers; ++l)
    for (std::int64_t p = 0; p < n; ++p)
      for (std::int64_t i = 0; i < kDim; ++i) {
        c.key(l, p)[i] = value_of(seq, l, p, i);
        c.value(l, p)[i] = -value_of(seq, l, p, i);
      }
  c.length = n;
  return c;
}

// Whether positions [from, to) of `c` hold sequence `seq`'s rows.
bool holds(KVCache& c, int seq, std::int64_t from, std::int64_t to) {
  for (std::int64_t l = 0; l < kLayers; ++l)
    for (std::int64_t p = from; p < to; ++p)
      for (std::int64_t i = 0; i < kDim; ++i)
        if (c.key(l, p)[i] != value_of(seq, l, p, i) || c.value(l, p)[i] != -value_of(seq, l, p, i)) return false;
  return true;
}

std::vector<std::int32_t> tokens(std::int64_t n, std::int32_t first = 0) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

TEST(KVCache, SharedPrefixIsReadOnlyForTheSharer) {
  KVCache a = filled(kPage + 40, 1);
  KVCache b(kLayers, 4 * kPage, kDim);
  b.share_prefix(a, kPage + 10);  // one whole page shared, the second copied up to row 10
  EXPECT_EQ(b.size(), kPage + 10);
  EXPECT_EQ(b.page_id(0), a.page_id(0));
  EXPECT_NE(b.page_id(1), a.page_id(1));
  EXPECT_TRUE(holds(b, 1, 0, kPage + 10));
  b.grow(kPage + 20);
  b.key(1, kPage + 10)[0] = -1;  // b writes after its prefix: a keeps its rows
  EXPECT_TRUE(holds(a, 1, 0, kPage + 40));
  EXPECT_THROW(b.share_prefix(a, 5), Error);  // not empty
  KVCache c(kLayers, 4 * kPage, kDim);
  EXPECT_THROW(c.share_prefix(a, kPage + 41), Error);
  KVCache other(kLayers + 1, 4 * kPage, kDim);
  EXPECT_THROW(other.share_prefix(a, 5), Error);
}

TEST(KVCache, TruncateCopiesASharedPageBeforeItIsWritten) {
  KVCache a = filled(kPage + 40, 1);
  const KVCache kept = a.prefix(kPage + 40);  // a prefix cache's record shares both pages
  a.truncate(kPage + 5);
  EXPECT_NE(a.page_id(1), kept.page_id(1));
  a.key(0, kPage + 5)[0] = -7;
  KVCache reread(kLayers, 4 * kPage, kDim);
  reread.share_prefix(kept, kPage + 40);
  EXPECT_TRUE(holds(reread, 1, 0, kPage + 40));
  EXPECT_TRUE(holds(a, 1, 0, kPage + 5));
  a.truncate(10);  // the second page is released
  EXPECT_EQ(a.page_count(), 1u);
  EXPECT_THROW(a.truncate(11), Error);
}

TEST(PrefixCache, ReusesTheLongestSharedPrefix) {
  PrefixCache pc(1 << 30);
  const std::vector<std::int32_t> ta = tokens(300);
  pc.keep(ta, filled(300, 1));
  std::vector<std::int32_t> tb2 = tokens(200);
  tb2[150] = -5;  // shares 150 tokens with ta
  pc.keep(tb2, filled(200, 2));
  EXPECT_EQ(pc.entries(), 2u);

  std::vector<std::int32_t> prompt = tokens(400);
  prompt[290] = 9999;  // shares 290 with ta, 150 with tb2
  KVCache c(kLayers, 4 * kPage, kDim);
  EXPECT_EQ(pc.reuse(prompt, 399, c, 290), 0);  // nothing longer than 290 tokens: the cache is left alone
  EXPECT_EQ(c.page_count(), 0u);
  EXPECT_EQ(pc.reuse(prompt, 399, c, 289), 290);
  EXPECT_TRUE(holds(c, 1, 0, 290));
  // The limit keeps tokens to prefill; under one block nothing is reused.
  KVCache d(kLayers, 4 * kPage, kDim);
  EXPECT_EQ(pc.reuse(prompt, 100, d), 100);
  EXPECT_TRUE(holds(d, 1, 0, 100) || holds(d, 2, 0, 100));  // both hold these 100 tokens
  KVCache e(kLayers, 4 * kPage, kDim);
  EXPECT_EQ(pc.reuse(prompt, PrefixCache::kBlockTokens - 1, e), 0);
  EXPECT_EQ(e.size(), 0);
  std::vector<std::int32_t> stranger = tokens(300, 7);
  EXPECT_EQ(pc.reuse(stranger, 299, e), 0);
  // tb2's own branch: its rows, not ta's, from token 150 on.
  std::vector<std::int32_t> branch = tb2;
  branch.push_back(3);
  KVCache f(kLayers, 4 * kPage, kDim);
  EXPECT_EQ(pc.reuse(branch, 200, f), 200);
  EXPECT_TRUE(holds(f, 2, 0, 200));
}

TEST(PrefixCache, AnExtendedSequenceReplacesItsPrefixAndDuplicatesAreNotKept) {
  PrefixCache pc(1 << 30);
  KVCache a = filled(kPage + 100, 1);
  pc.keep(tokens(kPage), a);  // a prompt, kept while it decodes
  pc.keep(tokens(kPage + 100), a);  // the whole sequence at its end
  EXPECT_EQ(pc.entries(), 1u);
  pc.keep(tokens(kPage + 50), a);  // already the start of an entry
  EXPECT_EQ(pc.entries(), 1u);
  EXPECT_EQ(pc.bytes(), 2 * a.page_bytes());  // two pages, counted once
  pc.keep(tokens(PrefixCache::kBlockTokens - 1), a);  // shorter than a block
  EXPECT_EQ(pc.entries(), 1u);
}

TEST(PrefixCache, EvictsTheLeastRecentlyUsedBeyondTheBound) {
  const std::int64_t page = filled(1, 0).page_bytes();
  PrefixCache pc(3 * page);
  for (int s = 0; s < 3; ++s) pc.keep(tokens(100, 1000 * s), filled(100, s));  // a page each
  EXPECT_EQ(pc.bytes(), 3 * page);
  KVCache c(kLayers, 4 * kPage, kDim);
  EXPECT_EQ(pc.reuse(tokens(100, 0), 99, c), 99);  // sequence 0 is now the most recently used
  pc.keep(tokens(100, 3000), filled(100, 3));  // over the bound: sequence 1 goes
  EXPECT_EQ(pc.entries(), 3u);
  EXPECT_LE(pc.bytes(), 3 * page);
  KVCache d(kLayers, 4 * kPage, kDim);
  EXPECT_EQ(pc.reuse(tokens(100, 1000), 99, d), 0);
  for (int s : {0, 2, 3}) {
    KVCache e(kLayers, 4 * kPage, kDim);
    EXPECT_EQ(pc.reuse(tokens(100, 1000 * s), 99, e), 99) << s;
    EXPECT_TRUE(holds(e, s, 0, 99));
  }
  // An entry larger than the bound is not kept; a bound of 0 keeps nothing.
  pc.keep(tokens(4 * kPage, 50000), filled(4 * kPage, 9));
  EXPECT_LE(pc.bytes(), 3 * page);
  PrefixCache off(0);
  off.keep(tokens(100), filled(100, 1));
  EXPECT_EQ(off.entries(), 0u);
}

}  // namespace
}  // namespace woq
