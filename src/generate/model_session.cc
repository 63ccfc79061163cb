#include "generate/model_session.h"

#include "core/error.h"

namespace woq {

void ModelSession::open(const std::string& where, int threads) {
  path = where;
  config = read_model_config(path);
  tokenizer = std::make_shared<Tokenizer>(Tokenizer::load(path));
  chat_template = ChatTemplate::load(path);
  pool = std::make_unique<ThreadPool>(threads);
}

void ModelSession::load(const LoadOptions& options) {
  if (!pool) fail("ModelSession::load: open() the model first");
  report = LoadReport{};
  model = LlamaModel::load(path, options, *pool, &report);
}

}  // namespace woq
