// One way to open a model: its config, tokenizer, chat template and weights
// from one path, for every command, the server and Python.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/thread_pool.h"
#include "generate/chat_template.h"
#include "io/hf_config.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// A model opened from a Hugging Face directory or a .gguf file: open() reads
/// what can be checked before the weights (config, tokenizer, chat template)
/// and starts the thread pool; load() reads the weights. `woq generate`,
/// `chat`, `serve` and Python's optimize_model open models this way.
struct ModelSession {
  std::string path;
  ModelConfig config;
  std::shared_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<LlamaModel> model;  ///< null until load()
  LoadReport report;                  ///< what load() did

  /// Reads `path`'s config (the plainest error for a wrong path comes first), tokenizer and chat template,
  /// and starts a pool of `threads` threads (0: all cores). Throws woq::Error as read_model_config,
  /// Tokenizer::load, ChatTemplate::load and ThreadPool do.
  void open(const std::string& path, int threads);
  /// Loads the weights per `options` on the session's pool (LlamaModel::load; open() first). Throws woq::Error.
  void load(const LoadOptions& options);
};

}  // namespace woq
