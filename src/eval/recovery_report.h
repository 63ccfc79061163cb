// eval recovery's report: each variant's task scores as a share of the baseline's, with paired bootstrap
// errors, and optionally the perplexity of a text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "eval/reports.h"
#include "eval/tasks.h"

namespace woq {

/// One column of the recovery table: a model (the baseline first) as loaded and what it scored.
struct RecoveryColumn {
  std::string path;                 ///< its directory or file
  std::string name;                 ///< short name (table header); names that collide get the column's number
  std::string label;                ///< what it really is (model_label)
  std::vector<TaskMetric> metrics;  ///< the primary metric of each task (per item), in the tasks' order
  std::vector<double> nll;          ///< per-token NLL of the perplexity text, when there is one
};

/// The text whose perplexity the columns' `nll` hold.
struct RecoveryPerplexity {
  std::string file;
  std::int64_t ctx = 0;  ///< tokens per chunk
};

/// Scores `model` for recovery column `col`: appends each task's primary metric per item (run_task with
/// `options`, `progress[i]` for task i, which may be empty) and, with `ppl`, the per-token NLL of that plan's
/// scored tokens. Returns the task results (the baseline's give recovery_report the tasks' names, metrics, shots
/// and items). Throws woq::Error as run_task does.
std::vector<TaskResult> score_recovery_column(LlamaModel& model, const Tokenizer& tokenizer,
                                              const std::vector<Task>& tasks, const TaskOptions& options,
                                              const std::vector<Progress>& progress, const ScoringPlan* ppl,
                                              RecoveryColumn& col);

/// The markdown table and JSON of `woq eval recovery` (and Python's woq.eval.recovery): per task the baseline's
/// and each variant's primary metric ± its standard error, and recovery = variant / baseline in percent with a
/// paired bootstrap error (task_recovery: `bootstrap` resamples, seed `seed` + the task's index); the average
/// recovery over the tasks (mean_recovery; a task whose baseline scores 0 is left out and marked n/a); and, with
/// `ppl`, each column's perplexity and its recovery baseline / variant (perplexity_recovery). `tasks` gives the
/// tasks' names, metrics, shots and items (the baseline's results); columns[0] is the baseline.
/// Throws woq::Error as task_recovery does (columns whose per-item scores do not pair up).
EvalReport recovery_report(std::vector<RecoveryColumn> columns, const std::vector<TaskResult>& tasks,
                           std::int64_t bootstrap, std::uint64_t seed, const std::optional<RecoveryPerplexity>& ppl);

}  // namespace woq
