// SentencePiece tokenizer.model (Llama 2, Mistral v0.1, the bundled
// stories260K), or a ModelProto rebuilt from a GGUF's vocabulary, behind the
// TokenizerBackend interface.
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

/// A SentencePiece model given as a serialized ModelProto (sentencepiece_model.proto's wire
/// format; gguf_vocab builds one from tokenizer.ggml.*). `specials` are the tokens around a
/// sequence and the BOS/EOS ids; `description` is what describe() says; `source` names the
/// model in errors; the caller checks the ids. Throws woq::Error when SentencePiece refuses the
/// proto (duplicate or empty pieces, no unk piece, byte pieces missing with byte_fallback).
std::unique_ptr<TokenizerBackend> load_sentencepiece_proto(const std::string& serialized, const std::string& source,
                                                           SpecialTokens specials, std::string description);

}  // namespace woq
