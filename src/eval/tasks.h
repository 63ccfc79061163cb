// lm-evaluation-harness-style tasks: multiple choice scored by log-likelihood,
// Winogrande's partial scoring, and GSM8K's greedy generation.
//
// Semantics (lm-eval 0.4): the prompt is the task's description (MMLU only),
// then K few-shot examples each followed by fewshot_delimiter ("\n\n"), then
// the item. An example is "context + target_delimiter + gold target".
//   multiple choice: each choice is scored as the continuation
//     target_delimiter + choice by the sum of its tokens' log-probabilities
//     given the prompt. acc picks the highest sum; acc_norm the highest sum
//     divided by the continuation's length in bytes; mc2 (TruthfulQA) is the
//     probability mass of the true choices, exp(ll) normalized over all choices.
//   multiple input (Winogrande "partial scoring"): each choice is a context,
//     scored by the log-likelihood of the shared continuation after it; acc.
//   generate (GSM8K): greedy generation until a stop string ("\n\n",
//     "Question:") or EOS, at most max_gen_tokens; the answer is the first
//     match of the strict-match regex "#### (-?[0-9.,]+)", compared after
//     removing ",", "$", everything up to "#### " and a trailing "."; exact_match.
// Tokenization follows lm-eval's _encode_pair: context tokens = encode(prompt),
// continuation tokens = encode(prompt + continuation) past that length (with
// the tokenizer's BOS, i.e. lm-eval's add_bos_token=True). Prompts longer than
// the model's context are cut on the left, as lm-eval does.
//
// Prompt templates (lm-eval's task configs), item -> continuation:
//   arc_easy, arc_challenge, piqa: "Question: {question}\nAnswer:" -> " {choice}"
//   hellaswag: "{activity_label}: {ctx}" -> " {ending}" (llama.cpp's preprocessed text format)
//   mmlu: "The following are multiple choice questions (with answers) about {subject}.\n\n" once, then
//         "{question}\nA. {c0}\nB. {c1}\nC. {c2}\nD. {c3}\nAnswer:" -> " A" / " B" / " C" / " D";
//         few-shot: the first K of the subject's dev split
//   truthfulqa_mc1, truthfulqa_mc2: lm-eval's fixed six-question "Q: ...\nA: ..." preamble, then
//         "\n\nQ: {question}\nA:" -> " {answer}" (0-shot; the preamble is part of the template)
//   winogrande: "{sentence up to the blank, option filled in}" -> " {rest of the sentence}"
//   gsm8k: "Question: {question}\nAnswer:" -> " {answer}"; few-shot drawn from train
//   jsonl (generic): {"context": ..., "choices": [...], "gold": i} -> " {choice}"
// Few-shot examples are drawn with woq's own seeded sampler (lm-eval's Python
// RNG is not reproduced), so scores agree with lm-eval's in distribution, not
// necessarily item by item.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/ranks.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// How a task's items are scored (see the file comment).
enum class TaskType { kMultipleChoice, kMultipleInput, kGenerate };

/// One item of a task.
struct TaskItem {
  std::string context;               ///< the item's text (multiple choice, generate)
  std::vector<std::string> choices;  ///< continuations; for multiple input, the contexts
  int gold = 0;                      ///< index of the correct choice
  std::string target;                ///< multiple input: the shared continuation; generate: the reference answer
  std::vector<int> labels;           ///< truthfulqa_mc2: 1 marks a true choice
  int subject = -1;                  ///< MMLU: index into Task::subjects
};

/// A loaded task.
struct Task {
  std::string name;
  TaskType type = TaskType::kMultipleChoice;
  std::vector<TaskItem> items;
  /// Few-shot examples from their own split (MMLU dev, GSM8K train).
  std::vector<TaskItem> fewshot;
  /// The name of that split; empty: examples are the task's other items
  /// (never the item itself).
  std::string fewshot_split;
  bool fewshot_first_n = false;       ///< take the first K examples (MMLU) rather than a seeded sample
  std::vector<std::string> subjects;  ///< MMLU subjects ("college chemistry"), named in the description
  int default_shots = 0;              ///< the Open LLM Leaderboard v1 count where the task is in it
  std::string target_delimiter = " ";
  std::string fewshot_delimiter = "\n\n";
  std::vector<std::string> until;        ///< generate: stop strings
  std::int64_t max_gen_tokens = 256;     ///< generate: at most this many new tokens
  /// What run_task reports: acc, acc_norm (multiple choice), mc2 (instead, for
  /// truthfulqa_mc2) or exact_match (generate), as lm-eval does for the task.
  std::vector<std::string> metrics = {"acc", "acc_norm"};
  std::string primary_metric = "acc";    ///< the one model cards report
};

/// Loads task `name` from `path`:
///   arc_easy, arc_challenge, piqa, winogrande, jsonl: a JSONL file;
///   hellaswag: llama.cpp's 6-lines-per-item text file;
///   truthfulqa_mc1, truthfulqa_mc2: TruthfulQA's mc_task.json (key order = choice order);
///   mmlu: a folder with test/{subject}_test.csv and dev/{subject}_dev.csv
///         (header question,choice0,choice1,choice2,choice3,answer; answer 0-3 or A-D);
///   gsm8k: a folder with test.jsonl and train.jsonl ({"question", "answer"} lines).
/// Throws woq::Error naming the file and line (or item) for malformed input,
/// an unknown task, a gold index outside the choices, or no items.
Task load_task(const std::string& name, const std::string& path);

/// The names load_task accepts, comma-separated (for messages).
std::string_view task_names();

