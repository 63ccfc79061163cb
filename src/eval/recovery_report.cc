#include "eval/recovery_report.h"

#include <cmath>
#include <filesystem>

#include <fmt/format.h>

#include "eval/perplexity.h"
#include "eval/recovery.h"

namespace woq {

namespace {

// A value and its standard error, e.g. "0.4500 ± 0.0500".
std::string with_error(double value, double stderr_value, int digits) {
  if (std::isnan(value)) return "n/a";
  if (std::isnan(stderr_value)) return fmt::format("{:.{}f} ± n/a", value, digits);
  return fmt::format("{:.{}f} ± {:.{}f}", value, digits, stderr_value, digits);
}

nlohmann::ordered_json recovery_json(const Recovery& r) {
  return {{"recovery_percent", r.percent}, {"recovery_stderr", r.standard_error}};
}

}  // namespace

std::vector<TaskResult> score_recovery_column(LlamaModel& model, const Tokenizer& tokenizer,
                                              const std::vector<Task>& tasks, const TaskOptions& options,
                                              const std::vector<Progress>& progress, const ScoringPlan* ppl,
                                              RecoveryColumn& col) {
  std::vector<TaskResult> results = run_tasks(model, tokenizer, tasks, options, progress);
  for (const TaskResult& r : results) col.metrics.push_back(r.metric(r.primary_metric));
  if (ppl != nullptr) {  // data-parallel as the tasks are: each rank its share of the chunks, gathered in order
    Ranks& ranks = options.ranks != nullptr ? *options.ranks : one_process();
    const std::int64_t vocab = model.config().vocab_size;
    std::vector<double> nll;
    run_plan(model, plan_share(*ppl, ranks).plan, 0, [&](std::int64_t, std::int64_t, std::int32_t t, const float* l) {
      nll.push_back(token_nll(l, vocab, t));
    });
    if (ranks.size() > 1) nll = gather_doubles(ranks, nll);
    col.nll.insert(col.nll.end(), nll.begin(), nll.end());
  }
  return results;
}

EvalReport recovery_report(std::vector<RecoveryColumn> columns, const std::vector<TaskResult>& tasks,
                           std::int64_t bootstrap, std::uint64_t seed, const std::optional<RecoveryPerplexity>& ppl) {
  const std::vector<TaskResult>& shapes = tasks;
  for (std::size_t c = 1; c < columns.size(); ++c)  // names that collide get the column's number
    for (std::size_t d = 0; d < c; ++d)
      if (columns[c].name == columns[d].name) {
        columns[c].name = fmt::format("{} [{}]", columns[c].name, c);
        break;
      }
  const std::size_t nv = columns.size() - 1;
  std::string md;
  for (const RecoveryColumn& col : columns) md += fmt::format("- {}: {}\n", col.name, col.label);
  md += "\n| metric | " + columns[0].name;
  for (std::size_t c = 1; c <= nv; ++c) md += " | " + columns[c].name;
  for (std::size_t c = 1; c <= nv; ++c) md += " | " + columns[c].name + " recovery";
  md += " |\n|---|";
  for (std::size_t i = 0; i < columns.size() + nv; ++i) md += "---:|";
  md += "\n";
  nlohmann::ordered_json j;
  auto column_json = [](const RecoveryColumn& col) {
    return nlohmann::ordered_json{{"name", col.name}, {"label", col.label}, {"model", col.path}};
  };
  j["baseline"] = column_json(columns[0]);
  for (std::size_t c = 1; c <= nv; ++c) j["variants"].push_back(column_json(columns[c]));
  j["tasks"] = nlohmann::ordered_json::array();
  std::vector<std::vector<Recovery>> per_variant(nv);
  for (std::size_t t = 0; t < shapes.size(); ++t) {
    const TaskResult& r = shapes[t];
    md += fmt::format("| {} {} ({}-shot, {} items)", r.name, r.primary_metric, r.shots, r.items);
    for (const RecoveryColumn& col : columns)
      md += " | " + with_error(col.metrics[t].value, col.metrics[t].standard_error, 4);
    nlohmann::ordered_json row = {{"task", r.name}, {"metric", r.primary_metric}, {"shots", r.shots}, {"items", r.items},
                                  {"baseline", {{"value", columns[0].metrics[t].value},
                                                {"stderr", columns[0].metrics[t].standard_error}}}};
    for (std::size_t c = 1; c <= nv; ++c) {
      const TaskMetric& m = columns[c].metrics[t];
      const Recovery rec = task_recovery(columns[0].metrics[t].per_item, m.per_item, bootstrap, seed + t);
      per_variant[c - 1].push_back(rec);
      md += std::isnan(rec.percent) ? " | n/a (baseline 0)" : fmt::format(" | {} %", with_error(rec.percent, rec.standard_error, 1));
      nlohmann::ordered_json v = {{"value", m.value}, {"stderr", m.standard_error}};
      v.update(recovery_json(rec));
      row["variants"].push_back(v);
    }
    md += " |\n";
    j["tasks"].push_back(row);
  }
  md += fmt::format("| average recovery over the {} task{}", shapes.size(), shapes.size() == 1 ? "" : "s");
  for (std::size_t i = 0; i < columns.size(); ++i) md += " |";
  bool undefined = false;
  for (const auto& recs : per_variant) {
    const Recovery avg = mean_recovery(recs);
    for (const Recovery& r : recs) undefined |= std::isnan(r.percent);
    md += std::isnan(avg.percent) ? " | n/a" : fmt::format(" | {} %", with_error(avg.percent, avg.standard_error, 1));
    j["average_recovery"].push_back(recovery_json(avg));
  }
  md += " |\n";
  if (undefined) md += "\n(n/a: the baseline scores 0 on that task, so recovery is undefined there; the average leaves it out)\n";
  j["perplexity"] = nullptr;
  if (ppl) {
    md += fmt::format("\nPerplexity of {} (ctx {}, {} tokens; lower is better, not in the average):\n\n| model | perplexity | "
                      "recovery (baseline / variant) |\n|---|---:|---:|\n",
                      std::filesystem::path(ppl->file).filename().string(), ppl->ctx, columns[0].nll.size());
    nlohmann::ordered_json pj = {{"file", ppl->file}, {"ctx", ppl->ctx}, {"tokens", columns[0].nll.size()}};
    for (std::size_t c = 0; c <= nv; ++c) {
      const Perplexity p = perplexity(columns[c].nll);
      nlohmann::ordered_json v = {{"ppl", p.ppl}, {"ppl_stderr", p.ppl_stderr}};
      std::string rec_cell = "";
      if (c > 0) {
        const Recovery rec = perplexity_recovery(columns[0].nll, columns[c].nll);
        rec_cell = fmt::format("{} %", with_error(rec.percent, rec.standard_error, 1));
        v.update(recovery_json(rec));
        pj["variants"].push_back(v);
      } else {
        pj["baseline"] = v;
      }
      md += fmt::format("| {} | {} | {} |\n", columns[c].name, with_error(p.ppl, p.ppl_stderr, 4), rec_cell);
    }
    j["perplexity"] = pj;
  }
  md += "\n(± one standard error: bootstrap over items for tasks, paired with the baseline for recovery; per token for "
        "perplexity)\n";
  return {md, j};
}

}  // namespace woq
