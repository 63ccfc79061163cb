// woq eval perplexity | compare | tasks | recovery | pareto (the reports are eval/reports.h's).
#include <cmath>
#include <filesystem>
#include <optional>
#include <string>

#include <fmt/core.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/thread_pool.h"
#include "eval/compare.h"
#include "eval/perplexity.h"
#include "eval/recovery.h"
#include "eval/recovery_report.h"
#include "eval/reports.h"
#include "eval/tasks.h"
#include "io/json_file.h"
#include "quantize/pareto.h"

namespace woq::cli {

namespace {

struct EvalArgs {
  std::string model_dir;
  std::string low_bit;  ///< empty: the default (add_low_bit_flag)
  ModelFlags model;
  std::string file;
  ScoringRequest scoring;
  bool no_bos_per_chunk = false;
  std::string json;
  // compare only
  std::string ref_low_bit = "fp32";
  std::string ref_dir;
  std::string save_ref, load_ref;
  std::string kl_base;  ///< perplexity: also write llama-perplexity's --kl-divergence-base file
};

void add_common(CLI::App* cmd, EvalArgs& a, bool file_required) {
  add_model_and_low_bit(cmd, a.model_dir, a.low_bit);
  add_model_flags(cmd, a.model);
  CLI::Option* file = cmd->add_option("-f,--file", a.file,
                                      file_required ? "Text file to score"
                                                    : "Text file to score (required unless --load-ref is llama-perplexity's "
                                                      "--kl-divergence-base file, which holds its chunks' tokens)");
  if (file_required) file->required();
  cmd->add_option("-c,--ctx-size,--ctx", a.scoring.ctx, "Tokens per chunk (documents are cut to this)")->capture_default_str()->check(kPositive);
  cmd->add_option("--batch", a.scoring.batch, "Tokens per forward call; 0 = the whole chunk")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--chunks", a.scoring.chunks, "Score at most this many chunks or documents; 0 = all")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_flag("--no-bos-per-chunk", a.no_bos_per_chunk,
                "Keep each chunk's first token (llama-perplexity replaces it with BOS when the tokenizer adds one)");
  cmd->add_option("--per-document", a.scoring.per_document,
                  "Score each document from position 0 instead, splitting the text on this separator (e.g. '<|endoftext|>')")
      ->check(CLI::Validator([](std::string& v) { return v.empty() ? std::string("must not be empty") : std::string(); },
                             "SEPARATOR"));
  cmd->add_option("--json", a.json, "Also write the results as JSON to this file");
}

ScoringPlan make_plan(const EvalArgs& a, const Tokenizer& tok, std::int64_t context_limit) {
  ScoringRequest r = a.scoring;
  r.bos_per_chunk = !a.no_bos_per_chunk;
  return scoring_plan(tok, read_text_file(a.file), a.file, r, context_limit);
}

// What a rank will score: every sequence's tokens and where scoring starts.
std::string plan_digest(const ScoringPlan& plan) {
  Fnv1a64 h;
  h.add(&plan.first_scored, sizeof plan.first_scored);
  for (const auto& seq : plan.sequences) {
    const auto n = static_cast<std::int64_t>(seq.size());
    h.add(&n, sizeof n).add(seq.data(), seq.size() * sizeof seq[0]);
  }
  return h.hex();
}

// What a rank will ask: every task's items and few-shot pool, field by field.
std::string tasks_digest(const std::vector<Task>& tasks) {
  Fnv1a64 h;
  const auto text = [&](const std::string& t) {
    const std::uint64_t n = t.size();
    h.add(&n, sizeof n).add(t);
  };
  const auto items = [&](const std::vector<TaskItem>& list) {
    for (const TaskItem& i : list) {
      text(i.context);
      for (const std::string& c : i.choices) text(c);
      text(i.target);
      h.add(&i.gold, sizeof i.gold).add(&i.subject, sizeof i.subject).add(i.labels.data(), i.labels.size() * sizeof(int));
      text("\x1e");  // item separator
    }
  };
  for (const Task& t : tasks) {
    text(t.name);
    items(t.items);
    text(t.fewshot_split);
    items(t.fewshot);
    for (const std::string& subject : t.subjects) text(subject);
  }
  return h.hex();
}

void print_report(const EvalReport& report, const std::string& json_path) {
  fmt::print("{}", report.text);
  if (!json_path.empty()) write_json_file(json_path, report.json);
}

struct TasksArgs {
  std::string model_dir;
  std::string low_bit;  ///< tasks: empty = the default (add_low_bit_flag); recovery: the variants
  std::string baseline = "fp32";
  ModelFlags model;
  std::string tasks;
  std::string data_dir;
  int shots = -1;
  std::int64_t limit = 0;
  std::uint64_t seed = 1234;
  std::string ppl_file;
  std::int64_t ctx = 512;
  std::string json, markdown;
  std::string log_samples;  // tasks: every item's requests and log-likelihoods (JSON Lines)
  std::string ref_dir;  // recovery: the original, when --model is a saved checkpoint
};

std::vector<Task> load_tasks(const TasksArgs& a) {
  return load_task_list(a.tasks, a.data_dir, [](const std::string& line) {
    if (job().leader()) fmt::print(stderr, "woq: {}\n", line);  // every rank reads the same files (digested)
  });
}

int run_perplexity(const EvalArgs& a) {
  Ranks& ranks = job();  // mpirun -np R: each rank scores its share of the chunks; rank 0 reports
  if (!a.json.empty() && ranks.leader()) require_writable_path(a.json);
  require_same_model(ranks, a.model_dir, a.model);
  const ModelSession s = open_scoring_session(a.model_dir, load_options(a.model, a.low_bit),
                                              std::make_shared<ThreadPool>(a.model.threads));
  const ScoringPlan plan = make_plan(a, *s.tokenizer, s.model->context_limit());
  require_same_inputs(ranks, "text to score (its chunks' tokens)", plan_digest(plan));
  std::optional<LlamaLogitsWriter> base;
  if (!a.kl_base.empty()) {
    if (ranks.size() > 1) fail("--kl-divergence-base is written by one process, not {} ranks", ranks.size());
    require_writable_path(a.kl_base);
    base.emplace(a.kl_base, plan, s.model->config().vocab_size);
  }
  const ScoredLogits also = [&](std::int64_t, std::int64_t, std::int32_t, const float* logits) { base->write(logits); };
  const EvalReport report =
      perplexity_report(*s.model, {model_label(a.model_dir, s.report), s.report.low_bit}, plan, a.scoring,
                        ranks.leader() ? terminal_progress("chunk") : nullptr, ranks, base ? also : nullptr);
  if (base) base->finish();
  if (ranks.leader()) print_report(report, a.json);
  return 0;
}

// The chunks of llama-perplexity's --kl-divergence-base file: its tokens, n_ctx and n_chunk, so
// the flags that choose the text and its chunks are refused.
// Each chunk starts with BOS when llama-perplexity's tokenizer added it (the file's first token), whatever
// this model's tokenizer does: the same inputs, so that the KL compares the models alone.
ScoringPlan llama_reference_plan(const EvalArgs& a, const CLI::App& cmd, const Tokenizer& tok, const ModelConfig& config) {
  for (const char* flag : {"--file", "--ctx", "--chunks", "--per-document", "--no-bos-per-chunk", "--ref-low-bit"})
    if (cmd.count(flag) > 0)
      fail("{} is llama-perplexity's --kl-divergence-base file, which holds its chunks' tokens and log-probabilities: "
           "{} cannot apply", a.load_ref, flag);
  LlamaLogitsPlan p = llama_logits_plan(a.load_ref, tok.bos_id(), config.vocab_size, config.context_limit());
  if (p.bos != tok.add_bos())
    fmt::print(stderr, "woq: note: {}'s chunks {} BOS first, as llama-perplexity {} them; this model's tokenizer {} "
               "(the chunks are scored as the file has them)\n", a.load_ref, p.bos ? "have" : "do not have",
               p.bos ? "gave" : "left", tok.add_bos() ? "adds BOS" : "adds none");
  return std::move(p.plan);
}

int run_compare(const EvalArgs& a, const CLI::App& cmd) {
  // mpirun -np R: each rank runs the reference and the candidate on its share of the sequences (reading its rows
  // of a --load-ref file); the positions are gathered in order and rank 0 reports.
  Ranks& ranks = job();
  if (!a.load_ref.empty() && (!a.ref_dir.empty() || !a.save_ref.empty()))
    fail("--load-ref replaces the reference run: do not combine it with --ref or --save-ref");
  if (!a.save_ref.empty() && ranks.size() > 1)
    fail("--save-ref is written by one process, not {} ranks (each rank holds its share of the rows)", ranks.size());
  std::error_code ec;
  if (!a.load_ref.empty() && !std::filesystem::is_regular_file(a.load_ref, ec))
    fail("--load-ref {}: not found or not a regular file", a.load_ref);
  const bool llama_ref = !a.load_ref.empty() && is_llama_logits_file(a.load_ref);
  if (!llama_ref && a.file.empty())
    fail("--file is required (or --load-ref with a file llama-perplexity --kl-divergence-base wrote)");
  for (const std::string* out : {&a.json, &a.save_ref})
    if (!out->empty() && ranks.leader()) {  // only rank 0 writes
      require_writable_path(*out);
      if (!a.load_ref.empty() && std::filesystem::equivalent(*out, a.load_ref, ec))
        fail("{} is the --load-ref file: writing it would destroy the reference", *out);
    }
  require_same_model(ranks, a.model_dir, a.model);
  if (!a.ref_dir.empty()) require_same_inputs(ranks, "reference model (--ref)", path_digest(a.ref_dir));
  if (!a.load_ref.empty()) require_same_inputs(ranks, "reference file (--load-ref)", path_digest(a.load_ref));
  const auto pool = std::make_shared<ThreadPool>(a.model.threads);
  const Tokenizer tok = Tokenizer::load(a.model_dir);
  const ModelConfig config = read_model_config(a.model_dir);
  const ScoringPlan plan =
      llama_ref ? llama_reference_plan(a, cmd, tok, config) : make_plan(a, tok, config.context_limit());
  require_same_inputs(ranks, "text to score (its chunks' tokens)", plan_digest(plan));
  const PlanShare mine = plan_share(plan, ranks);
  const auto bar = [&](const char* what) { return ranks.leader() ? terminal_progress(what) : nullptr; };
  const std::int64_t vocab = config.vocab_size;
  std::optional<RefLogprobFile> ref;
  std::string ref_label = a.load_ref.empty() ? ""
                          : llama_ref    ? fmt::format("llama-perplexity's log-probabilities in {}", a.load_ref)
                                         : fmt::format("log-probabilities saved in {}", a.load_ref);
  // Then the f32-activation rerun would not isolate the weights' share (llama.cpp rounds them too).
  bool ref_rounded = llama_ref;
  std::int64_t first_row = 0;  // this rank's first row of the reference file
  if (!a.load_ref.empty()) {
    ref.emplace(RefLogprobFile::open(a.load_ref, plan, vocab));
    first_row = mine.first_row;
  } else {
    const std::string ref_dir = a.ref_dir.empty() ? a.model_dir : a.ref_dir;
    ModelSession reference;
    reference.open(ref_dir, pool, ModelSession::Parts::kTokenizer);
    if (!a.ref_dir.empty()) require_same_vocabulary(tok, a.model_dir, *reference.tokenizer, ref_dir);
    load_session(reference, reference_load_options(a.model, a.ref_low_bit, a.ref_dir.empty()), true);
    ref_label = reference_label(ref_dir, reference.report, a.ref_dir.empty());
    note_reference(a.model_dir, a.ref_dir, reference.report);
    ref_rounded = reference.report.rounded_activations;
    if (reference.config.vocab_size != vocab)
      fail("--ref {} has a vocabulary of {}, the model {}", ref_dir, reference.config.vocab_size, vocab);
    ref.emplace(RefLogprobFile::create(a.save_ref, mine.plan, vocab));
    write_reference(*reference.model, mine.plan, a.scoring.batch, *ref, bar("reference"));
  }  // the reference is freed before the candidate loads
  ModelSession candidate = open_scoring_session(a.model_dir, load_options(a.model, a.low_bit), pool);
  const LoadReport report = candidate.report;
  // With int8, int16 or bf16 activations, the same weights again with f32 activations: the weights' share of the error.
  const auto load_f32 = [&] {
    candidate.model.reset();  // one model in memory at a time
    LoadOptions options = load_options(a.model, a.low_bit);
    options.activations = Activations::kF32;
    return LlamaModel::load(a.model_dir, options, *pool);
  };
  const auto [s, weights_only] = compare_candidate(*candidate.model, report, ref_rounded, load_f32, mine.plan,
                                                   a.scoring.batch, *ref, bar("candidate"), bar("f32 activations"),
                                                   ranks, first_row);
  if (!ranks.leader()) return 0;
  print_report(compare_report(s, weights_only ? &*weights_only : nullptr, {model_label(a.model_dir, report), report.low_bit},
                              ref_label, report.activations, plan, a.scoring),
               a.json);
  return 0;
}

TaskOptions task_options(const TasksArgs& a) {
  TaskOptions o;
  o.shots = a.shots;
  o.limit = a.limit;
  o.seed = a.seed;
  o.keep_samples = !a.log_samples.empty();
  o.ranks = &job();  // mpirun -np R: each rank scores its share of every task's items
  return o;
}

// Everything that can fail before scoring: output paths and few-shot pools.
void check_before_running(const TasksArgs& a, const std::vector<Task>& tasks) {
  for (const std::string* out : {&a.json, &a.markdown, &a.log_samples})
    if (!out->empty() && job().leader()) require_writable_path(*out);  // only rank 0 writes
  std::error_code e1, e2;
  if (!a.log_samples.empty() && !a.json.empty() &&
      std::filesystem::weakly_canonical(a.log_samples, e1) == std::filesystem::weakly_canonical(a.json, e2))
    fail("--log-samples and --json name the same file, {}", a.json);
  for (const Task& t : tasks) check_fewshot(t, task_options(a));
}

// One terminal progress line per task.
std::vector<Progress> task_bars(const std::vector<Task>& tasks) {
  std::vector<Progress> bars;
  for (const Task& t : tasks) bars.push_back(job().leader() ? terminal_progress(t.name.c_str()) : nullptr);
  return bars;
}

int run_tasks_command(const TasksArgs& a) {
  const std::vector<Task> tasks = load_tasks(a);
  check_before_running(a, tasks);
  require_same_model(job(), a.model_dir, a.model);
  require_same_inputs(job(), "task data (the items and few-shot examples loaded)", tasks_digest(tasks));
  const ModelSession s = open_scoring_session(a.model_dir, load_options(a.model, a.low_bit),
                                              std::make_shared<ThreadPool>(a.model.threads));
  const std::vector<TaskResult> results = run_tasks(*s.model, *s.tokenizer, tasks, task_options(a), task_bars(tasks));
  if (!job().leader()) return 0;
  print_report(tasks_report(results, model_label(a.model_dir, s.report)), a.json);
  if (!a.log_samples.empty()) write_text_file(a.log_samples, task_samples_jsonl(results));
  return 0;
}

// Recovery = variant / baseline (higher is better) on each task, with paired bootstrap errors; the average is over
// the tasks only; perplexity recovery (baseline / variant) is reported apart.
int run_recovery_command(const TasksArgs& a, bool low_bit_given) {
  // mpirun -np R: each rank scores its share of every task's items (and of the --ppl-file chunks), column by
  // column; rank 0 reports.
  Ranks& ranks = job();
  const auto pool = std::make_shared<ThreadPool>(a.model.threads);
  const std::vector<Task> tasks = load_tasks(a);
  check_before_running(a, tasks);
  require_same_model(ranks, a.model_dir, a.model);
  if (!a.ref_dir.empty()) require_same_inputs(ranks, "reference model (--ref)", path_digest(a.ref_dir));
  require_same_inputs(ranks, "task data (the items and few-shot examples loaded)", tasks_digest(tasks));
  const Tokenizer tok = Tokenizer::load(a.model_dir);
  std::vector<std::string> variants;
  for (std::size_t b = 0, e; b <= a.low_bit.size(); b = e + 1) {
    e = a.low_bit.find(',', b);
    if (e == std::string::npos) e = a.low_bit.size();
    if (e > b) variants.push_back(a.low_bit.substr(b, e - b));
  }
  if (variants.empty()) fail("--low-bit '{}' lists no format to compare with the baseline", a.low_bit);
  // With --ref the model is usually a saved checkpoint: one variant, as stored, unless --low-bit says otherwise.
  if (!a.ref_dir.empty() && !low_bit_given) variants = {"sym_int4"};
  // With --plan: one variant, the plan (a --low-bit given beside it is refused by the plan's loading).
  if (!a.model.plan.empty() && !low_bit_given) variants = {""};
  // Each column's model and the format its float layers are converted to.
  std::vector<std::string> low_bits = {a.baseline};
  std::vector<RecoveryColumn> columns = {{a.ref_dir.empty() ? a.model_dir : a.ref_dir, "", "", {}, {}}};
  for (const std::string& v : variants) {
    low_bits.push_back(v);
    columns.push_back({a.model_dir, "", "", {}, {}});
  }
  std::optional<ScoringPlan> ppl_plan;
  if (!a.ppl_file.empty()) {
    try {
      ppl_plan = chunk_plan(tok.encode(read_text_file(a.ppl_file)), a.ctx, 0, chunk_bos(tok));
    } catch (const Error& e) {
      fail("--ppl-file {}: {}", a.ppl_file, e.what());
    }
    require_same_inputs(ranks, "--ppl-file text (its chunks' tokens)", plan_digest(*ppl_plan));
  }
  if (!a.ref_dir.empty()) {  // before any scoring: the two must be the same model
    const ModelConfig ref = read_model_config(a.ref_dir), model = read_model_config(a.model_dir);
    if (ref.vocab_size != model.vocab_size || ref.hidden_size != model.hidden_size ||
        ref.num_hidden_layers != model.num_hidden_layers || ref.intermediate_size != model.intermediate_size)
      fail("--ref {} is not the original of {}: vocabulary {} vs {}, hidden_size {} vs {}, {} vs {} layers, "
           "intermediate_size {} vs {}", a.ref_dir, a.model_dir, ref.vocab_size, model.vocab_size, ref.hidden_size,
           model.hidden_size, ref.num_hidden_layers, model.num_hidden_layers, ref.intermediate_size,
           model.intermediate_size);
    require_same_vocabulary(tok, a.model_dir, Tokenizer::load(a.ref_dir), a.ref_dir);
  }
  std::vector<TaskResult> shapes;  // the baseline's results: task names, shots, items
  std::int64_t baseline_vocab = 0;
  for (std::size_t c = 0; c < columns.size(); ++c) {
    RecoveryColumn& col = columns[c];
    // The baseline without --activations (each format's default), as eval compare loads its reference: the flag is
    // the variants'.
    ModelSession session;
    session.open(col.path, pool, ModelSession::Parts::kTokenizer);
    load_session(session,
                 c == 0 ? reference_load_options(a.model, low_bits[c], a.ref_dir.empty()) : load_options(a.model, low_bits[c]),
                 c == 0);
    const LoadReport& report = session.report;
    if (c == 0) baseline_vocab = session.config.vocab_size;
    if (session.config.vocab_size != baseline_vocab)
      fail("--ref {} has a vocabulary of {}, the model {}", columns[0].path, baseline_vocab, session.config.vocab_size);
    col.label = c == 0 ? reference_label(col.path, report, a.ref_dir.empty()) : model_label(col.path, report);
    col.name = c == 0 && !a.ref_dir.empty() ? "baseline" : report.low_bit;
    if (c == 0) note_reference(a.model_dir, a.ref_dir, report);
    // A checkpoint stored quantized ignores --low-bit (only float layers are converted): one variant is all there is.
    if (c == 1 && report.prequantized() && report.linear_matrices == 0 && columns.size() > 2) {
      fmt::print(stderr, "woq: note: {} stores its linear layers quantized ({}); --low-bit does not change them, so "
                 "there is one variant\n", col.path, report.imported_format);
      columns.resize(2);
    }
    std::vector<TaskResult> results = score_recovery_column(*session.model, tok, tasks, task_options(a),
                                                            task_bars(tasks), ppl_plan ? &*ppl_plan : nullptr, col);
    if (c == 0) shapes = std::move(results);
  }
  if (!ranks.leader()) return 0;
  std::optional<RecoveryPerplexity> ppl;
  if (ppl_plan) ppl = RecoveryPerplexity{a.ppl_file, a.ctx};
  const EvalReport report = recovery_report(std::move(columns), shapes, task_options(a).bootstrap, a.seed, ppl);
  fmt::print("{}", report.text);
  if (!a.json.empty()) write_json_file(a.json, report.json);
  if (!a.markdown.empty()) write_text_file(a.markdown, report.text);
  return 0;
}
void add_task_flags(CLI::App* cmd, TasksArgs& a) {
  cmd->add_option("-m,--model", a.model_dir, "Hugging Face model directory or .gguf file")->required();
  add_model_flags(cmd, a.model);
  cmd->add_option("--tasks", a.tasks,
                  "Comma-separated tasks (arc_easy, arc_challenge, hellaswag, piqa, winogrande, mmlu, truthfulqa_mc1, "
                  "truthfulqa_mc2, gsm8k: the bundled full files, or those under --data-dir), NAME=PATH (also jsonl=PATH for {context, choices, "
                  "gold} lines), or openllm (the six Open LLM Leaderboard v1 tasks)")
      ->required();
  cmd->add_option("--data-dir", a.data_dir,
                  "Folder with the task files in the bundled layout (default: the files extracted from assets/tasks at "
                  "build time, " + bundled_task_data_dir() + ")");
  cmd->add_option("--num-fewshot", a.shots, "Few-shot examples; -1 = each task's default")
      ->capture_default_str()
      ->check(CLI::Range(-1, 1 << 20));
  cmd->add_option("--limit", a.limit, "First N items of each task (of each MMLU subject); 0 = all")->capture_default_str()->check(kNonNegative);
  cmd->add_option("--seed", a.seed, "Seed of few-shot sampling and bootstrap")->capture_default_str();
  cmd->add_option("--json", a.json, "Also write the results as JSON to this file");
}

struct ParetoArgs {
  ParetoRequest request;
  int threads = 0;
};

int run_pareto_command(const ParetoArgs& a) {
  if (a.request.png.empty() && a.request.json.empty()) fail("eval pareto: give -o FILE.png and/or --json FILE");
  ThreadPool pool(a.threads);
  run_pareto(a.request, pool, [](const std::string& line) { fmt::print(stderr, "woq: {}\n", line); });
  for (const std::string* out : {&a.request.png, &a.request.json})
    if (!out->empty()) fmt::print(stderr, "woq: wrote {}\n", *out);
  return 0;
}

void add_pareto_flags(CLI::App* cmd, ParetoArgs& a) {
  ParetoRequest& r = a.request;
  cmd->add_option("-m,--model", r.input, "A model with float linear layers (Hugging Face directory or .gguf)")->required();
  cmd->add_option("-f,--file", r.file, "Held-out text every point is measured on")->required();
  cmd->add_option("--calib-file", r.calib_file, "Calibration text for the per-layer measurement (not --file)");
  cmd->add_option("--measurement", r.measurement, "A saved woq quantize --measure output instead of --calib-file");
  cmd->add_option("-o,--output", r.png, "The plot (PNG, drawn by gnuplot)");
  cmd->add_option("--json", r.json, "The points as JSON");
  cmd->add_option("-c,--ctx-size,--ctx", r.ctx, "Tokens per chunk")->capture_default_str()->check(kPositive);
  cmd->add_option("--chunks", r.chunks, "Chunks of each text at most")->capture_default_str()->check(kPositive);
  add_threads_flag(cmd, a.threads);
}

}  // namespace