/// Where task `name`'s file (or folder, for mmlu and gsm8k) sits inside a task
/// data folder laid out as assets/tasks/lm-eval-tasks.tar.xz is (and as
/// `--data-dir` expects): "arc_easy" -> "arc_easy/arc_easy_test.jsonl". Empty
/// for a name with no standard file (jsonl) or one load_task does not know.
std::string task_data_path(std::string_view name);

/// The folder the build extracted the bundled task files to (the task_data
/// target: build/share/woq/tasks), in task_data_path's layout.
std::string bundled_task_data_dir();

/// How to run a task.
struct TaskOptions {
  int shots = -1;            ///< few-shot examples; -1 = the task's default
  std::int64_t limit = 0;    ///< first N items (of each MMLU subject, as lm-eval does); 0 = all
  std::uint64_t seed = 1234; ///< few-shot sampling and bootstrap
  std::int64_t bootstrap = 1000;  ///< resamples for the standard errors
  bool keep_samples = false;      ///< fill TaskResult::samples
  /// Data-parallel over these ranks (run_task is then collective): each scores a contiguous share of the items,
  /// and every rank returns one process's result bit for bit. nullptr: this process alone.
  Ranks* ranks = nullptr;
};

/// One metric: the mean over items and its bootstrap standard error.
struct TaskMetric {
  std::string name;  ///< acc, acc_norm, mc2 or exact_match
  double value = 0;
  double standard_error = 0;
  std::vector<double> per_item;  ///< each item's score, in item order (for paired comparisons: eval/recovery.h)
};

/// One scored item of a log-likelihood task, as lm-eval's --log_samples
/// writes it: the (context, continuation) requests and their log-likelihoods.
struct TaskSample {
  std::int64_t doc_id = 0;  ///< index of the item in the task's file (MMLU: across its subjects, in file order)
  std::string subject;      ///< MMLU: the item's subject; empty otherwise
  std::vector<std::pair<std::string, std::string>> arguments;  ///< one (context, continuation) per choice
  std::vector<double> loglikelihoods;                          ///< natural log, one per argument
  int gold = 0;               ///< the correct choice (multiple choice and input)
  std::vector<int> labels;    ///< truthfulqa_mc2: 1 marks each true choice (gold is unused)
  std::vector<double> scores;  ///< the item's value of each TaskResult::metrics entry, in that order
};

/// A task's scores.
struct TaskResult {
  std::string name;
  std::int64_t items = 0;
  int shots = 0;
  std::vector<TaskMetric> metrics;
  std::string primary_metric;
  /// Log-likelihood tasks with TaskOptions::keep_samples: every item's requests and results (empty otherwise).
  std::vector<TaskSample> samples;

  /// The metric called `metric`; throws woq::Error when the task has none.
  const TaskMetric& metric(std::string_view metric) const;
};

/// The description and few-shot examples that precede item `index`, each
/// example followed by the fewshot delimiter. Examples are seeded by seed and
/// index. Throws woq::Error when `shots` exceeds the examples available.
std::string fewshot_prefix(const Task& task, std::int64_t index, int shots, std::uint64_t seed);

/// Throws woq::Error, before any scoring, when an item of the first
/// `options.limit` would get fewer few-shot examples than asked for.
void check_fewshot(const Task& task, const TaskOptions& options);

/// The whole prompt of item `index` (multiple choice, generate): the prefix
/// and the item's context.
std::string build_prompt(const Task& task, std::int64_t index, int shots, std::uint64_t seed);

/// Sum of the log-probabilities (nats) of `continuation`'s tokens after
/// `context` (lm-eval's loglikelihood request). Throws woq::Error when the
/// continuation adds no tokens or alone fills the context.
double loglikelihood(LlamaModel& model, const Tokenizer& tokenizer, const std::string& context,
                     const std::string& continuation);

/// Log-likelihood of each choice of item `index` after `prefix` (from
/// fewshot_prefix). With one shared context (multiple choice) the context
/// runs once and each choice continues its KV cache; the numbers are the
/// same, bit for bit, as loglikelihood() on each choice.
std::vector<double> choice_loglikelihoods(LlamaModel& model, const Tokenizer& tokenizer, const Task& task,
                                          std::int64_t index, const std::string& prefix);

/// Runs the task; `progress(done, total)` after each item. Throws woq::Error
/// when shots exceed the examples available.
TaskResult run_task(LlamaModel& model, const Tokenizer& tokenizer, const Task& task, const TaskOptions& options,
                    const std::function<void(std::int64_t, std::int64_t)>& progress = nullptr);

/// run_task on each of `tasks` in turn, `progress[i]` for task i (absent or empty: none).
std::vector<TaskResult> run_tasks(LlamaModel& model, const Tokenizer& tokenizer, const std::vector<Task>& tasks,
                                  const TaskOptions& options, const std::vector<Progress>& progress = {});

/// acc and acc_norm of one item (each 0 or 1) from its choices' log-likelihoods.
std::pair<int, int> score_item(const TaskItem& item, const std::vector<double>& loglikelihoods,
                               const std::string& target_delimiter);

/// TruthfulQA mc2: sum of exp(ll) over the true choices / sum over all choices.
double mc2_score(const std::vector<int>& labels, const std::vector<double>& loglikelihoods);

/// GSM8K strict-match: the first number after "#### " in `completion`, or
/// "[invalid]" when there is none (lm-eval's fallback).
std::string gsm8k_extract(std::string_view completion);

/// lm-eval's gsm8k exact_match normalization: lower case, without ",", "$",
/// anything up to the last "#### ", and a trailing ".".
std::string gsm8k_normalize(std::string_view answer);

}  // namespace woq
