// woq eval perplexity / woq eval compare.
#include <unistd.h>

#include <chrono>
#include <optional>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "eval/compare.h"
#include "eval/perplexity.h"
#include "io/json_file.h"

namespace woq::cli {

namespace {

struct EvalArgs {
  std::string model_dir;
  std::string low_bit = "sym_int4";
  ModelFlags model;
  std::string file;
  std::int64_t ctx = 512;
  std::int64_t batch = 0;
  std::int64_t chunks = 0;
  bool no_bos_per_chunk = false;
  std::string per_document;
  std::string json;
  // compare only
  std::string ref_low_bit = "fp32";
  std::string ref_dir;
  std::string save_ref, load_ref;
};

void add_common(CLI::App* cmd, EvalArgs& a) {
  cmd->add_option("-m,--model", a.model_dir, "Model directory")->required();
  cmd->add_option("--low-bit", a.low_bit, "Format of the linear layers")->capture_default_str();
  add_model_flags(cmd, a.model);
  cmd->add_option("-f,--file", a.file, "Text file to score")->required();
  cmd->add_option("--ctx", a.ctx, "Tokens per chunk (documents are cut to this)")->capture_default_str()->check(kPositive);
  cmd->add_option("--batch", a.batch, "Tokens per forward call; 0 = the whole chunk")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--chunks", a.chunks, "Score at most this many chunks or documents; 0 = all")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_flag("--no-bos-per-chunk", a.no_bos_per_chunk,
                "Keep each chunk's first token (llama-perplexity replaces it with BOS when the tokenizer adds one)");
  cmd->add_option("--per-document", a.per_document,
                  "Score each document from position 0 instead, splitting the text on this separator (e.g. '<|endoftext|>')");
  cmd->add_option("--json", a.json, "Also write the results as JSON to this file");
}

ScoringPlan make_plan(const EvalArgs& a, const Tokenizer& tok) {
  const std::string text = read_text_file(a.file);
  if (!a.per_document.empty()) return document_plan(tok, text, a.per_document, a.ctx, a.chunks);
  const std::int32_t bos = !a.no_bos_per_chunk && tok.add_bos() ? tok.bos_id() : -1;
  try {
    return chunk_plan(tok.encode(text), a.ctx, a.chunks, bos);
  } catch (const Error& e) {
    fail("{}: {}", a.file, e.what());
  }
}

std::string describe_plan(const EvalArgs& a, const ScoringPlan& plan) {
  if (!a.per_document.empty())
    return fmt::format("{} documents scored from position 0{}", plan.sequences.size(),
                       plan.truncated > 0 ? fmt::format(", {} cut to --ctx {}", plan.truncated, a.ctx) : "");
  return fmt::format("{} chunks of {} tokens scored from {}", plan.sequences.size(), a.ctx, plan.first_scored);
}

// A progress line with ETA on a terminal; nothing otherwise.
std::function<void(std::int64_t, std::int64_t)> progress_bar(const char* what) {
  if (isatty(STDERR_FILENO) == 0) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  return [start, what](std::int64_t done, std::int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    fmt::print(stderr, "\rwoq: {} {}/{} ({:.0f} s, ETA {:.0f} s)   {}", what, done, total, s,
               s / static_cast<double>(done) * static_cast<double>(total - done), done == total ? "\n" : "");
  };
}

std::unique_ptr<LlamaModel> load(const std::string& dir, const EvalArgs& a, const std::string& low_bit, ThreadPool& pool) {
  const LoadOptions options = load_options(a.model, low_bit);
  LoadReport report;
  auto model = LlamaModel::load(dir, options, pool, &report);
  print_load_report(report, options);
  return model;
}

void write_json(const std::string& path, const nlohmann::ordered_json& j) {
  if (!path.empty()) write_json_file(path, j);
}

int run_perplexity(const EvalArgs& a) {
  ThreadPool pool(a.model.threads);
  auto model = load(a.model_dir, a, a.low_bit, pool);
  const Tokenizer tok = Tokenizer::load(a.model_dir);
  const ScoringPlan plan = make_plan(a, tok);
  const std::int64_t vocab = model->config().vocab_size;
  std::vector<double> nll;
  const double seconds = run_plan(
      *model, plan, a.batch,
      [&](std::int64_t, std::int64_t, std::int32_t target, const float* logits) {
        nll.push_back(token_nll(logits, vocab, target));
      },
      progress_bar("chunk"));
  const Perplexity p = perplexity(nll);
  std::int64_t run_tokens = 0;
  for (const auto& s : plan.sequences) run_tokens += static_cast<std::int64_t>(s.size());
  fmt::print("PPL = {:.4f} +/- {:.4f} over {} scored tokens ({}); {:.1f} tokens/s\n", p.ppl, p.ppl_stderr, p.tokens,
             describe_plan(a, plan), static_cast<double>(run_tokens) / seconds);
  write_json(a.json, {{"ppl", p.ppl},
                      {"ppl_stderr", p.ppl_stderr},
                      {"mean_nll", p.mean_nll},
                      {"tokens", p.tokens},
                      {"sequences", plan.sequences.size()},
                      {"mode", a.per_document.empty() ? "chunks" : "per-document"},
                      {"ctx", a.ctx},
                      {"low_bit", a.low_bit},
                      {"tokens_per_second", static_cast<double>(run_tokens) / seconds}});
  return 0;
}

int run_compare(const EvalArgs& a) {
  if (!a.load_ref.empty() && (!a.ref_dir.empty() || !a.save_ref.empty()))
    fail("--load-ref replaces the reference run: do not combine it with --ref or --save-ref");
  ThreadPool pool(a.model.threads);
  const Tokenizer tok = Tokenizer::load(a.model_dir);
  const ScoringPlan plan = make_plan(a, tok);
  const std::int64_t vocab = read_model_config(a.model_dir).vocab_size;
  std::optional<RefLogprobFile> ref;
  if (!a.load_ref.empty()) {
    ref.emplace(RefLogprobFile::open(a.load_ref, plan, vocab));
  } else {
    const std::string ref_dir = a.ref_dir.empty() ? a.model_dir : a.ref_dir;
    auto ref_model = load(ref_dir, a, a.ref_low_bit, pool);
    if (ref_model->config().vocab_size != vocab)
      fail("--ref {} has a vocabulary of {}, the model {}", ref_dir, ref_model->config().vocab_size, vocab);
    ref.emplace(RefLogprobFile::create(a.save_ref, plan, vocab));
    run_plan(*ref_model, plan, a.batch,
             [&](std::int64_t, std::int64_t, std::int32_t, const float* logits) { ref->write_logits(logits); },
             progress_bar("reference"));
    ref->finish();
  }
  auto model = load(a.model_dir, a, a.low_bit, pool);
  CompareAccumulator acc(vocab);
  std::vector<float> row(static_cast<std::size_t>(vocab));
  run_plan(
      *model, plan, a.batch,
      [&](std::int64_t, std::int64_t, std::int32_t target, const float* logits) {
        ref->read(row.data());
        acc.add(row.data(), logits, target);
      },
      progress_bar("candidate"));
  const CompareStats s = acc.result();
  fmt::print("{} vs {}: {} scored tokens ({})\n", a.low_bit,
             a.load_ref.empty() ? (a.ref_dir.empty() ? a.ref_low_bit : a.ref_dir) : a.load_ref, s.positions,
             describe_plan(a, plan));
  fmt::print("PPL(candidate) = {:.4f} +/- {:.4f}\nPPL(reference) = {:.4f} +/- {:.4f}\nPPL ratio      = {:.5f}\n",
             s.cand.ppl, s.cand.ppl_stderr, s.ref.ppl, s.ref.ppl_stderr, s.ppl_ratio);
  fmt::print("Mean KLD       = {:.6f} +/- {:.6f}\nMedian KLD     = {:.6f}\n90% KLD        = {:.6f}\n"
             "99% KLD        = {:.6f}\nMaximum KLD    = {:.6f}\n",
             s.mean_kl, s.kl_stderr, s.median_kl, s.p90_kl, s.p99_kl, s.max_kl);
  fmt::print("Same top token = {:.3f} %\nRMS delta p    = {:.3f} %\n", 100 * s.same_top, 100 * s.rms_dp);
  write_json(a.json, {{"low_bit", a.low_bit},
                      {"tokens", s.positions},
                      {"ppl", s.cand.ppl},
                      {"ppl_stderr", s.cand.ppl_stderr},
                      {"ref_ppl", s.ref.ppl},
                      {"ref_ppl_stderr", s.ref.ppl_stderr},
                      {"ppl_ratio", s.ppl_ratio},
                      {"mean_kl", s.mean_kl},
                      {"kl_stderr", s.kl_stderr},
                      {"median_kl", s.median_kl},
                      {"p90_kl", s.p90_kl},
                      {"p99_kl", s.p99_kl},
                      {"max_kl", s.max_kl},
                      {"same_top", s.same_top},
                      {"rms_dp", s.rms_dp}});
  return 0;
}

}  // namespace

Run add_eval(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Measure accuracy: perplexity, or a comparison against the original");
  eval->require_subcommand(1);
  auto ppl = std::make_shared<EvalArgs>();
  CLI::App* p = eval->add_subcommand(
      "perplexity", "Perplexity of a text (llama-perplexity's chunks scored on their second half, or per document)");
  add_common(p, *ppl);
  auto cmp = std::make_shared<EvalArgs>();
  CLI::App* c = eval->add_subcommand(
      "compare", "KL divergence, same-top-token rate and perplexity ratio of --low-bit against a reference");
  add_common(c, *cmp);
  c->add_option("--ref-low-bit", cmp->ref_low_bit, "Format of the reference (the same model directory)")
      ->capture_default_str();
  c->add_option("--ref", cmp->ref_dir, "Reference model directory (instead of the same model at --ref-low-bit)");
  c->add_option("--save-ref", cmp->save_ref, "Save the reference's log-probabilities to this file");
  c->add_option("--load-ref", cmp->load_ref, "Use log-probabilities saved by --save-ref instead of running the reference");
  return [p, c, ppl, cmp] { return p->parsed() ? run_perplexity(*ppl) : run_compare(*cmp); };
}

}  // namespace woq::cli
