// woq make-random: a checkpoint with random weights in a real model's shapes.
#include <chrono>
#include <filesystem>
#include <string>

#include <fmt/core.h>

#include "commands.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "model/random_checkpoint.h"

namespace woq::cli {

namespace {

struct MakeRandomArgs {
  RandomCheckpointOptions options;
  std::string dtype = "f16";
  std::string out_dir;
  int threads = 0;
  bool force = false;
};

int run_make_random(MakeRandomArgs& a) {
  if (a.dtype == "f16") {
    a.options.dtype = DType::kF16;
  } else if (a.dtype == "bf16") {
    a.options.dtype = DType::kBF16;
  } else if (a.dtype == "f32") {
    a.options.dtype = DType::kF32;
  } else {
    fail("--dtype '{}' is not one of: f16, bf16, f32", a.dtype);
  }
  namespace fs = std::filesystem;
  if (fs::exists(fs::symlink_status(a.out_dir))) {
    if (!a.force) fail("{}: already exists (pass --force to replace it)", a.out_dir);
    // Replaced whole, so that no file of an earlier preset (a tokenizer.json, a shard) is left to be read.
    if (!fs::is_directory(a.out_dir) || !fs::exists(fs::path(a.out_dir) / "config.json"))
      fail("{}: --force replaces a model directory, and this has no config.json: remove it yourself", a.out_dir);
    std::error_code ec;
    fs::remove_all(a.out_dir, ec);
    if (ec) fail("{}: cannot remove: {}", a.out_dir, ec.message());
  }
  a.options.progress = terminal_progress("tensor");
  ThreadPool pool(a.threads);
  const auto t0 = std::chrono::steady_clock::now();
  const std::uint64_t bytes = write_random_checkpoint(a.out_dir, a.options, pool);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print(stderr, "woq: wrote {} ({} preset{}, {}, seed {}): {:.3f} GiB of tensors in {:.1f} s\n", a.out_dir,
             a.options.preset, a.options.layers > 0 ? fmt::format(", {} layer{}", a.options.layers, a.options.layers == 1 ? "" : "s") : "", a.dtype,
             a.options.seed, static_cast<double>(bytes) / (1u << 30), s);
  return 0;
}

}  // namespace

Run add_make_random(CLI::App& app) {
  auto args = std::make_shared<MakeRandomArgs>();
  CLI::App* cmd = app.add_subcommand(
      "make-random", "Write a Hugging Face checkpoint with random weights in a real model's shapes, with its tokenizer");
  std::string presets;
  for (const ModelPreset& p : model_presets()) presets += (presets.empty() ? "" : ", ") + p.name;
  cmd->add_option("--preset", args->options.preset, "Architecture and shapes: " + presets)->capture_default_str();
  cmd->add_option("--layers", args->options.layers, "Number of decoder layers (default: the preset's)")
      ->check(kPositive);
  cmd->add_option("--dtype", args->dtype, "Weight dtype: f16, bf16 or f32")->capture_default_str();
  cmd->add_option("--seed", args->options.seed, "Random seed")->capture_default_str();
  cmd->add_option("--weight-std", args->options.weight_std,
                  "Standard deviation of the embedding, linear and lm_head weights")
      ->capture_default_str();
  cmd->add_option("--tokenizer-root", args->options.tokenizer_root,
                  "Folder holding the presets' tokenizers (llama2/, llama3/, qwen3/; default: the repository's "
                  "assets/tokenizers)");
  cmd->add_option("-o,--output", args->out_dir, "Output directory (created; must not exist unless --force)")->required();
  cmd->add_flag("--force", args->force, "Replace the output directory (a model directory) if it exists");
  add_threads_flag(cmd, args->threads);
  return [args] { return run_make_random(*args); };
}

}  // namespace woq::cli
