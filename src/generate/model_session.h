// One way to open a model: its config, tokenizer, chat template and weights
// from one path, for every command, the server and Python.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/thread_pool.h"
#include "generate/chat_template.h"
#include "io/gguf.h"
#include "io/hf_config.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// A model opened from a Hugging Face directory or a .gguf file: open() reads
/// what can be checked before the weights (config, tokenizer, chat template)
/// and starts the thread pool; load() reads the weights. Every command
/// (generate, chat, serve, eval, explain, bench) and Python's optimize_model
/// open models this way.
struct ModelSession {
  std::string path;
  ModelConfig config;
  std::shared_ptr<Tokenizer> tokenizer;  ///< null when opened with Parts::kConfigOnly
  std::optional<ChatTemplate> chat_template;
  std::shared_ptr<ThreadPool> pool;  ///< shared by the sessions of one command (eval's reference and candidate)
  std::unique_ptr<LlamaModel> model;  ///< null until load()
  LoadReport report;                  ///< what load() did
  /// A GGUF model's parsed files, held from open() to the end of load() so that they are parsed once.
  std::shared_ptr<const std::vector<GgufFile>> gguf_files;

  /// Reads `path`'s config (the plainest error for a wrong path comes first), tokenizer and chat template,
  /// and starts a pool of `threads` threads (0: all cores). Throws woq::Error as read_model_config,
  /// Tokenizer::load, ChatTemplate::load and ThreadPool do.
  void open(const std::string& path, int threads);
  /// What open() reads besides the config: scoring needs no chat template (and a template that fails to
  /// parse must not stop it), a benchmark not even a tokenizer (random ids; a weights-only directory).
  enum class Parts { kAll, kTokenizer, kConfigOnly };
  /// open() on an existing pool, reading `parts` (tokenizer null for kConfigOnly).
  void open(const std::string& path, std::shared_ptr<ThreadPool> shared_pool, Parts parts);
  /// Loads the weights per `options` on the session's pool (LlamaModel::load; open() first), freeing the
  /// previous weights first. Throws woq::Error.
  void load(const LoadOptions& options);
};

}  // namespace woq
