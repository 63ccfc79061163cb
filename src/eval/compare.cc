#include "eval/compare.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>

#include <sys/types.h>

#include "core/error.h"

namespace woq {

namespace {

constexpr char kMagic[8] = {'W', 'O', 'Q', 'R', 'E', 'F', '0', '1'};
constexpr char kLlamaMagic[8] = {'_', 'l', 'o', 'g', 'i', 't', 's', '_'};
constexpr float kLlamaKlFloor = -16.0f;  // llama-perplexity's: it keeps no finer log-probabilities

void write_all(std::FILE* f, const void* p, std::size_t n, const std::string& path) {
  if (std::fwrite(p, 1, n, f) != n) fail("{}: write failed: {}", path, std::strerror(errno));
}

void read_all(std::FILE* f, void* p, std::size_t n, const std::string& path, const char* what) {
  if (std::fread(p, 1, n, f) != n) fail("{}: truncated ({})", path, what);
}

void log_softmax(const float* x, std::int64_t n, float* out) {
  const double log_z = log_sum_exp(x, n);
  for (std::int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(x[i] - log_z);
}

// llama-perplexity's percentile: linear between the two nearest ranks (the median of an even count is the
// mean of the middle two).
double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  const double p = q * static_cast<double>(v.size() - 1);
  const auto i = static_cast<std::size_t>(p);
  const double f = p - static_cast<double>(i);
  return (1 - f) * v[i] + f * v[std::min(i + 1, v.size() - 1)];
}

std::FILE* open_regular(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) fail("{}: not found or not a regular file", path);
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) fail("{}: cannot open: {}", path, std::strerror(errno));
  return f;
}

/// A llama-perplexity --kl-divergence-base file's header and tokens (llama_logits_plan).
struct LlamaLogitsHead {
  std::int64_t ctx = 0, vocab = 0, chunks = 0;
  std::int64_t nv = 0;  ///< uint16 per scored position
  std::vector<std::int32_t> tokens;
};

// uint16 per scored position of such a file: two floats, then the vocabulary padded to an even count.
std::int64_t llama_row_u16(std::int64_t vocab) { return 2 * ((vocab + 1) / 2) + 4; }

constexpr std::int64_t kLlamaMaxTokens = std::int64_t{1} << 27;  // 512 MiB of ids; wiki.test.raw has ~0.3 M

// Reads and checks the header after the magic, and the tokens; leaves f at the first row. context_limit <= 0:
// not checked here.
LlamaLogitsHead read_llama_head(std::FILE* f, const std::string& path, std::int64_t vocab,
                                std::int64_t context_limit) {
  std::int32_t h[3];
  read_all(f, h, sizeof h, path, "n_ctx, n_vocab and n_chunk");
  LlamaLogitsHead r{.ctx = h[0], .vocab = h[1], .chunks = h[2], .nv = 0, .tokens = {}};
  if (r.ctx < 3) fail("{}: n_ctx = {}: chunks of fewer than 3 tokens leave nothing to score", path, r.ctx);
  if (context_limit > 0 && r.ctx > context_limit)
    fail("{}: n_ctx = {}, beyond the model's context of {} tokens", path, r.ctx, context_limit);
  if (r.chunks < 1) fail("{}: n_chunk = {}", path, r.chunks);
  if (r.chunks * r.ctx > kLlamaMaxTokens)
    fail("{}: n_chunk = {} chunks of n_ctx = {} tokens: more than the {} tokens woq reads from such a file", path,
         r.chunks, r.ctx, kLlamaMaxTokens);
  if (r.vocab != vocab) fail("{}: n_vocab = {}, this model has a vocabulary of {}", path, r.vocab, vocab);
  r.nv = llama_row_u16(r.vocab);
  // Exact below 2^64 (x86's 64-bit mantissa); a larger product cannot be a file's size anyway.
  const long double rows = static_cast<long double>(r.chunks) * static_cast<long double>(r.ctx - 1 - r.ctx / 2);
  const long double expected = 20.0L + 4.0L * static_cast<long double>(r.chunks) * static_cast<long double>(r.ctx) +
                               2.0L * rows * static_cast<long double>(r.nv);
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) fail("{}: cannot read its size: {}", path, ec.message());
  if (expected != static_cast<long double>(size))
    fail("{}: {} bytes, but its n_ctx = {}, n_vocab = {} and n_chunk = {} make {:.0f} (truncated, or not "
         "llama-perplexity's --kl-divergence-base file?)", path, size, r.ctx, r.vocab, r.chunks,
         static_cast<double>(expected));
  r.tokens.resize(static_cast<std::size_t>(r.chunks * r.ctx));
  read_all(f, r.tokens.data(), r.tokens.size() * sizeof(std::int32_t), path, "tokens");
  for (std::size_t i = 0; i < r.tokens.size(); ++i)
    if (r.tokens[i] < 0 || r.tokens[i] >= vocab)
      fail("{}: token {} of its chunks is {}, outside the vocabulary of {}", path, i, r.tokens[i], vocab);
  return r;
}

}  // namespace

