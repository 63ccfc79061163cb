// `woq quantize --format gguf`: a model (Hugging Face directory, GPTQ /
// compressed-tensors checkpoint, or GGUF) written as a GGUF file llama.cpp
// runs: llama.cpp's metadata keys and tensor names, q/k rows permuted as
// convert_hf_to_gguf.py does for llama, the tokenizer embedded
// (tokenizer.ggml.*), and the decoder blocks' linear layers in Q4_0, Q8_0,
// F16, BF16 or F32.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_pool.h"
#include "formats/kquant_mix.h"
#include "formats/low_bit.h"
#include "model/quant_plan.h"

namespace woq {

struct GgufExportOptions {
  /// sym_int4 -> Q4_0, sym_int8 -> Q8_0 (group 32, full range), q4_1, q5_1, fp16, bf16 or fp32.
  LowBit type = LowBit::kSymInt4;
  /// A llama-quantize K-quant file type (Q4_K_M, ...): when set, every tensor's
  /// type comes from its rule (kquant::mix_type) and `type` is not read.
  const kquant::Mix* mix = nullptr;
  /// A quantization plan (model/quant_plan.h): when set, each block linear
  /// (and output, if the plan names lm_head) is written in the ggml type of its
  /// planned format: sym_int4 g32 full range -> Q4_0, sym_int8 g32 -> Q8_0,
  /// the K-quants, fp16 / bf16 / fp32; any other format is refused naming the
  /// tensor. `type` is not read.
  std::shared_ptr<const QuantPlan> plan = nullptr;
  Rounding rounding = Rounding::kWoq;  ///< woq (the blocks equal woq's in-memory sym_int4/sym_int8 g32) or ggml (llama-quantize's bytes)
  bool force = false;  ///< replace an existing output file
  /// Receives one line per decoder block written.
  std::function<void(const std::string&)> progress;
};

struct GgufExportReport {
  std::uint64_t bytes_before = 0;  ///< tensor bytes of the input
  std::uint64_t bytes_after = 0;   ///< tensor bytes written
  std::int64_t matrices = 0;       ///< block linear layers written
  /// How many block linears each ggml type holds ("q4_K", 12), in order of first use.
  std::vector<std::pair<std::string, std::int64_t>> linear_types;
  double seconds = 0;
  /// What was not stored as asked, and why (K not a multiple of 32 -> F16,
  /// a GPTQ input re-quantized, a sliding window llama.cpp ignores, ...).
  std::vector<std::string> notes;
};

/// Writes the model at `in` (what TensorStore::open and read_model_config
/// read) to the GGUF file `out`. Linear layers of the decoder blocks become
/// options.type; a K that Q4_0/Q8_0 blocks cannot hold (not a multiple of
/// 32) is written F16 with a note, as llama.cpp falls back. Norms, biases and
/// rope_freqs are F32; token_embd and output keep a GGUF input's type, else
/// F16 for integer targets and the target type for float ones. The tokenizer
/// comes from the input (copied keys for a GGUF, see write_gguf_vocab
/// otherwise). Written to a temporary file and renamed (GgufWriter). Throws
/// woq::Error when out exists (unless options.force) or is the input, for a
/// type other than the five, and for the loaders' errors.
GgufExportReport export_gguf(const std::string& in, const std::string& out, const GgufExportOptions& options,
                             ThreadPool& pool);

/// llama_ftype of a file whose linear layers are `type` (general.file_type:
/// ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q8_0 7, MOSTLY_BF16 32).
std::uint32_t gguf_file_type(LowBit type);

}  // namespace woq
