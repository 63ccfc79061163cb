// The tokenizer of a model written as GGUF metadata (tokenizer.ggml.*, as
// llama.cpp's convert_hf_to_gguf.py writes it), for `woq quantize --format gguf`.
#pragma once

#include <string>
#include <vector>

#include "io/gguf_writer.h"
#include "io/hf_config.h"

namespace woq {

/// Sets the tokenizer.ggml.* keys (and tokenizer.chat_template when the
/// model has one) of the model at `model` on `w`: a GGUF input's keys are
/// copied unchanged; a Hugging Face directory's tokenizer.model becomes
/// model "llama" (pieces, scores, token types), a byte-level BPE
/// tokenizer.json model "gpt2" (tokens, merges, the tokenizer.ggml.pre
/// whose pre-tokenizer matches it). BOS/EOS ids come from `config` and the
/// tokenizer. Throws woq::Error naming the file for a tokenizer GGUF cannot
/// describe (a pre-tokenizer llama.cpp has no name for, a WordPiece or
/// Unigram tokenizer.json). Returns notes on what GGUF cannot carry (a
/// SentencePiece normalizer that collapses runs of spaces).
std::vector<std::string> write_gguf_vocab(const std::string& model, const ModelConfig& config, GgufWriter& w);

}  // namespace woq