bool is_llama_logits_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  char magic[8];
  const bool llama = std::fread(magic, 1, sizeof magic, f) == sizeof magic &&
                     std::memcmp(magic, kLlamaMagic, sizeof magic) == 0;
  std::fclose(f);
  return llama;
}

LlamaLogitsPlan llama_logits_plan(const std::string& path, std::int32_t bos_id, std::int64_t vocab,
                                  std::int64_t context_limit) {
  std::FILE* f = open_regular(path);
  try {
    char magic[8];
    read_all(f, magic, sizeof magic, path, "magic");
    if (std::memcmp(magic, kLlamaMagic, sizeof magic) != 0)
      fail("{}: not llama-perplexity's --kl-divergence-base file (its first bytes are not \"_logits_\")", path);
    const LlamaLogitsHead head = read_llama_head(f, path, vocab, context_limit);
    std::fclose(f);
    const bool bos = bos_id >= 0 && head.tokens.front() == bos_id;
    return {chunk_plan(head.tokens, head.ctx, head.chunks, bos ? bos_id : -1), bos};
  } catch (...) {
    std::fclose(f);
    throw;
  }
}

LlamaLogitsWriter::LlamaLogitsWriter(const std::string& path, const ScoringPlan& plan, std::int64_t vocab)
    : path_(path), vocab_(vocab), rows_left_(plan.scored_tokens()),
      packed_(static_cast<std::size_t>(llama_row_u16(vocab)), 0) {
  const std::int64_t ctx = plan.sequences.empty() ? 0 : static_cast<std::int64_t>(plan.sequences.front().size());
  for (const auto& seq : plan.sequences)
    if (static_cast<std::int64_t>(seq.size()) != ctx || plan.first_scored != ctx / 2)
      fail("{}: llama-perplexity's files hold chunks of equal length scored from their middle, which "
           "--per-document scoring does not give", path);
  const auto fits = [](std::int64_t v) { return v > 0 && v <= std::numeric_limits<std::int32_t>::max(); };
  if (!fits(ctx) || !fits(vocab) || !fits(static_cast<std::int64_t>(plan.sequences.size())))
    fail("{}: no chunks to write, or more than its 32-bit fields hold", path);
  file_ = std::fopen((path + ".tmp").c_str(), "wb");
  if (file_ == nullptr) fail("{}.tmp: cannot create: {}", path, std::strerror(errno));
  const std::int32_t head[3] = {static_cast<std::int32_t>(ctx), static_cast<std::int32_t>(vocab),
                                static_cast<std::int32_t>(plan.sequences.size())};
  write_all(file_, kLlamaMagic, sizeof kLlamaMagic, path + ".tmp");
  write_all(file_, head, sizeof head, path + ".tmp");
  for (const auto& seq : plan.sequences) write_all(file_, seq.data(), seq.size() * sizeof(std::int32_t), path + ".tmp");
}

LlamaLogitsWriter::~LlamaLogitsWriter() {
  if (file_ == nullptr) return;
  std::fclose(file_);  // not finished: the partial file goes
  std::error_code ec;
  std::filesystem::remove(path_ + ".tmp", ec);
}

void LlamaLogitsWriter::write(const float* logits) {
  if (rows_left_ <= 0) fail("{}: more scored positions than the plan has", path_);
  // llama-perplexity's log_softmax(n_vocab, logits, log_prob, tok) (examples/perplexity/perplexity.cpp).
  float max_logit = logits[0], min_logit = logits[0];
  for (std::int64_t i = 1; i < vocab_; ++i) max_logit = std::max(max_logit, logits[i]), min_logit = std::min(min_logit, logits[i]);
  min_logit = std::max(min_logit, max_logit - 16);
  double sum_exp = 0.0;
  for (std::int64_t i = 0; i < vocab_; ++i) sum_exp += std::exp(logits[i] - max_logit);
  const auto log_sum_exp = static_cast<float>(std::log(sum_exp));
  const float min_log_prob = min_logit - max_logit - log_sum_exp;
  const float scale = (max_logit - min_logit) / 65535.f;
  std::memcpy(packed_.data(), &scale, sizeof scale);
  std::memcpy(packed_.data() + 2, &min_log_prob, sizeof min_log_prob);
  const float inv_scale = scale != 0 ? 1 / scale : 0;
  for (std::int64_t i = 0; i < vocab_; ++i)
    packed_[static_cast<std::size_t>(4 + i)] =
        scale != 0 && logits[i] > min_logit ? static_cast<std::uint16_t>(std::lrint(inv_scale * (logits[i] - min_logit))) : 0;
  write_all(file_, packed_.data(), packed_.size() * sizeof(std::uint16_t), path_ + ".tmp");
  --rows_left_;
}

