// What `woq eval perplexity | compare | tasks` and `woq explain` report, built
// in one place for the CLI (which prints the text and writes the JSON with
// --json) and the Python API (which returns the JSON as a dict): the runs over
// loaded models, their text tables and their JSON objects.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/progress.h"
#include "core/ranks.h"
#include "eval/compare.h"
#include "eval/explain.h"
#include "eval/perplexity.h"
#include "eval/tasks.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// A report as the CLI prints it (`text`, lines ending in '\n') and as its
/// --json file holds it (`json`).
struct EvalReport {
  std::string text;
  nlohmann::ordered_json json;
};

/// How a text is scored (eval perplexity and eval compare).
struct ScoringRequest {
  std::int64_t ctx = 512;      ///< tokens per chunk; documents are cut to it
  std::int64_t batch = 0;      ///< tokens per forward call; <= 0: the whole chunk
  std::int64_t chunks = 0;     ///< at most this many chunks or documents; 0: all
  bool bos_per_chunk = true;   ///< llama-perplexity's BOS as each chunk's first token (when the tokenizer adds BOS)
  std::string per_document;    ///< non-empty: score each document from position 0, split on this separator
};

/// The plan of `text` under `request` (chunk_plan or document_plan). `source`
/// names the text in errors (a file name). Throws woq::Error when ctx exceeds
/// `context_limit` or the text is too short (see chunk_plan, document_plan).
ScoringPlan scoring_plan(const Tokenizer& tokenizer, const std::string& text, const std::string& source,
                         const ScoringRequest& request, std::int64_t context_limit);

/// Who is being measured: the label of the loaded model (model_label) and
/// its woq format(s) (LoadReport::low_bit).
struct ModelIdentity {
  std::string label;
  std::string low_bit;
};

/// eval perplexity: runs `plan` through `model`. Text "model: ...\nPPL = ...";
/// JSON ppl, ppl_stderr, mean_nll, tokens, sequences, mode, ctx, low_bit, model,
/// tokens_per_second, ranks. Data-parallel over `ranks` (collective): each rank runs its contiguous share of
/// the sequences (core/ranks.h share()) and the per-token log-likelihoods are gathered in sequence order, so
/// every rank returns one process's report bit for bit but for the speed (total tokens over the slowest
/// rank's time); `progress` counts this rank's sequences. `also`, when given, receives every scored
/// position's logits in plan order (one process only: throws woq::Error on more ranks).
EvalReport perplexity_report(LlamaModel& model, const ModelIdentity& who, const ScoringPlan& plan,
                             const ScoringRequest& request, const Progress& progress = nullptr,
                             Ranks& ranks = one_process(), const ScoredLogits& also = nullptr);

/// eval compare's (also eval recovery's and explain's) check that the
/// reference reads the text as the candidate does (the plan is the
/// candidate's tokenization, and KL compares id by id):
/// the same vocabulary size and every id's piece (Tokenizer::token_text) equal.
/// Throws woq::Error naming both models (`candidate_name`, `reference_name`)
/// and the first differing id with both pieces.
void require_same_vocabulary(const Tokenizer& candidate, const std::string& candidate_name, const Tokenizer& reference,
                             const std::string& reference_name);

/// eval compare, step 1: the reference's log-probabilities over `plan` into
/// `ref` (then finish()ed).
void write_reference(LlamaModel& reference, const ScoringPlan& plan, std::int64_t batch, RefLogprobFile& ref,
                     const Progress& progress = nullptr);

/// eval compare, step 2: `candidate` against the reference rows of `ref`
/// from row `first_row` on (rewound first when 0). Data-parallel over `ranks`
/// (collective): each rank passes its plan_share() of the sequences, and each
/// then returns what one process computes over them all, bit for bit. Throws
/// woq::Error when `ref` does not hold the plan's rows (the rank reading the
/// file's last row checks that nothing follows it).
CompareStats compare_with_reference(LlamaModel& candidate, const ScoringPlan& plan, std::int64_t batch,
                                    RefLogprobFile& ref, const Progress& progress = nullptr,
                                    Ranks& ranks = one_process(), std::int64_t first_row = 0);

/// eval compare, step 2 and the weights' share: `candidate` (loaded as `loaded` says) against the reference rows
/// of `ref` (data-parallel as compare_with_reference is); then, when the candidate rounds its activations (int8, int16 or bf16) and the reference did not
/// (`reference_rounded`), the same weights with f32 activations, loaded by `load_f32` (which may free the candidate
/// first: `candidate` is not used after it is called). Returns the candidate's stats and the rerun's, if any.
std::pair<CompareStats, std::optional<CompareStats>> compare_candidate(
    LlamaModel& candidate, const LoadReport& loaded, bool reference_rounded,
    const std::function<std::unique_ptr<LlamaModel>()>& load_f32, const ScoringPlan& plan, std::int64_t batch,
    RefLogprobFile& ref, const Progress& progress = nullptr, const Progress& f32_progress = nullptr,
    Ranks& ranks = one_process(), std::int64_t first_row = 0);

/// eval compare's text (llama-perplexity --kl-divergence's figures) and JSON
/// (low_bit, model, ref_model, tokens, ppl, ..., weights_only_*). `weights_only`
/// is the candidate rerun with f32 activations (when it rounds its inputs to
/// int8, int16 or bf16 and the reference does not), else null. `activations` is
/// LoadReport::activations of the candidate.
EvalReport compare_report(const CompareStats& stats, const CompareStats* weights_only, const ModelIdentity& candidate,
                          const std::string& ref_label, const std::string& activations, const ScoringPlan& plan,
                          const ScoringRequest& request);

/// The tasks `specs` names, loaded: comma-separated task names (their files
/// under `data_dir`, or the bundled ones, WOQ_TASK_DATA_DIR, when it is
/// empty), NAME=PATH, or "openllm" for the six Open LLM Leaderboard v1 tasks.
/// Each loaded task is reported to `log` ("task NAME: PATH (N items)").
/// Throws woq::Error for an unknown name, a missing file and load_task's errors.
std::vector<Task> load_task_list(const std::string& specs, const std::string& data_dir,
                                 const std::function<void(const std::string&)>& log = nullptr);

/// One task's JSON: task, items, shots, primary_metric, and each metric with
/// its _stderr.
nlohmann::ordered_json task_json(const TaskResult& result);

/// eval tasks' table (text) and JSON (an array of task_json, each with the model).
EvalReport tasks_report(const std::vector<TaskResult>& results, const std::string& label);

/// Every scored item of the log-likelihood tasks as JSON Lines, after
/// lm-eval's --log_samples: {"task", "doc_id", "subject" (MMLU), "arguments":
/// [[context, continuation], ...], "loglikelihoods": [...], "target": gold
/// index (truthfulqa_mc2: "labels"), and each metric's value for the item
/// ("acc", "acc_norm", "mc2")}. Generate tasks (GSM8K) have no lines.
std::string task_samples_jsonl(const std::vector<TaskResult>& results);

/// woq explain's text (both generations, where and why they diverge, the KL
/// per token, the `top` linear layers with the largest output error) and JSON
/// (prompt, low_bit, ref_low_bit, model, ref_model, texts, diverges_at,
/// near_tie, kl, original_top, quantized_top, layers).
EvalReport explain_report(const Explanation& e, const Tokenizer& tokenizer, const std::string& prompt,
                          const ModelIdentity& original, const ModelIdentity& quantized, std::int64_t top);

}  // namespace woq
