#include "model/prefix_cache.h"

#include <algorithm>

namespace woq {

namespace {

// Entries compared per lookup at most: identical block chains beyond this many are not searched.
constexpr std::size_t kMaxCandidates = 8;

// SplitMix64's finaliser (Steele et al. 2014) mixing a token into the chain.
std::uint64_t mix(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

std::size_t common_prefix(std::span<const std::int32_t> a, std::span<const std::int32_t> b) {
  const auto [ia, ib] = std::mismatch(a.begin(), a.end(), b.begin(), b.end());
  return static_cast<std::size_t>(ia - a.begin());
}

}  // namespace

std::vector<std::uint64_t> PrefixCache::block_hashes(std::span<const std::int32_t> tokens) {
  std::vector<std::uint64_t> hashes;
  std::uint64_t h = 0;
  for (std::size_t b = 0; (b + 1) * kBlockTokens <= tokens.size(); ++b) {
    for (std::size_t i = b * kBlockTokens; i < (b + 1) * kBlockTokens; ++i) h = mix(h, static_cast<std::uint32_t>(tokens[i]));
    hashes.push_back(h);
  }
  return hashes;
}

std::vector<PrefixCache::Entries::iterator> PrefixCache::deepest(const std::vector<std::uint64_t>& hashes,
                                                                 std::size_t& blocks) const {
  // An entry holding block b's chained hash holds every earlier one: find the last b any entry holds.
  std::size_t lo = 0, hi = hashes.size();  // blocks in [0, lo] are held; beyond hi are not
  while (lo < hi) {
    const std::size_t mid = (lo + hi + 1) / 2;
    if (index_.contains(hashes[mid - 1])) lo = mid;
    else hi = mid - 1;
  }
  blocks = lo;
  std::vector<Entries::iterator> found;
  if (lo == 0) return found;
  const auto [first, last] = index_.equal_range(hashes[lo - 1]);
  for (auto it = first; it != last && found.size() < kMaxCandidates; ++it) found.push_back(it->second);
  return found;
}

std::int64_t PrefixCache::reuse(std::span<const std::int32_t> tokens, std::int64_t limit, KVCache& cache,
                               std::int64_t longer_than) {
  if (lru_.empty()) return 0;
  const std::span<const std::int32_t> head = tokens.first(static_cast<std::size_t>(std::clamp<std::int64_t>(limit, 0, static_cast<std::int64_t>(tokens.size()))));
  std::size_t blocks = 0;
  const std::vector<Entries::iterator> candidates = deepest(block_hashes(head), blocks);
  Entries::iterator best = lru_.end();
  std::size_t best_len = 0;
  for (const Entries::iterator e : candidates) {
    const std::size_t len = common_prefix(head, e->tokens);
    if (len > best_len) best = e, best_len = len;
  }
  if (best == lru_.end() || best_len < static_cast<std::size_t>(kBlockTokens) ||
      static_cast<std::int64_t>(best_len) <= longer_than)
    return 0;
  cache.share_prefix(best->cache, static_cast<std::int64_t>(best_len));
  lru_.splice(lru_.begin(), lru_, best);
  return static_cast<std::int64_t>(best_len);
}

void PrefixCache::keep(std::span<const std::int32_t> tokens, const KVCache& cache) {
  if (max_bytes_ <= 0 || static_cast<std::int64_t>(tokens.size()) < kBlockTokens) return;
  std::vector<std::uint64_t> hashes = block_hashes(tokens);
  std::size_t blocks = 0;
  for (const Entries::iterator e : deepest(hashes, blocks)) {
    const std::size_t len = common_prefix(tokens, e->tokens);
    if (len == tokens.size()) {  // already kept (as the start of a longer entry)
      lru_.splice(lru_.begin(), lru_, e);
      return;
    }
    if (len == e->tokens.size()) erase(e);  // these extend it
  }
  lru_.push_front(Entry{{tokens.begin(), tokens.end()}, cache.prefix(static_cast<std::int64_t>(tokens.size())), std::move(hashes)});
  for (const std::uint64_t h : lru_.front().hashes) index_.emplace(h, lru_.begin());
  count_pages(lru_.front().cache, +1);
  while (bytes_ > max_bytes_ && !lru_.empty()) erase(std::prev(lru_.end()));
}

void PrefixCache::erase(Entries::iterator e) {
  for (const std::uint64_t h : e->hashes) {
    auto [first, last] = index_.equal_range(h);
    for (auto it = first; it != last; ++it)
      if (it->second == e) {
        index_.erase(it);
        break;
      }
  }
  count_pages(e->cache, -1);
  lru_.erase(e);
}

void PrefixCache::count_pages(const KVCache& cache, int delta) {
  const std::int64_t page_bytes = page_bytes_ > 0 ? page_bytes_ : cache.page_bytes();
  for (std::size_t p = 0; p < cache.page_count(); ++p) {
    const auto [it, added] = page_uses_.try_emplace(cache.page_id(p), 0);
    if (added) bytes_ += page_bytes;
    it->second += delta;
    if (it->second == 0) {
      page_uses_.erase(it);
      bytes_ -= page_bytes;
    }
  }
}

}  // namespace woq