Run add_eval(CLI::App& app) {
  CLI::App* eval = app.add_subcommand("eval", "Measure accuracy: perplexity, KL divergence against the original, lm-eval tasks, recovery");
  eval->require_subcommand(1);
  auto ppl = std::make_shared<EvalArgs>();
  CLI::App* p = eval->add_subcommand(
      "perplexity", "Perplexity of a text (llama-perplexity's chunks scored on their second half, or per document)");
  add_common(p, *ppl, true);
  p->add_option("--kl-divergence-base", ppl->kl_base,
                "Also write the log-probabilities as llama-perplexity --kl-divergence-base does, for "
                "llama-perplexity --kl-divergence (or woq eval compare --load-ref) to score other models against");
  auto cmp = std::make_shared<EvalArgs>();
  CLI::App* c = eval->add_subcommand(
      "compare", "KL divergence, same-top-token rate and perplexity ratio of --low-bit against a reference");
  add_common(c, *cmp, false);
  c->add_option("--ref-low-bit", cmp->ref_low_bit, "Format of the reference (the same model)")
      ->check(kNotEmpty)
      ->capture_default_str();
  c->add_option("--ref", cmp->ref_dir, "Reference model: Hugging Face directory or .gguf file (instead of the same model at --ref-low-bit)");
  c->add_option("--save-ref", cmp->save_ref, "Save the reference's log-probabilities to this file");
  c->add_option("--load-ref", cmp->load_ref,
                "Use log-probabilities saved by --save-ref instead of running the reference, or those llama-perplexity "
                "--kl-divergence-base wrote (its chunks' tokens, with their n_ctx and n_chunk)");
  auto tasks = std::make_shared<TasksArgs>();
  CLI::App* t = eval->add_subcommand("tasks", "lm-eval-style tasks: multiple choice by log-likelihood, GSM8K by generation");
  add_task_flags(t, *tasks);
  add_low_bit_flag(t, tasks->low_bit);
  t->add_option("--log-samples", tasks->log_samples,
                "Also write each log-likelihood item's (context, continuation) requests and log-likelihoods to this "
                "file, as JSON Lines (lm-eval's --log_samples; GSM8K's generated items are not logged)");
  auto rec = std::make_shared<TasksArgs>();
  CLI::App* r = eval->add_subcommand("recovery", "Tasks (and perplexity) of the original and quantized variants, with recovery %");
  add_task_flags(r, *rec);
  rec->low_bit = "sym_int8,sym_int4,asym_int4";
  r->add_option("--low-bit", rec->low_bit, "Comma-separated variants")->capture_default_str();
  r->add_option("--baseline-low-bit", rec->baseline, "Format of the baseline")->capture_default_str();
  r->add_option("--ppl-file", rec->ppl_file, "Also compare the perplexity of this text");
  r->add_option("-c,--ctx-size,--ctx", rec->ctx, "Perplexity chunk size (--ppl-file)")->capture_default_str()->check(kPositive);
  r->add_option("--markdown", rec->markdown, "Also write the table as Markdown to this file");
  r->add_option("--ref", rec->ref_dir,
                "The original (Hugging Face directory or .gguf file) as the baseline, when --model is a saved "
                "checkpoint; --model is then one variant, as stored, unless --low-bit is given");
  auto par = std::make_shared<ParetoArgs>();
  CLI::App* pa = eval->add_subcommand(
      "pareto", "Size against KL for the uniform formats, llama-quantize's rule mixes and woq's solved plans (PNG, JSON)");
  add_pareto_flags(pa, *par);
  return [p, c, t, r, pa, ppl, cmp, tasks, rec, par] {
    if (p->parsed()) return run_perplexity(*ppl);
    if (pa->parsed()) return run_pareto_command(*par);
    if (c->parsed()) return run_compare(*cmp, *c);
    if (t->parsed()) return run_tasks_command(*tasks);
    return run_recovery_command(*rec, r->count("--low-bit") > 0);
  };
}

}  // namespace woq::cli
