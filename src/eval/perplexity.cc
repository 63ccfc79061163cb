#include "eval/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/error.h"

namespace woq {

std::int64_t ScoringPlan::scored_tokens() const {
  std::int64_t n = 0;
  for (const auto& s : sequences) n += std::max<std::int64_t>(0, static_cast<std::int64_t>(s.size()) - 1 - first_scored);
  return n;
}

ScoringPlan ScoringPlan::slice(std::int64_t first, std::int64_t last) const {
  if (first < 0 || first > last || last > static_cast<std::int64_t>(sequences.size()))
    fail("sequences [{}, {}) of a plan of {}", first, last, sequences.size());
  ScoringPlan out;
  out.sequences.assign(sequences.begin() + first, sequences.begin() + last);
  out.first_scored = first_scored;
  out.truncated = truncated;
  return out;
}

PlanShare plan_share(const ScoringPlan& plan, Ranks& ranks) {
  const auto [first, last] = share(static_cast<std::int64_t>(plan.sequences.size()), ranks.rank(), ranks.size());
  return {plan.slice(first, last), plan.slice(0, first).scored_tokens()};
}

ScoringPlan chunk_plan(const std::vector<std::int32_t>& tokens, std::int64_t ctx, std::int64_t max_chunks,
                       std::int32_t bos) {
  if (ctx < 3) fail("--ctx {} leaves nothing to score: chunks are scored on their second half (need at least 3)", ctx);
  std::int64_t chunks = static_cast<std::int64_t>(tokens.size()) / ctx;
  if (chunks == 0)
    fail("the text has {} tokens, fewer than one chunk of --ctx {}", tokens.size(), ctx);
  if (max_chunks > 0) chunks = std::min(chunks, max_chunks);
  ScoringPlan plan;
  plan.first_scored = ctx / 2;
  for (std::int64_t c = 0; c < chunks; ++c) {
    plan.sequences.emplace_back(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    if (bos >= 0) plan.sequences.back()[0] = bos;
  }
  return plan;
}

std::int32_t chunk_bos(const Tokenizer& tokenizer) { return tokenizer.add_bos() ? tokenizer.bos_id() : -1; }

ScoringPlan document_plan(const Tokenizer& tokenizer, const std::string& text, const std::string& separator,
                          std::int64_t ctx, std::int64_t max_documents) {
  if (separator.empty()) fail("the document separator must not be empty");
  if (ctx < 2) fail("the context must be at least 2 tokens, got {}", ctx);
  ScoringPlan plan;
  std::size_t begin = 0;
  while (begin <= text.size() && (max_documents <= 0 || static_cast<std::int64_t>(plan.sequences.size()) < max_documents)) {
    std::size_t end = text.find(separator, begin);
    if (end == std::string::npos) end = text.size();
    std::string doc = text.substr(begin, end - begin);
    const auto first = doc.find_first_not_of(" \t\r\n");
    if (first != std::string::npos) {
      doc = doc.substr(first, doc.find_last_not_of(" \t\r\n") - first + 1);
      std::vector<std::int32_t> ids = tokenizer.encode(doc);
      if (static_cast<std::int64_t>(ids.size()) > ctx) {
        ids.resize(static_cast<std::size_t>(ctx));
        ++plan.truncated;
      }
      if (ids.size() >= 2) plan.sequences.push_back(std::move(ids));
    }
    begin = end + separator.size();
  }
  if (plan.sequences.empty()) fail("no document with at least two tokens (separator '{}')", separator);
  return plan;
}

double run_plan(LlamaModel& model, const ScoringPlan& plan, std::int64_t batch, const ScoredLogits& sink,
                const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const auto start = std::chrono::steady_clock::now();
  const std::int64_t vocab = model.config().vocab_size;
  std::vector<float> logits;
  const auto total = static_cast<std::int64_t>(plan.sequences.size());
  for (std::int64_t s = 0; s < total; ++s) {
    const auto& seq = plan.sequences[static_cast<std::size_t>(s)];
    const auto n = static_cast<std::int64_t>(seq.size());
    KVCache cache = model.make_cache(n);
    const std::int64_t step = batch > 0 ? batch : n;
    for (std::int64_t p0 = 0; p0 < n; p0 += step) {
      const std::int64_t len = std::min(step, n - p0);
      model.forward(std::span<const std::int32_t>(seq.data() + p0, static_cast<std::size_t>(len)), cache, true, logits);
      for (std::int64_t j = std::max(p0, plan.first_scored); j < std::min(p0 + len, n - 1); ++j)
        sink(s, j, seq[static_cast<std::size_t>(j + 1)], logits.data() + (j - p0) * vocab);
    }
    if (progress) progress(s + 1, total);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

Perplexity perplexity(const std::vector<double>& nll) {
  if (nll.empty()) fail("perplexity of zero tokens");
  Perplexity p;
  p.tokens = static_cast<std::int64_t>(nll.size());
  double sum = 0, sum2 = 0;
  for (const double v : nll) {
    sum += v;
    sum2 += v * v;
  }
  const double n = static_cast<double>(nll.size());
  p.mean_nll = sum / n;
  p.ppl = std::exp(p.mean_nll);
  const double var = std::max(0.0, sum2 / n - p.mean_nll * p.mean_nll);
  p.ppl_stderr = nll.size() > 1 ? p.ppl * std::sqrt(var / (n - 1)) : 0.0;
  return p;
}

}  // namespace woq