void LlamaLogitsWriter::finish() {
  if (rows_left_ != 0) fail("{}: {} scored positions not written", path_, rows_left_);
  const bool flushed = std::fflush(file_) == 0;
  std::fclose(file_);
  file_ = nullptr;
  std::error_code ec;
  if (!flushed) {
    std::filesystem::remove(path_ + ".tmp", ec);
    fail("{}.tmp: write failed: {}", path_, std::strerror(errno));
  }
  std::filesystem::rename(path_ + ".tmp", path_, ec);
  if (ec) {
    const std::string why = ec.message();
    std::filesystem::remove(path_ + ".tmp", ec);
    fail("{}: cannot rename into place: {}", path_, why);
  }
}

RefLogprobFile::RefLogprobFile(std::FILE* f, std::string path, bool rename, std::int64_t vocab, long data_start)
    : file_(f), path_(std::move(path)), rename_(rename), vocab_(vocab), data_start_(data_start),
      row_(static_cast<std::size_t>(vocab)) {}

RefLogprobFile::RefLogprobFile(RefLogprobFile&& o) noexcept
    : file_(o.file_), path_(std::move(o.path_)), rename_(o.rename_), rows_read_(o.rows_read_), rows_(o.rows_),
      vocab_(o.vocab_),
      data_start_(o.data_start_), row_(std::move(o.row_)), llama_(o.llama_), packed_(std::move(o.packed_)) {
  o.file_ = nullptr;
}

RefLogprobFile::~RefLogprobFile() {
  if (file_ != nullptr) std::fclose(file_);
}

RefLogprobFile RefLogprobFile::create(const std::string& path, const ScoringPlan& plan, std::int64_t vocab) {
  std::FILE* f = path.empty() ? std::tmpfile() : std::fopen((path + ".tmp").c_str(), "w+b");
  const std::string shown = path.empty() ? std::string("temporary reference file") : path + ".tmp";
  if (f == nullptr) fail("{}: cannot create: {}", shown, std::strerror(errno));
  RefLogprobFile r(f, path, !path.empty(), vocab, 0);
  r.rows_ = plan.scored_tokens();
  write_all(f, kMagic, sizeof kMagic, shown);
  const std::int64_t head[3] = {vocab, plan.first_scored, static_cast<std::int64_t>(plan.sequences.size())};
  write_all(f, head, sizeof head, shown);
  for (const auto& s : plan.sequences) {
    const auto n = static_cast<std::int64_t>(s.size());
    write_all(f, &n, sizeof n, shown);
    write_all(f, s.data(), s.size() * sizeof(std::int32_t), shown);
  }
  r.data_start_ = std::ftell(f);
  return r;
}

