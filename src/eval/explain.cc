#include "eval/explain.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "arch/architecture.h"
#include "core/error.h"
#include "eval/perplexity.h"
#include "generate/generate.h"
#include "kernels/matmul.h"

namespace woq {

namespace {

std::vector<double> probabilities(const float* logits, std::int64_t n) {
  const double log_z = log_sum_exp(logits, n);
  std::vector<double> p(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) p[static_cast<std::size_t>(i)] = std::exp(logits[i] - log_z);
  return p;
}

std::vector<TokenProb> top2(const std::vector<double>& p, const Tokenizer& tok) {
  std::vector<std::int32_t> idx(p.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::partial_sort(idx.begin(), idx.begin() + 2, idx.end(),
                    [&](std::int32_t a, std::int32_t b) { return p[static_cast<std::size_t>(a)] > p[static_cast<std::size_t>(b)]; });
  std::vector<TokenProb> out;
  for (int i = 0; i < 2; ++i) out.push_back({idx[static_cast<std::size_t>(i)], tok.token_text(idx[static_cast<std::size_t>(i)]),
                                             p[static_cast<std::size_t>(idx[static_cast<std::size_t>(i)])]});
  return out;
}

std::vector<std::int32_t> greedy(LlamaModel& model, const Tokenizer& tok, const std::string& prompt, std::int64_t n,
                                 std::vector<std::int32_t>* prompt_ids) {
  GenerateOptions o;
  o.max_new_tokens = n;
  o.sampling.temperature = 0;
  const GenerateResult r = generate(model, tok, prompt, o, [](std::string_view) {});
  if (prompt_ids != nullptr) *prompt_ids = r.prompt_ids;
  return r.generated_ids;
}

double frobenius(const std::vector<float>& a) {
  double s = 0;
  for (const float v : a) s += static_cast<double>(v) * v;
  return std::sqrt(s);
}

}  // namespace

bool Explanation::near_tie() const {
  return original_top.size() == 2 && original_top[0].p - original_top[1].p < near_tie_margin;
}

Explanation explain(LlamaModel& original, LlamaModel& quantized, const Tokenizer& tok, const std::string& prompt,
                    std::int64_t max_new_tokens) {
  const ModelConfig& c = original.config();
  const ModelConfig& q = quantized.config();
  if (c.hidden_size != q.hidden_size || c.num_hidden_layers != q.num_hidden_layers || c.vocab_size != q.vocab_size ||
      c.intermediate_size != q.intermediate_size)
    fail("explain: the two models have different shapes");
  Explanation e;
  e.original_ids = greedy(original, tok, prompt, max_new_tokens, &e.prompt_ids);
  e.quantized_ids = greedy(quantized, tok, prompt, max_new_tokens, nullptr);
  e.original_text = tok.decode(e.original_ids);
  e.quantized_text = tok.decode(e.quantized_ids);
  const std::size_t common = std::min(e.original_ids.size(), e.quantized_ids.size());
  for (std::size_t i = 0; i < common && e.diverges_at < 0; ++i)
    if (e.original_ids[i] != e.quantized_ids[i]) e.diverges_at = static_cast<std::int64_t>(i);
  if (e.diverges_at < 0 && e.original_ids.size() != e.quantized_ids.size()) e.diverges_at = static_cast<std::int64_t>(common);

  // Teacher-forced on the original's sequence: the distributions of both models.
  std::vector<std::int32_t> seq = e.prompt_ids;
  seq.insert(seq.end(), e.original_ids.begin(), e.original_ids.end());
  const auto t = static_cast<std::int64_t>(seq.size());
  std::vector<float> lo, lq;
  KVCache co = original.make_cache(t), cq = quantized.make_cache(t);
  original.forward(seq, co, true, lo);
  quantized.forward(seq, cq, true, lq);
  const std::int64_t vocab = c.vocab_size;
  const auto first = static_cast<std::int64_t>(e.prompt_ids.size()) - 1;  // predicts generated token 0
  for (std::int64_t g = 0; g < static_cast<std::int64_t>(e.original_ids.size()); ++g) {
    const std::int64_t pos = first + g;
    const auto po = probabilities(lo.data() + pos * vocab, vocab), pq = probabilities(lq.data() + pos * vocab, vocab);
    double kl = 0;
    for (std::size_t i = 0; i < po.size(); ++i)
      if (po[i] > 0) kl += po[i] * (std::log(po[i]) - std::log(std::max(pq[i], 1e-300)));
    e.kl.push_back(std::max(0.0, kl));
    if (g == e.diverges_at) {
      e.original_top = top2(po, tok);
      e.quantized_top = top2(pq, tok);
    }
  }

  // Per-linear errors on this sequence's activations (the original's, block by block).
  std::vector<float> x(static_cast<std::size_t>(t * c.hidden_size));
  original.embed(seq, x.data());
  ThreadPool pool(1);
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    original.forward_block(l, x.data(), t, [&](LinearRole role, const float* in, std::int64_t rows) {
      const QuantMatrix& w = original.block_linear(l, role);
      QuantMatrix& wq = quantized.block_linear(l, role);
      std::vector<float> ref(static_cast<std::size_t>(rows * w.rows)), got(ref.size()), weights_only;
      matmul(w, in, rows, ref.data(), pool);
      matmul(wq, in, rows, got.data(), pool);
      const bool rounds = uses_q8_path(wq) || uses_bf16_path(wq), ref_rounds = uses_q8_path(w) || uses_bf16_path(w);
      if (const Activations act = wq.activations; rounds && !ref_rounds) {
        // Again with the inputs as they are: the weights' share of the error (not when the original's layer
        // rounds its inputs too: then f32 inputs would not isolate the weights).
        weights_only.resize(got.size());
        wq.activations = Activations::kF32;
        matmul(wq, in, rows, weights_only.data(), pool);
        wq.activations = act;
      }
      std::vector<float> row(static_cast<std::size_t>(w.cols)), rowq(row.size());
      double dw = 0, nw = 0;
      for (std::int64_t r = 0; r < w.rows; ++r) {
        dequantize_row(w, r, row.data());
        dequantize_row(wq, r, rowq.data());
        for (std::size_t k = 0; k < row.size(); ++k) {
          nw += static_cast<double>(row[k]) * row[k];
          dw += (static_cast<double>(row[k]) - rowq[k]) * (static_cast<double>(row[k]) - rowq[k]);
        }
      }
      for (std::size_t k = 0; k < got.size(); ++k) got[k] -= ref[k];
      for (std::size_t k = 0; k < weights_only.size(); ++k) weights_only[k] -= ref[k];
      const double ny = frobenius(ref);
      e.layers.push_back({l, std::string(linear_spec(role).module), nw > 0 ? std::sqrt(dw / nw) : 0.0, ny > 0 ? frobenius(got) / ny : 0.0,
                          weights_only.empty() ? -1.0 : (ny > 0 ? frobenius(weights_only) / ny : 0.0)});
    });
  }
  std::sort(e.layers.begin(), e.layers.end(),
            [](const LinearError& a, const LinearError& b) { return a.output_error > b.output_error; });
  return e;
}

}  // namespace woq
