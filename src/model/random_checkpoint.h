// Hugging Face checkpoints with random weights in the shapes of real models,
// so speed and memory can be measured without downloading anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/hf_config.h"
#include "io/safetensors.h"

namespace woq {

class ThreadPool;

/// A named architecture: the shapes of a published model.
struct ModelPreset {
  std::string name;         ///< e.g. "llama-2-7b"
  ModelConfig config;       ///< full-size shapes
  std::string model_type;   ///< config.json model_type
};

/// llama-2-7b, llama-3-8b, mistral-7b, qwen2-7b, and "tiny" (a small
/// Llama for tests).
const std::vector<ModelPreset>& model_presets();
/// The preset called `name`; throws woq::Error listing the valid names.
const ModelPreset& find_preset(const std::string& name);

struct RandomCheckpointOptions {
  std::string preset = "llama-2-7b";
  std::int64_t layers = 0;           ///< 0 = the preset's count
  DType dtype = DType::kF16;         ///< F16, BF16 or F32
  std::uint64_t seed = 0;
  std::uint64_t max_shard_bytes = 4ull << 30;
};

/// Writes DIR/config.json, generation_config.json, tokenizer_config.json,
/// tokenizer.model (the bundled stories260K SentencePiece model: ids past its
/// 512 pieces decode as placeholders) and safetensors whose weights are
/// N(0, 0.02) (norm weights 1, biases 0), reproducible from the seed whatever
/// the thread count. Creates DIR if needed. Returns the bytes of tensors
/// written. Throws woq::Error on a bad preset, dtype or I/O failure.
std::uint64_t write_random_checkpoint(const std::string& dir, const RandomCheckpointOptions& options,
                                      ThreadPool& pool);

}  // namespace woq
