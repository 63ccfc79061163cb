// GPTQ over a whole model, block by block (as AutoGPTQ does): calibration
// sequences run through the decoder one block at a time; each block's linear
// layers are quantized from the Hessians of the inputs that reach them, and
// the next block sees the outputs of this block after it was quantized.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "quantize/gptq.h"
#include "quantize/quantize_checkpoint.h"
#include "quantize/resume.h"
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

/// What GPTQ holds in memory at its peak, in bytes (gptq_block_quantizer streams the decoder blocks, so none of
/// this grows with the number of layers).
struct GptqMemory {
  std::uint64_t resident = 0;       ///< what stays loaded: embeddings, lm_head, norms (LoadReport::other_bytes)
  std::uint64_t block_weights = 0;  ///< one decoder block's seven linears in fp32
  std::uint64_t activations = 0;    ///< the hidden states of every calibration sequence, and one sequence's forward
  std::uint64_t hessians = 0;       ///< X^T X sums of one block's inputs, the f64 matrix and factor, GPTQ's f64 weights
  std::uint64_t total() const { return resident + block_weights + activations + hessians; }
};

/// The peak for `count` sequences of `length` tokens on a model of `config`
/// with `resident_bytes` loaded outside the blocks.
GptqMemory gptq_memory(const ModelConfig& config, std::int64_t count, std::int64_t length,
                       std::uint64_t resident_bytes);

/// Throws woq::Error, saying the parts and suggesting fewer or shorter
/// sequences, when `memory` exceeds 90 % of available_memory_bytes()
/// (core/memory.h; no check when that is unknown).
void check_gptq_memory(const GptqMemory& memory, std::int64_t count, std::int64_t length);

/// Loads DIR for calibration without the decoder blocks' linear layers
/// (LoadOptions::block_linears false): embeddings, norms, lm_head.
/// Throws what LlamaModel::load throws.
std::unique_ptr<LlamaModel> load_for_calibration(const std::string& dir, ThreadPool& pool, LoadReport* report = nullptr);

/// Reads block linear `role` of `layer` from `store` into `out` as fp32
/// [rows, cols] (its pages released after); with `values` false only sizes
/// `out`. Returns the tensor. Throws woq::Error naming the tensor for a shape
/// other than the config's, a non-float dtype, or a NaN/Inf (row and column).
const TensorView& read_float_linear(const TensorStore& store, const ModelConfig& c, std::int64_t layer, LinearRole role,
                                   std::vector<float>& out, bool values = true);

/// Seconds one decoder block took, by part.
struct GptqTimes {
  std::int64_t layer = 0;
  double read = 0;     ///< its weights from the checkpoint to fp32
  double forward = 0;  ///< calibration forwards through it (sgemm), before and after quantizing
  double hessian = 0;  ///< X^T X (ssyrk)
  double solve = 0;    ///< damping, inverse Cholesky and the GPTQ column updates, dequantizing the result
  double save = 0;     ///< the finished block's integers into the --resume directory
};

/// A BlockQuantizer that runs GPTQ on `model` (from load_for_calibration),
/// streaming each block's weights from `store` in fp32 (checked against the
/// config's shapes, pages released after reading) and dropping them when the
/// block is done. The block's linears are computed by OpenBLAS sgemm
/// (LlamaModel::forward_block's `compute`); once a linear is quantized, its
/// dequantized values replace it (as AutoGPTQ runs the fake-quantized layer),
/// so later linears and the next block see the block as it will run. With
/// `true_sequential`, q/k/v, then o, then gate/up, then down are quantized in
/// turn, each on inputs through the already-quantized ones; otherwise all
/// seven are fitted on one pass through the unquantized block. The hidden
/// states of every calibration sequence are kept in fp32 ([count, length,
/// hidden]). `on_layer` (optional) receives each block's times. With
/// `resume`, each finished block is saved there, and the blocks it already
/// holds are read back instead of quantized (the calibration states still run
/// through them, as they did when they were made, so the later blocks come out
/// the same as in an uninterrupted run).
BlockQuantizer gptq_block_quantizer(LlamaModel& model, const TensorStore& store, Calibration calibration,
                                    const GptqOptions& options, bool true_sequential, ThreadPool& pool,
                                    const std::function<void(const GptqTimes&)>& on_layer = nullptr,
                                    ResumeDir* resume = nullptr);

}  // namespace woq
