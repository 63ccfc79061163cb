// woq explain: the original and the quantized model side by side, and why they differ.
#include <string>

#include <fmt/core.h>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "eval/explain.h"
#include "eval/reports.h"
#include "io/json_file.h"

namespace woq::cli {

namespace {

struct ExplainArgs {
  std::string model_dir;
  std::string low_bit;  ///< empty: the default (add_low_bit_flag)
  std::string ref_low_bit = "fp32";
  std::string ref_dir;  // the original, when model_dir is a saved checkpoint
  ModelFlags model;
  std::string prompt;
  std::int64_t n = 48;
  std::int64_t top = 10;
  std::string json;
};

int run_explain(const ExplainArgs& a) {
  if (!a.json.empty()) require_writable_path(a.json);
  const auto pool = std::make_shared<ThreadPool>(a.model.threads);
  const std::string ref_dir = a.ref_dir.empty() ? a.model_dir : a.ref_dir;
  ModelSession original, quantized;
  quantized.open(a.model_dir, pool, ModelSession::Parts::kTokenizer);
  original.open(ref_dir, pool, ModelSession::Parts::kTokenizer);
  const Tokenizer& tok = *quantized.tokenizer;
  if (!a.ref_dir.empty()) require_same_vocabulary(tok, a.model_dir, *original.tokenizer, ref_dir);
  load_session(original, reference_load_options(a.model, a.ref_low_bit, a.ref_dir.empty()), true);
  const LoadReport& ref_report = original.report;
  note_reference(a.model_dir, a.ref_dir, ref_report);
  load_session(quantized, load_options(a.model, a.low_bit));
  const LoadReport& report = quantized.report;
  const Explanation e = explain(*original.model, *quantized.model, tok, a.prompt, a.n);
  const EvalReport r = explain_report(e, tok, a.prompt, {reference_label(ref_dir, ref_report, a.ref_dir.empty()), ref_report.low_bit},
                                      {model_label(a.model_dir, report), report.low_bit}, a.top);
  fmt::print("{}", r.text);
  if (!a.json.empty()) write_json_file(a.json, r.json);
  return 0;
}

}  // namespace

Run add_explain(CLI::App& app) {
  auto a = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand("explain", "Why does the quantized model's output differ from the original's?");
  add_model_and_low_bit(cmd, a->model_dir, a->low_bit);
  cmd->add_option("--ref-low-bit", a->ref_low_bit, "Format of the original")->capture_default_str()->check(kNotEmpty);
  cmd->add_option("--ref", a->ref_dir,
                  "The original (Hugging Face directory or .gguf file), when --model is a saved checkpoint; default: "
                  "--model itself at --ref-low-bit");
  add_model_flags(cmd, a->model);
  cmd->add_option("-p,--prompt", a->prompt, "Prompt")->required();
  cmd->add_option("-n,--n-predict", a->n, "Tokens to generate greedily")->capture_default_str()->check(kPositive);
  cmd->add_option("--top", a->top, "Linear layers to list")->capture_default_str()->check(kPositive);
  cmd->add_option("--json", a->json, "Also write the explanation as JSON to this file");
  return [a] { return run_explain(*a); };
}

}  // namespace woq::cli
