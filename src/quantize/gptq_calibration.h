// GPTQ over a whole model, block by block (as AutoGPTQ does): calibration
// sequences run through the decoder one block at a time; each block's linear
// layers are quantized from the Hessians of the inputs that reach them, and
// the next block sees the outputs of this block after it was quantized.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "quantize/gptq.h"
#include "quantize/quantize_checkpoint.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// Calibration data: token id sequences of equal length.
using Calibration = std::vector<std::vector<std::int32_t>>;

/// `count` sequences of `length` token ids drawn uniformly from [0, vocab)
/// with a seeded mt19937_64 (the "random tokens" recipe of Neural Magic's
/// w8a16 model card). Throws woq::Error on non-positive sizes.
Calibration random_calibration(std::int64_t count, std::int64_t length, std::int64_t vocab, std::uint64_t seed);

/// `text` tokenized once and cut into `count` consecutive, non-overlapping
/// windows of `length` tokens from its start. Throws woq::Error when the text
/// has fewer than count * length tokens (saying how many it has).
Calibration text_calibration(const Tokenizer& tokenizer, const std::string& text, std::int64_t count,
                             std::int64_t length);

/// Throws woq::Error when `count` sequences of `length` tokens of `hidden`
/// fp32 activations would not fit in three quarters of this machine's memory.
void check_calibration_memory(std::int64_t count, std::int64_t length, std::int64_t hidden);

/// Loads DIR for calibration: block linears kept in their stored float
/// precision (fp16/bf16/fp32), so the calibration forward is the original
/// model. Throws what LlamaModel::load throws.
std::unique_ptr<LlamaModel> load_for_calibration(const std::string& dir, ThreadPool& pool);

/// A BlockQuantizer that runs GPTQ on `model` (loaded with its block linears
/// in floating point; they are replaced by the quantized ones as it goes)
/// with the fp32 weights read from `store`. With `true_sequential`, q/k/v,
/// then o, then gate/up, then down are quantized in turn, each seeing inputs
/// computed with the already-quantized layers before it; otherwise all seven
/// are fitted on one pass through the unquantized block. The hidden states of
/// every calibration sequence are kept in fp32 ([count, length, hidden]).
BlockQuantizer gptq_block_quantizer(LlamaModel& model, const TensorStore& store, Calibration calibration,
                                    const GptqOptions& options, bool true_sequential, ThreadPool& pool);

}  // namespace woq
