#include "generate/model_session.h"

#include "core/error.h"

namespace woq {

void ModelSession::open(const std::string& where, int threads) {
  open(where, std::make_shared<ThreadPool>(threads), Parts::kAll);
}

void ModelSession::open(const std::string& where, std::shared_ptr<ThreadPool> shared_pool, Parts parts) {
  path = where;
  if (is_gguf_path(path)) gguf_files = shared_gguf(path);
  config = read_model_config(path);
  if (parts != Parts::kConfigOnly) tokenizer = std::make_shared<Tokenizer>(Tokenizer::load(path));
  if (parts == Parts::kAll) chat_template = ChatTemplate::load(path);
  pool = std::move(shared_pool);
}

void ModelSession::load(const LoadOptions& options) {
  if (!pool) fail("ModelSession::load: open() the model first");
  report = LoadReport{};
  model.reset();  // one copy of the weights in memory at a time
  model = LlamaModel::load(path, options, *pool, &report);
  gguf_files.reset();  // the model holds what it needs; the mapping of the whole file is let go
}

}  // namespace woq