RefLogprobFile RefLogprobFile::open(const std::string& path, const ScoringPlan& plan, std::int64_t vocab) {
  RefLogprobFile r(open_regular(path), path, false, vocab, 0);
  r.rows_ = plan.scored_tokens();
  std::FILE* f = r.file_;
  char magic[8];
  read_all(f, magic, sizeof magic, path, "magic");
  if (std::memcmp(magic, kLlamaMagic, sizeof magic) == 0) {
    const LlamaLogitsHead head = read_llama_head(f, path, vocab, 0);
    if (static_cast<std::int64_t>(plan.sequences.size()) != head.chunks || plan.first_scored != head.ctx / 2)
      fail("{}: holds {} chunks scored from {}, this run has {} scored from {}", path, head.chunks, head.ctx / 2,
           plan.sequences.size(), plan.first_scored);
    for (std::size_t c = 0; c < plan.sequences.size(); ++c) {
      const std::vector<std::int32_t>& seq = plan.sequences[c];
      // Position 0 may have become BOS (llama_logits_plan); it is never a scored target.
      const auto* chunk = head.tokens.data() + c * static_cast<std::size_t>(head.ctx);
      if (static_cast<std::int64_t>(seq.size()) != head.ctx || !std::equal(seq.begin() + 1, seq.end(), chunk + 1))
        fail("{}: chunk {} holds different tokens than this run's", path, c);
    }
    r.llama_ = true;
    r.packed_.resize(static_cast<std::size_t>(head.nv));
    r.data_start_ = std::ftell(f);
    return r;
  }
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0)
    fail("{}: neither a woq reference file nor llama-perplexity's --kl-divergence-base file (bad magic)", path);
  std::int64_t head[3];
  read_all(f, head, sizeof head, path, "header");
  if (head[0] != vocab) fail("{}: computed with a vocabulary of {}, this model has {}", path, head[0], vocab);
  if (head[1] != plan.first_scored || head[2] != static_cast<std::int64_t>(plan.sequences.size()))
    fail("{}: computed on {} sequences scored from {}, this run has {} scored from {} (same --file, --ctx, "
         "--chunks and mode?)", path, head[2], head[1], plan.sequences.size(), plan.first_scored);
  std::vector<std::int32_t> ids;
  for (std::size_t s = 0; s < plan.sequences.size(); ++s) {
    std::int64_t n = 0;
    read_all(f, &n, sizeof n, path, "sequence length");
    if (n != static_cast<std::int64_t>(plan.sequences[s].size()))
      fail("{}: sequence {} has {} tokens, this run has {}", path, s, n, plan.sequences[s].size());
    ids.resize(static_cast<std::size_t>(n));
    read_all(f, ids.data(), ids.size() * sizeof(std::int32_t), path, "token ids");
    if (ids != plan.sequences[s]) fail("{}: sequence {} holds different tokens than this run's", path, s);
  }
  r.data_start_ = std::ftell(f);
  return r;
}

void RefLogprobFile::write_logits(const float* logits) {
  log_softmax(logits, vocab_, row_.data());
  write_all(file_, row_.data(), row_.size() * sizeof(float), name());
}

void RefLogprobFile::finish() {
  if (std::fflush(file_) != 0) fail("{}: flush failed: {}", name(), std::strerror(errno));
  if (rename_) {
    std::error_code ec;
    std::filesystem::rename(path_ + ".tmp", path_, ec);
    if (ec) {
      const std::string why = ec.message();
      std::filesystem::remove(path_ + ".tmp", ec);
      fail("{}: cannot rename into place: {}", path_, why);
    }
    rename_ = false;
  }
  std::fseek(file_, data_start_, SEEK_SET);
}

float RefLogprobFile::kl_floor() const {
  return llama_ ? kLlamaKlFloor : -std::numeric_limits<float>::infinity();
}

void RefLogprobFile::read_llama_row(float* row) {
  if (std::fread(packed_.data(), sizeof(std::uint16_t), packed_.size(), file_) != packed_.size())
    fail("{}: ends before the last scored position", name());
  float scale = 0, min_log_prob = 0;
  std::memcpy(&scale, packed_.data(), sizeof scale);
  std::memcpy(&min_log_prob, packed_.data() + 2, sizeof min_log_prob);
  if (!std::isfinite(scale) || scale < 0 || !std::isfinite(min_log_prob) || min_log_prob > 1e-3f)
    fail("{}: scored position {} has scale {} and min_log_prob {}: not llama-perplexity's (corrupt file?)", name(),
         rows_read_, scale, min_log_prob);
  // llama-perplexity's decoding (its log_softmax against a base); what it leaves out of the KL, the check leaves out.
  double sum = 0;
  for (std::int64_t i = 0; i < vocab_; ++i) {
    row[i] = scale * static_cast<float>(packed_[static_cast<std::size_t>(4 + i)]) + min_log_prob;
    if (row[i] > 1e-3f)
      fail("{}: scored position {} holds {} at token {}: not a log-probability (corrupt file?)", name(), rows_read_,
           row[i], i);
    if (row[i] > kLlamaKlFloor) sum += std::exp(static_cast<double>(row[i]));
  }
  // Its 16-bit steps of at most 16/65535 nats, and the probabilities below e^-16 it drops, move the sum a little.
  if (std::fabs(sum - 1.0) > 0.05)
    fail("{}: scored position {}: probabilities sum to {}, not 1 (corrupt file?)", name(), rows_read_, sum);
  ++rows_read_;
}

