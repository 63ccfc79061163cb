// woq explain: the original and the quantized model side by side, and why they differ.
#include <algorithm>
#include <numeric>
#include <string>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "eval/explain.h"
#include "io/json_file.h"

namespace woq::cli {

namespace {

struct ExplainArgs {
  std::string model_dir;
  std::string low_bit = "sym_int4";
  std::string ref_low_bit = "fp32";
  std::string ref_dir;  // the original, when model_dir is a saved checkpoint
  ModelFlags model;
  std::string prompt;
  std::int64_t n = 48;
  std::int64_t top = 10;
  std::string json;
};

// A JSON-quoted string; invalid UTF-8 bytes shown as U+FFFD.
std::string quoted(const std::string& s) {
  return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int run_explain(const ExplainArgs& a) {
  ThreadPool pool(a.model.threads);
  const Tokenizer tok = Tokenizer::load(a.model_dir);
  const LoadOptions ref_options = load_options(a.model, a.ref_low_bit);
  const LoadOptions options = load_options(a.model, a.low_bit);
  const std::string ref_dir = a.ref_dir.empty() ? a.model_dir : a.ref_dir;
  LoadReport ref_report, report;
  auto original = load_model(ref_dir, ref_options, pool, &ref_report);
  note_reference(a.model_dir, a.ref_dir, ref_report);
  auto quantized = load_model(a.model_dir, options, pool, &report);
  const Explanation e = explain(*original, *quantized, tok, a.prompt, a.n);
  const std::string original_label = model_label(ref_dir, ref_report), quantized_label = model_label(a.model_dir, report);

  fmt::print("original:  {}\nquantized: {}\n\n", original_label, quantized_label);
  fmt::print("prompt:    {}\n", quoted(a.prompt));
  fmt::print("original:  {}\n", quoted(e.original_text));
  fmt::print("quantized: {}\n\n", quoted(e.quantized_text));
  if (e.diverges_at < 0) {
    fmt::print("The two generations are identical for all {} tokens.\n", e.original_ids.size());
  } else if (e.original_top.empty()) {
    fmt::print("The generations agree on every token the original produced; the original stopped after {} tokens and "
               "the quantized model went on.\n", e.original_ids.size());
  } else {
    const TokenProb& o1 = e.original_top[0];
    const TokenProb& o2 = e.original_top[1];
    fmt::print("They first differ at generated token {} (after {} identical tokens): the original chose {}, the "
               "quantized model {}.\n",
               e.diverges_at + 1, e.diverges_at, quoted(tok.token_text(e.original_ids[static_cast<std::size_t>(e.diverges_at)])),
               quoted(tok.token_text(e.quantized_ids[static_cast<std::size_t>(e.diverges_at)])));
    fmt::print("  original's top-2 there:  {} {:.3f}, {} {:.3f} (margin {:.3f})\n", quoted(o1.text), o1.p, quoted(o2.text),
               o2.p, o1.p - o2.p);
    fmt::print("  quantized's top-2 there: {} {:.3f}, {} {:.3f}\n", quoted(e.quantized_top[0].text), e.quantized_top[0].p,
               quoted(e.quantized_top[1].text), e.quantized_top[1].p);
    if (e.near_tie())
      fmt::print("  -> A near tie (margin < {}): the original was almost undecided, so the small change quantization "
                 "makes to the logits flips the choice. Expected and harmless; after it the two texts simply follow "
                 "different, equally plausible continuations.\n", e.near_tie_margin);
    else
      fmt::print("  -> Not a near tie: quantization moved a confident prediction. Check the mean KL and the layers "
                 "below; a finer --group-size, sym_int8, or GPTQ reduces this.\n");
  }
  if (!e.kl.empty()) {
    const auto max_it = std::max_element(e.kl.begin(), e.kl.end());
    const double mean = std::accumulate(e.kl.begin(), e.kl.end(), 0.0) / static_cast<double>(e.kl.size());
    fmt::print("\nKL(original || quantized) per generated token (teacher-forced on the original's text): mean {:.4f}, "
               "max {:.4f} at token {}\n  ", mean, *max_it, max_it - e.kl.begin() + 1);
    for (std::size_t i = 0; i < e.kl.size(); ++i) fmt::print("{:.3f}{}", e.kl[i], i + 1 == e.kl.size() ? "\n" : " ");
  }
  fmt::print("\nQuantization error per linear layer, largest output error first (on this text's activations):\n");
  const bool split = std::any_of(e.layers.begin(), e.layers.end(), [](const LinearError& l) { return l.weights_only_error >= 0; });
  fmt::print("  {:>5}  {:<17} {:>13} {:>13}{}\n", "layer", "linear", "output error", "weight error",
             split ? "  output error with f32 activations (the weights' part)" : "");
  for (std::size_t i = 0; i < e.layers.size() && static_cast<std::int64_t>(i) < a.top; ++i) {
    const LinearError& l = e.layers[i];
    fmt::print("  {:>5}  {:<17} {:>12.2f}% {:>12.2f}%{}\n", l.layer, l.name, 100 * l.output_error, 100 * l.weight_error,
               l.weights_only_error >= 0 ? fmt::format("  {:>12.2f}%", 100 * l.weights_only_error) : std::string());
  }
  if (!a.json.empty()) {
    nlohmann::ordered_json j = {{"prompt", a.prompt},
                                {"low_bit", report.low_bit},
                                {"ref_low_bit", ref_report.low_bit},
                                {"model", quantized_label},
                                {"ref_model", original_label},
                                {"original_text", e.original_text},
                                {"quantized_text", e.quantized_text},
                                {"diverges_at", e.diverges_at},
                                {"near_tie", e.near_tie()},
                                {"kl", e.kl}};
    for (const auto& t : e.original_top) j["original_top"].push_back({{"token", t.text}, {"p", t.p}});
    for (const auto& t : e.quantized_top) j["quantized_top"].push_back({{"token", t.text}, {"p", t.p}});
    for (const auto& l : e.layers)
      j["layers"].push_back({{"layer", l.layer},
                             {"linear", l.name},
                             {"output_error", l.output_error},
                             {"weight_error", l.weight_error},
                             {"weights_only_output_error",
                              l.weights_only_error >= 0 ? nlohmann::ordered_json(l.weights_only_error) : nullptr}});
    write_json_file(a.json, j);
  }
  return 0;
}

}  // namespace

Run add_explain(CLI::App& app) {
  auto a = std::make_shared<ExplainArgs>();
  CLI::App* cmd = app.add_subcommand("explain", "Why does the quantized model's output differ from the original's?");
  cmd->add_option("-m,--model", a->model_dir, "Hugging Face model directory or .gguf file")->required();
  cmd->add_option("--low-bit", a->low_bit, "Format of the quantized model")->capture_default_str();
  cmd->add_option("--ref-low-bit", a->ref_low_bit, "Format of the original")->capture_default_str();
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
