#include "tokenizer/bpe.h"

#include <algorithm>
#include <queue>

#include "core/error.h"
#include "tokenizer/unicode.h"

namespace woq {

namespace {

constexpr std::size_t kCacheCapacity = 10000;  // words, as Hugging Face's default
constexpr std::size_t kCacheMaxWord = 256;     // bytes

std::uint64_t pair_key(std::int32_t a, std::int32_t b) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) | static_cast<std::uint32_t>(b);
}

}  // namespace

BpeModel::BpeModel(const std::vector<std::pair<std::string, std::int32_t>>& vocab,
                   const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options,
                   const std::string& source)
    : options_(std::move(options)) {
  std::int64_t limit = 0;
  for (const auto& [token, id] : vocab) {
    if (id < 0) fail("{}: vocabulary token '{}' has the negative id {}", source, printable(token), id);
    limit = std::max<std::int64_t>(limit, std::int64_t{id} + 1);
  }
  // Ids index a dense table: a few gaps are fine, a vocabulary of scattered huge ids is not a tokenizer.
  const auto dense_limit = 2 * static_cast<std::int64_t>(vocab.size()) + 65536;
  if (limit > dense_limit)
    fail("{}: the vocabulary has {} tokens but ids up to {}; woq accepts ids below {}", source, vocab.size(),
         limit - 1, dense_limit);
  tokens_.resize(static_cast<std::size_t>(limit));
  used_.assign(static_cast<std::size_t>(limit), false);
  ids_.reserve(vocab.size());
  for (const auto& [token, id] : vocab) {
    const auto u = static_cast<std::size_t>(id);
    if (used_[u])
      fail("{}: vocabulary tokens '{}' and '{}' have the same id {}", source, printable(tokens_[u]), printable(token), id);
    if (!ids_.emplace(token, id).second) fail("{}: vocabulary token '{}' appears twice", source, printable(token));
    tokens_[u] = token;
    used_[u] = true;
  }
  const std::size_t prefix = options_.continuing_subword_prefix.size();
  merges_.reserve(merges.size());
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    // Named members, not a structured binding: the lambda below captures them (clang < 16 cannot).
    const std::string& a = merges[rank].first;
    const std::string& b = merges[rank].second;
    const auto where = [&] { return fmt::format("{}: merge {} ('{} {}')", source, rank, printable(a), printable(b)); };
    const auto ia = id(a), ib = id(b);
    if (!ia) fail("{}: '{}' is not in the vocabulary", where(), printable(a));
    if (!ib) fail("{}: '{}' is not in the vocabulary", where(), printable(b));
    const std::string merged = a + (prefix > 0 && b.starts_with(options_.continuing_subword_prefix) ? b.substr(prefix) : b);
    const auto im = id(merged);
    if (!im) fail("{}: the merged token '{}' is not in the vocabulary", where(), printable(merged));
    // As Hugging Face collects the merges into a map, a repeated pair keeps its last rank.
    merges_[pair_key(*ia, *ib)] = {static_cast<std::int32_t>(rank), *im};
  }
  if (options_.unk_token) {
    unk_id_ = id(*options_.unk_token);
    if (!unk_id_) fail("{}: unk_token '{}' is not in the vocabulary", source, printable(*options_.unk_token));
  }
  for (int b = 0; b < 256; ++b) {
    const auto i = id(fmt::format("<0x{:02X}>", b));
    byte_ids_[b] = i ? *i : -1;
  }
}

const std::string* BpeModel::token(std::int32_t id) const {
  if (id < 0 || id >= id_limit() || !used_[static_cast<std::size_t>(id)]) return nullptr;
  return &tokens_[static_cast<std::size_t>(id)];
}

std::optional<std::int32_t> BpeModel::id(std::string_view token) const {
  const auto it = ids_.find(token);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

void BpeModel::encode(std::string_view word, std::vector<std::int32_t>& ids) const {
  if (word.empty()) return;
  if (options_.ignore_merges) {
    if (const auto whole = id(word)) {
      ids.push_back(*whole);
      return;
    }
  }
  const bool cacheable = word.size() < kCacheMaxWord;
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<std::int32_t> merged = merge_word(word);
  ids.insert(ids.end(), merged.begin(), merged.end());
  if (cacheable) {
    std::lock_guard lock(cache_mu_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(merged));
  }
}

std::vector<std::int32_t> BpeModel::merge_word(std::string_view word) const {
  // Symbols of the word: one per character (with prefix/suffix), or byte
  // tokens, or unk; then a doubly linked list merged by rank.
  struct Symbol {
    std::int32_t id;
    std::int32_t prev, next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto add = [&](std::int32_t id) {
    const auto n = static_cast<std::int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  std::optional<std::int32_t> pending_unk;
  std::string piece;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t begin = i;
    unicode::next_code_point(word, i);
    piece.clear();
    if (begin > 0) piece += options_.continuing_subword_prefix;
    piece.append(word.substr(begin, i - begin));
    if (i == word.size()) piece += options_.end_of_word_suffix;
    if (const auto found = id(piece)) {
      if (pending_unk) add(*std::exchange(pending_unk, std::nullopt));
      add(*found);
      continue;
    }
    if (options_.byte_fallback &&
        std::all_of(piece.begin(), piece.end(), [&](char c) { return byte_ids_[static_cast<unsigned char>(c)] >= 0; })) {
      for (const char c : piece) add(byte_ids_[static_cast<unsigned char>(c)]);
      continue;
    }
    if (unk_id_) {
      if (pending_unk && !options_.fuse_unk) add(*pending_unk);
      pending_unk = *unk_id_;
    }
    // Without an unk token the character is dropped, as Hugging Face does.
  }
  if (pending_unk) add(*pending_unk);
  if (!symbols.empty()) symbols.back().next = -1;

  struct Candidate {
    std::int32_t rank, pos, merged;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](std::int32_t pos) {
    const std::int32_t next = symbols[static_cast<std::size_t>(pos)].next;
    if (next < 0) return;
    const auto it = merges_.find(pair_key(symbols[static_cast<std::size_t>(pos)].id, symbols[static_cast<std::size_t>(next)].id));
    if (it != merges_.end()) queue.push({it->second.first, pos, it->second.second});
  };
  for (std::int32_t p = 0; p + 1 < static_cast<std::int32_t>(symbols.size()); ++p) consider(p);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[static_cast<std::size_t>(top.pos)];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<std::size_t>(left.next)];
    // A stale entry: the pair changed since it was queued.
    const auto it = merges_.find(pair_key(left.id, right.id));
    if (it == merges_.end() || it->second.second != top.merged) continue;
    left.id = top.merged;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0) symbols[static_cast<std::size_t>(right.next)].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  std::vector<std::int32_t> out;
  for (const Symbol& s : symbols)
    if (s.alive) out.push_back(s.id);
  return out;
}

}  // namespace woq
