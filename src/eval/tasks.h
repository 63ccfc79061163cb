// lm-evaluation-harness-style multiple-choice tasks scored by log-likelihood.
//
// Semantics (lm-eval 0.4 "multiple_choice"): the prompt is K few-shot
// examples, each "context + target_delimiter + gold choice", joined with
// fewshot_delimiter ("\n\n") and followed by the item's context; each choice
// is scored as the continuation target_delimiter + choice, by the sum of its
// tokens' log-probabilities given the prompt. acc picks the highest sum;
// acc_norm the highest sum divided by the continuation's length in bytes.
// Tokenization follows lm-eval's _encode_pair: context tokens = encode(prompt),
// continuation tokens = encode(prompt + continuation) past that length (with
// the tokenizer's BOS, i.e. lm-eval's add_bos_token=True).
//
// Prompt templates (lm-eval's task configs):
//   arc_easy, arc_challenge, piqa: "Question: {question}\nAnswer:" -> " {choice}"
//   hellaswag: "{activity_label}: {ctx}" -> " {ending}" (llama.cpp's preprocessed text format)
//   jsonl (generic): {"context": ..., "choices": [...], "gold": i} -> " {choice}"
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// One multiple-choice question.
struct McItem {
  std::string context;
  std::vector<std::string> choices;
  int gold = 0;
};

/// A loaded task. Few-shot examples come from the same file, never the item
/// itself (the bundled files are single splits).
struct McTask {
  std::string name;
  std::vector<McItem> items;
  int default_shots = 0;  ///< the Open LLM Leaderboard v1 count where the task is in it
  std::string target_delimiter = " ";
  std::string fewshot_delimiter = "\n\n";
};

/// Loads task `name` (arc_easy, arc_challenge, piqa, hellaswag, jsonl) from
/// `path` in the formats of ../shared/data/tasks (see README). Throws
/// woq::Error naming the file and line for malformed input, an unknown
/// task, a gold index outside the choices, or an empty file.
McTask load_task(const std::string& name, const std::string& path);

/// How to run a task.
struct TaskOptions {
  int shots = -1;            ///< few-shot examples; -1 = the task's default
  std::int64_t limit = 0;    ///< first N items; 0 = all
  std::uint64_t seed = 1234; ///< few-shot sampling and bootstrap
  std::int64_t bootstrap = 1000;  ///< resamples for the standard errors
};

/// Accuracy with bootstrap standard errors.
struct TaskResult {
  std::string name;
  std::int64_t items = 0;
  int shots = 0;
  double acc = 0, acc_stderr = 0;
  double acc_norm = 0, acc_norm_stderr = 0;
};

/// The prompt of item `index` with `shots` examples drawn (seeded by
/// seed and index) from the other items.
std::string build_prompt(const McTask& task, std::int64_t index, int shots, std::uint64_t seed);

/// Log-likelihood of each choice of item `index` (prompt from build_prompt).
std::vector<double> choice_loglikelihoods(LlamaModel& model, const Tokenizer& tokenizer, const McTask& task,
                                          std::int64_t index, const std::string& prompt);

/// Runs the task; `progress(done, total)` after each item. Throws woq::Error
/// when shots exceed the other items available.
TaskResult run_task(LlamaModel& model, const Tokenizer& tokenizer, const McTask& task, const TaskOptions& options,
                    const std::function<void(std::int64_t, std::int64_t)>& progress = nullptr);

/// acc and acc_norm of per-item log-likelihoods (for tests and reuse):
/// returns {acc, acc_norm} of one item as 0/1.
std::pair<int, int> score_item(const McItem& item, const std::vector<double>& loglikelihoods,
                               const std::string& target_delimiter);

}  // namespace woq
