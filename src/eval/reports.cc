#include "eval/reports.h"

#include <algorithm>
#include <filesystem>
#include <numeric>

#include <fmt/core.h>

#include "core/error.h"
#include "core/utf8.h"

namespace woq {

namespace {

std::string describe_plan(const ScoringRequest& r, const ScoringPlan& plan) {
  if (!r.per_document.empty())
    return fmt::format("{} documents scored from position 0{}", plan.sequences.size(),
                       plan.truncated > 0 ? fmt::format(", {} cut to --ctx {}", plan.truncated, r.ctx) : "");
  return fmt::format("{} chunks of {} tokens scored from {}", plan.sequences.size(),
                     plan.sequences.empty() ? r.ctx : static_cast<std::int64_t>(plan.sequences.front().size()),
                     plan.first_scored);
}

// A JSON-quoted string; invalid UTF-8 bytes shown as U+FFFD.
std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::ordered_json or_null(const CompareStats* s, double CompareStats::*field) {
  return s != nullptr ? nlohmann::ordered_json(s->*field) : nlohmann::ordered_json(nullptr);
}

// The Open LLM Leaderboard v1 tasks (each run at its default shot count).
constexpr const char* kOpenLlm = "mmlu,arc_challenge,gsm8k,hellaswag,winogrande,truthfulqa_mc2";

}  // namespace

ScoringPlan scoring_plan(const Tokenizer& tok, const std::string& text, const std::string& source,
                         const ScoringRequest& r, std::int64_t context_limit) {
  if (r.ctx > context_limit) fail("-c/--ctx-size {} exceeds the model's context of {} tokens", r.ctx, context_limit);
  if (!r.per_document.empty()) return document_plan(tok, text, r.per_document, r.ctx, r.chunks);
  const std::int32_t bos = r.bos_per_chunk ? chunk_bos(tok) : -1;
  try {
    return chunk_plan(tok.encode(text), r.ctx, r.chunks, bos);
  } catch (const Error& e) {
    fail("{}: {}", source, e.what());
  }
}

void require_same_vocabulary(const Tokenizer& candidate, const std::string& candidate_name, const Tokenizer& reference,
                             const std::string& reference_name) {
  if (candidate.vocab_size() != reference.vocab_size())
    fail("the reference {} has a tokenizer of {} tokens, the model {} one of {}: the reference must use the same "
         "tokenizer", reference_name, reference.vocab_size(), candidate_name, candidate.vocab_size());
  for (std::int32_t id = 0; id < candidate.vocab_size(); ++id) {
    const std::string mine = candidate.token_text(id), theirs = reference.token_text(id);
    if (mine != theirs)
      fail("the reference {} has another tokenizer than the model {}: token {} is '{}' in the reference and '{}' in "
           "the model (the same vocabulary, id for id, is needed to compare their predictions)",
           reference_name, candidate_name, id, printable_text(theirs), printable_text(mine));
  }
}

EvalReport perplexity_report(LlamaModel& model, const ModelIdentity& who, const ScoringPlan& plan,
                             const ScoringRequest& r, const Progress& progress, Ranks& ranks,
                             const ScoredLogits& also) {
  if (also && ranks.size() > 1) fail("the logits of every scored position are kept by one process only, not {} ranks", ranks.size());
  const std::int64_t vocab = model.config().vocab_size;
  std::vector<double> nll;
  if (ranks.size() > 1) ranks.all_gather({});  // start together: the slowest rank's time is then the wall time
  double seconds = run_plan(
      model, plan_share(plan, ranks).plan, r.batch,
      [&](std::int64_t seq, std::int64_t pos, std::int32_t target, const float* logits) {
        nll.push_back(token_nll(logits, vocab, target));
        if (also) also(seq, pos, target, logits);
      },
      progress);
  if (ranks.size() > 1) {
    nll = gather_doubles(ranks, nll);
    for (const double t : gather_doubles(ranks, {seconds})) seconds = std::max(seconds, t);
  }
  const Perplexity p = perplexity(nll);
  std::int64_t run_tokens = 0;
  for (const auto& s : plan.sequences) run_tokens += static_cast<std::int64_t>(s.size());
  const double tokens_per_second = static_cast<double>(run_tokens) / seconds;
  EvalReport out;
  out.text = fmt::format("model: {}\nPPL = {:.4f} +/- {:.4f} over {} scored tokens ({}); {:.1f} tokens/s{}\n", who.label,
                         p.ppl, p.ppl_stderr, p.tokens, describe_plan(r, plan), tokens_per_second,
                         ranks.size() > 1 ? fmt::format(" on {} ranks", ranks.size()) : "");
  out.json = {{"ppl", p.ppl},
              {"ppl_stderr", p.ppl_stderr},
              {"mean_nll", p.mean_nll},
              {"tokens", p.tokens},
              {"sequences", plan.sequences.size()},
              {"mode", r.per_document.empty() ? "chunks" : "per-document"},
              {"ctx", r.ctx},
              {"low_bit", who.low_bit},
              {"model", who.label},
              {"tokens_per_second", tokens_per_second},
              {"ranks", ranks.size()}};
  return out;
}

void write_reference(LlamaModel& reference, const ScoringPlan& plan, std::int64_t batch, RefLogprobFile& ref,
                     const Progress& progress) {
  run_plan(reference, plan, batch,
           [&](std::int64_t, std::int64_t, std::int32_t, const float* logits) { ref.write_logits(logits); }, progress);
  ref.finish();
}

CompareStats compare_with_reference(LlamaModel& candidate, const ScoringPlan& plan, std::int64_t batch,
                                    RefLogprobFile& ref, const Progress& progress, Ranks& ranks,
                                    std::int64_t first_row) {
  const std::int64_t vocab = candidate.config().vocab_size;
  std::vector<float> row(static_cast<std::size_t>(vocab));
  CompareAccumulator acc(vocab, ref.kl_floor());
  ref.seek(first_row);
  run_plan(
      candidate, plan, batch,
      [&](std::int64_t, std::int64_t, std::int32_t target, const float* logits) {
        ref.read(row.data());
        acc.add(row.data(), logits, target);
      },
      progress);
  if (ref.next_row() == ref.rows()) ref.expect_end();
  acc.gather(ranks);
  return acc.result();
}

std::pair<CompareStats, std::optional<CompareStats>> compare_candidate(
    LlamaModel& candidate, const LoadReport& loaded, bool reference_rounded,
    const std::function<std::unique_ptr<LlamaModel>()>& load_f32, const ScoringPlan& plan, std::int64_t batch,
    RefLogprobFile& ref, const Progress& progress, const Progress& f32_progress, Ranks& ranks,
    std::int64_t first_row) {
  const CompareStats stats = compare_with_reference(candidate, plan, batch, ref, progress, ranks, first_row);
  if (!loaded.rounded_activations || reference_rounded) return {stats, std::nullopt};
  const std::unique_ptr<LlamaModel> f32 = load_f32();
  return {stats, compare_with_reference(*f32, plan, batch, ref, f32_progress, ranks, first_row)};
}

EvalReport compare_report(const CompareStats& s, const CompareStats* w, const ModelIdentity& candidate,
                          const std::string& ref_label, const std::string& activations, const ScoringPlan& plan,
                          const ScoringRequest& request) {
  EvalReport out;
  std::string& t = out.text;
  t = fmt::format("candidate: {}\nreference: {}\n{} scored tokens ({})\n", candidate.label, ref_label, s.positions,
                  describe_plan(request, plan));
  t += fmt::format("PPL(candidate) = {:.4f} +/- {:.4f}\nPPL(reference) = {:.4f} +/- {:.4f}\nPPL ratio      = {:.5f}\n",
                   s.cand.ppl, s.cand.ppl_stderr, s.ref.ppl, s.ref.ppl_stderr, s.ppl_ratio);
  t += fmt::format("Mean KLD       = {:.6f} +/- {:.6f}\nMedian KLD     = {:.6f}\n90% KLD        = {:.6f}\n"
                   "99% KLD        = {:.6f}\nMaximum KLD    = {:.6f}\n",
                   s.mean_kl, s.kl_stderr, s.median_kl, s.p90_kl, s.p99_kl, s.max_kl);
  t += fmt::format("Same top token = {:.3f} ± {:.3f} %\nRMS delta p    = {:.3f} %\n", 100 * s.same_top,
                   100 * s.same_top_stderr, 100 * s.rms_dp);
  if (w != nullptr)
    t += fmt::format("With f32 activations (the weights alone): mean KLD = {:.6f} +/- {:.6f}, same top token = {:.3f} ± "
                     "{:.3f} %; rounding the activations ({}) adds {:.6f} ({:.1f} % of the KLD)\n",
                     w->mean_kl, w->kl_stderr, 100 * w->same_top, 100 * w->same_top_stderr,
                     activations.empty() ? std::string("int8, int16 or bf16") : printable_text(activations), s.mean_kl - w->mean_kl,
                     s.mean_kl > 0 ? 100 * (s.mean_kl - w->mean_kl) / s.mean_kl : 0.0);
  out.json = {{"low_bit", candidate.low_bit},
              {"model", candidate.label},
              {"ref_model", ref_label},
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
              {"same_top_stderr", s.same_top_stderr},
              {"rms_dp", s.rms_dp},
              {"activations", activations},
              {"weights_only_mean_kl", or_null(w, &CompareStats::mean_kl)},
              {"weights_only_kl_stderr", or_null(w, &CompareStats::kl_stderr)},
              {"weights_only_same_top", or_null(w, &CompareStats::same_top)}};
  return out;
}

std::vector<Task> load_task_list(const std::string& specs_in, const std::string& data_dir,
                                 const std::function<void(const std::string&)>& log) {
  std::vector<Task> out;
  std::string specs = specs_in;
  for (std::size_t at; (at = (',' + specs + ',').find(",openllm,")) != std::string::npos;)
    specs.replace(at, 7, kOpenLlm);
  std::size_t begin = 0;
  while (begin <= specs.size()) {
    std::size_t end = specs.find(',', begin);
    if (end == std::string::npos) end = specs.size();
    const std::string spec = specs.substr(begin, end - begin);
    begin = end + 1;
    if (spec.empty()) continue;
    const std::size_t eq = spec.find('=');
    const std::string name = spec.substr(0, eq);
    std::string path;
    if (eq != std::string::npos) {
      path = spec.substr(eq + 1);
      if (path.empty()) fail("--tasks {}: the path after '=' is empty", spec);
    } else {
      const std::string file = task_data_path(name);
      if (file.empty() && name != "jsonl") fail("--tasks: unknown task '{}' (available: {}, openllm)", name, task_names());
      if (file.empty()) fail("--tasks {}: give its file as {}=PATH", name, name);
      const std::filesystem::path dir = data_dir.empty() ? std::filesystem::path(bundled_task_data_dir()) : std::filesystem::path(data_dir);
      if (data_dir.empty() && !std::filesystem::exists(dir / file))
        fail("--tasks {}: the bundled task files are not at {} (the build's task_data target extracts them from "
             "assets/tasks); give its {} as {}=PATH or the folder holding it with --data-dir",
             name, dir.string(), name == "mmlu" || name == "gsm8k" ? "folder" : "file", name);
      path = (dir / file).string();
    }
    out.push_back(load_task(name, path));
    if (log) log(fmt::format("task {}: {} ({} items)", name, path, out.back().items.size()));
  }
  if (out.empty()) fail("--tasks is empty");
  return out;
}

nlohmann::ordered_json task_json(const TaskResult& r) {
  nlohmann::ordered_json j = {{"task", r.name}, {"items", r.items}, {"shots", r.shots}, {"primary_metric", r.primary_metric}};
  for (const TaskMetric& m : r.metrics) {
    j[m.name] = m.value;
    j[m.name + "_stderr"] = m.standard_error;
  }
  return j;
}

std::string task_samples_jsonl(const std::vector<TaskResult>& results) {
  std::string out;
  for (const TaskResult& r : results)
    for (const TaskSample& s : r.samples) {
      nlohmann::ordered_json line = {{"task", r.name}, {"doc_id", s.doc_id}};
      if (!s.subject.empty()) line["subject"] = s.subject;
      line["arguments"] = nlohmann::ordered_json::array();
      for (const auto& [context, continuation] : s.arguments) line["arguments"].push_back({context, continuation});
      line["loglikelihoods"] = s.loglikelihoods;
      if (s.labels.empty()) line["target"] = s.gold;
      else line["labels"] = s.labels;
      for (std::size_t m = 0; m < r.metrics.size() && m < s.scores.size(); ++m) line[r.metrics[m].name] = s.scores[m];
      out += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    }
  return out;
}

EvalReport tasks_report(const std::vector<TaskResult>& results, const std::string& label) {
  EvalReport out;
  out.json = nlohmann::ordered_json::array();
  out.text = fmt::format("model: {}\n\n| task | items | shots | metric | value | stderr |\n|---|---:|---:|---|---:|---:|\n",
                         label);
  for (const TaskResult& r : results) {
    for (const TaskMetric& m : r.metrics)
      out.text += fmt::format("| {} | {} | {} | {}{} | {:.4f} | {:.4f} |\n", r.name, r.items, r.shots, m.name,
                              m.name == r.primary_metric ? " *" : "", m.value, m.standard_error);
    out.json.push_back(task_json(r));
    out.json.back()["model"] = label;
  }
  out.text += "(* the metric model cards report for the task)\n";
  return out;
}

EvalReport explain_report(const Explanation& e, const Tokenizer& tok, const std::string& prompt,
                          const ModelIdentity& original, const ModelIdentity& quantized, std::int64_t top) {
  EvalReport out;
  std::string& t = out.text;
  t = fmt::format("original:  {}\nquantized: {}\n\n", original.label, quantized.label);
  t += fmt::format("prompt:    {}\n", quoted(prompt));
  t += fmt::format("original:  {}\n", quoted(e.original_text));
  t += fmt::format("quantized: {}\n\n", quoted(e.quantized_text));
  if (e.diverges_at < 0) {
    t += fmt::format("The two generations are identical for all {} tokens.\n", e.original_ids.size());
  } else if (e.original_top.empty()) {
    t += fmt::format("The generations agree on every token the original produced; the original stopped after {} "
                     "tokens and the quantized model went on.\n", e.original_ids.size());
  } else {
    const TokenProb& o1 = e.original_top[0];
    const TokenProb& o2 = e.original_top[1];
    const auto at = static_cast<std::size_t>(e.diverges_at);
    t += fmt::format("They first differ at generated token {} (after {} identical tokens): the original chose {}, the "
                     "quantized model {}.\n",
                     e.diverges_at + 1, e.diverges_at, quoted(tok.token_text(e.original_ids[at])),
                     quoted(tok.token_text(e.quantized_ids[at])));
    t += fmt::format("  original's top-2 there:  {} {:.3f}, {} {:.3f} (margin {:.3f})\n", quoted(o1.text), o1.p,
                     quoted(o2.text), o2.p, o1.p - o2.p);
    t += fmt::format("  quantized's top-2 there: {} {:.3f}, {} {:.3f}\n", quoted(e.quantized_top[0].text),
                     e.quantized_top[0].p, quoted(e.quantized_top[1].text), e.quantized_top[1].p);
    if (e.near_tie())
      t += fmt::format("  -> A near tie (margin < {}): the original was almost undecided, so the small change "
                       "quantization makes to the logits flips the choice. Expected and harmless; after it the two "
                       "texts simply follow different, equally plausible continuations.\n", e.near_tie_margin);
    else
      t += "  -> Not a near tie: quantization moved a confident prediction. Check the mean KL and the layers below; a "
           "finer --group-size, sym_int8, or GPTQ reduces this.\n";
  }
  if (!e.kl.empty()) {
    const auto max_it = std::max_element(e.kl.begin(), e.kl.end());
    const double mean = std::accumulate(e.kl.begin(), e.kl.end(), 0.0) / static_cast<double>(e.kl.size());
    t += fmt::format("\nKL(original || quantized) per generated token (teacher-forced on the original's text): mean "
                     "{:.4f}, max {:.4f} at token {}\n  ", mean, *max_it, max_it - e.kl.begin() + 1);
    for (std::size_t i = 0; i < e.kl.size(); ++i) t += fmt::format("{:.3f}{}", e.kl[i], i + 1 == e.kl.size() ? "\n" : " ");
  }
  t += "\nQuantization error per linear layer, largest output error first (on this text's activations):\n";
  const bool split = std::any_of(e.layers.begin(), e.layers.end(), [](const LinearError& l) { return l.weights_only_error >= 0; });
  t += fmt::format("  {:>5}  {:<17} {:>13} {:>13}{}\n", "layer", "linear", "output error", "weight error",
                   split ? "  output error with f32 activations (the weights' part)" : "");
  for (std::size_t i = 0; i < e.layers.size() && static_cast<std::int64_t>(i) < top; ++i) {
    const LinearError& l = e.layers[i];
    t += fmt::format("  {:>5}  {:<17} {:>12.2f}% {:>12.2f}%{}\n", l.layer, l.name, 100 * l.output_error,
                     100 * l.weight_error,
                     l.weights_only_error >= 0 ? fmt::format("  {:>12.2f}%", 100 * l.weights_only_error) : std::string());
  }
  nlohmann::ordered_json& j = out.json;
  j = {{"prompt", prompt},
       {"low_bit", quantized.low_bit},
       {"ref_low_bit", original.low_bit},
       {"model", quantized.label},
       {"ref_model", original.label},
       {"original_text", e.original_text},
       {"quantized_text", e.quantized_text},
       {"diverges_at", e.diverges_at},
       {"near_tie", e.near_tie()},
       {"kl", e.kl}};
  for (const auto& p : e.original_top) j["original_top"].push_back({{"token", p.text}, {"p", p.p}});
  for (const auto& p : e.quantized_top) j["quantized_top"].push_back({{"token", p.text}, {"p", p.p}});
  for (const auto& l : e.layers)
    j["layers"].push_back({{"layer", l.layer},
                           {"linear", l.name},
                           {"output_error", l.output_error},
                           {"weight_error", l.weight_error},
                           {"weights_only_output_error",
                            l.weights_only_error >= 0 ? nlohmann::ordered_json(l.weights_only_error) : nullptr}});
  return out;
}

}  // namespace woq
