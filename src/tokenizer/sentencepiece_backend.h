// SentencePiece tokenizer.model (Llama 2, Mistral v0.1, the bundled
// stories260K) behind the TokenizerBackend interface.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer_backend.h"

namespace woq {

/// Loads a SentencePiece model; `config` is tokenizer_config.json (null when
/// absent): add_bos_token (default true) and add_eos_token (default false)
/// give the tokens around a sequence. Throws woq::Error naming the file when
/// it is not a SentencePiece model.
std::unique_ptr<TokenizerBackend> load_sentencepiece(const std::string& path, const nlohmann::json& config);

}  // namespace woq