void RefLogprobFile::read(float* row) {
  if (llama_) return read_llama_row(row);
  if (std::fread(row, sizeof(float), static_cast<std::size_t>(vocab_), file_) != static_cast<std::size_t>(vocab_))
    fail("{}: ends before the last scored position", name());
  // A log-softmax row: finite values <= 0 whose probabilities sum to 1.
  double sum = 0;
  for (std::int64_t i = 0; i < vocab_; ++i) {
    if (!std::isfinite(row[i]) || row[i] > 1e-3f)
      fail("{}: scored position {} holds {} at token {}: not a log-probability (corrupt file?)", name(), rows_read_,
           row[i], i);
    sum += std::exp(static_cast<double>(row[i]));
  }
  if (std::fabs(sum - 1.0) > 1e-3)
    fail("{}: scored position {}: probabilities sum to {}, not 1 (corrupt file?)", name(), rows_read_, sum);
  ++rows_read_;
}

void RefLogprobFile::expect_end() {
  if (std::fgetc(file_) != EOF) fail("{}: holds data after the last scored position (another run's file?)", name());
}

void RefLogprobFile::rewind() { seek(0); }

void RefLogprobFile::seek(std::int64_t row) {
  if (row < 0 || row > rows_) fail("{}: row {} of a plan of {} scored positions", name(), row, rows_);
  const std::int64_t row_bytes = llama_ ? static_cast<std::int64_t>(packed_.size() * sizeof(std::uint16_t))
                                        : vocab_ * static_cast<std::int64_t>(sizeof(float));
  if (fseeko(file_, static_cast<off_t>(data_start_ + row * row_bytes), SEEK_SET) != 0) fail("{}: cannot seek", name());
  rows_read_ = row;
}

void CompareAccumulator::add(const float* ref, const float* cand, std::int32_t target) {
  std::vector<float> lc(static_cast<std::size_t>(vocab_));
  log_softmax(cand, vocab_, lc.data());
  double kl = 0;
  for (std::int64_t i = 0; i < vocab_; ++i) {
    if (!(ref[i] > kl_floor_)) continue;
    const double p = std::exp(static_cast<double>(ref[i]));
    kl += p * (static_cast<double>(ref[i]) - lc[static_cast<std::size_t>(i)]);
  }
  // A woq reference's exact log-probabilities leave only rounding below 0; llama-perplexity's 16-bit ones leave
  // noise either side of it, which it averages unclipped (clipping would bias the mean up by that noise).
  kl_.push_back(std::isinf(kl_floor_) ? std::max(0.0, kl) : kl);
  if (std::max_element(ref, ref + vocab_) - ref == std::max_element(cand, cand + vocab_) - cand) ++same_;
  nll_ref_.push_back(-static_cast<double>(ref[target]));
  nll_cand_.push_back(-static_cast<double>(lc[static_cast<std::size_t>(target)]));
  dp_.push_back(std::exp(-nll_cand_.back()) - std::exp(-nll_ref_.back()));
}

void CompareAccumulator::gather(Ranks& ranks) {
  if (ranks.size() == 1) return;
  for (std::vector<double>* v : {&kl_, &nll_ref_, &nll_cand_, &dp_}) *v = gather_doubles(ranks, *v);
  const std::vector<double> same = gather_doubles(ranks, {static_cast<double>(same_)});
  same_ = 0;
  for (const double n : same) same_ += static_cast<std::int64_t>(n);
}

CompareStats CompareAccumulator::result() const {
  if (kl_.empty()) fail("compare: no scored positions");
  CompareStats s;
  s.positions = static_cast<std::int64_t>(kl_.size());
  const double n = static_cast<double>(kl_.size());
  double sum = 0, sum2 = 0, dp2 = 0;
  for (std::size_t i = 0; i < kl_.size(); ++i) {
    sum += kl_[i];
    sum2 += kl_[i] * kl_[i];
    dp2 += dp_[i] * dp_[i];
  }
  s.mean_kl = sum / n;
  s.kl_stderr = kl_.size() > 1 ? std::sqrt(std::max(0.0, sum2 / n - s.mean_kl * s.mean_kl) / (n - 1)) : 0.0;
  s.median_kl = quantile(kl_, 0.5);
  s.p90_kl = quantile(kl_, 0.9);
  s.p99_kl = quantile(kl_, 0.99);
  s.max_kl = *std::max_element(kl_.begin(), kl_.end());
  s.same_top = static_cast<double>(same_) / n;
  s.same_top_stderr = n > 1 ? std::sqrt(s.same_top * (1 - s.same_top) / (n - 1)) : 0.0;  // llama-perplexity's
  s.ref = perplexity(nll_ref_);
  s.cand = perplexity(nll_cand_);
  s.ppl_ratio = s.cand.ppl / s.ref.ppl;
  s.rms_dp = std::sqrt(dp2 / n);
  return s;
}

}  // namespace woq
