// woq make-random: a checkpoint with random weights in a real model's shapes.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <random>
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

// A fresh directory beside `out` (.NAME.tmp-PID-RANDOM, named as woq quantize's temporary directories, so that a
// later woq quantize to the same output removes one a killed run left), with the parent directories it had to
// create; all removed on destruction unless published.
class TempBeside {
 public:
  explicit TempBeside(const std::filesystem::path& out) : out_(out) {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (fs::path p = out.parent_path(); !p.empty() && !fs::exists(fs::symlink_status(p, ec)); p = p.parent_path())
      created_parent_ = p;  // the outermost one missing
    fs::create_directories(out.parent_path(), ec);
    if (ec) fail("{}: cannot create directory: {}", out.parent_path().string(), ec.message());
    std::random_device rd;
    for (int attempt = 0; attempt < 100 && path_.empty(); ++attempt) {
      const fs::path p = out.parent_path() / fmt::format(".{}.tmp-{}-{:08x}", out.filename().string(), getpid(), rd());
      if (fs::create_directory(p, ec)) path_ = p;
      else if (ec) fail("{}: cannot create: {}", p.string(), ec.message());
    }
    if (path_.empty()) fail("{}: cannot create a temporary directory beside it", out.string());
  }
  ~TempBeside() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
    if (!created_parent_.empty()) std::filesystem::remove_all(created_parent_, ec);
  }
  TempBeside(const TempBeside&) = delete;
  TempBeside& operator=(const TempBeside&) = delete;
  const std::filesystem::path& path() const { return path_; }

  /// Renames the directory to the output; with `replace`, the existing output is moved aside first and removed
  /// after (put back when the rename fails).
  void publish(bool replace) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path old = replace ? fs::path(path_.string() + ".old") : fs::path();
    if (replace) {
      fs::rename(out_, old, ec);
      if (ec) fail("{}: cannot move aside to replace it: {}", out_.string(), ec.message());
    }
    fs::rename(path_, out_, ec);
    if (ec) {
      if (replace) fs::rename(old, out_, ec);
      fail("{}: cannot rename {} into place: {}", out_.string(), path_.string(), ec.message());
    }
    path_.clear();
    created_parent_.clear();
    if (replace) fs::remove_all(old, ec);
  }

 private:
  std::filesystem::path out_, path_, created_parent_;
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
  std::string out_dir = a.out_dir;  // "OUT/" names OUT
  while (out_dir.size() > 1 && out_dir.back() == '/') out_dir.pop_back();
  const fs::path out = fs::absolute(fs::path(out_dir)).lexically_normal();
  if (out_dir.empty() || out.filename().empty()) fail("{}: not a directory name", a.out_dir);
  const bool replace = fs::exists(fs::symlink_status(out));
  if (replace) {
    if (!a.force) fail("{}: already exists (pass --force to replace it)", a.out_dir);
    // Replaced whole, so that no file of an earlier preset (a tokenizer.json, a shard) is left to be read.
    if (!fs::is_directory(out) || !fs::exists(out / "config.json"))
      fail("{}: --force replaces a model directory, and this has no config.json: remove it yourself", a.out_dir);
  }
  a.options.progress = terminal_progress("tensor");
  ThreadPool pool(a.threads);
  const auto t0 = std::chrono::steady_clock::now();
  TempBeside tmp(out);  // written there and renamed into place: a failure leaves no partial output
  const std::uint64_t bytes = write_random_checkpoint(tmp.path().string(), a.options, pool);
  tmp.publish(replace);
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
  cmd->add_option("-o,--output", args->out_dir,
                  "Output directory (written beside it and renamed into place; must not exist unless --force)")
      ->required();
  cmd->add_flag("--force", args->force, "Replace the output directory (a model directory) if it exists");
  add_threads_flag(cmd, args->threads);
  return [args] { return run_make_random(*args); };
}

}  // namespace woq::cli
