// Hugging Face checkpoints with random weights in the shapes of real models,
// so speed and memory can be measured without downloading anything.
#pragma once

#include <cstdint>
#include <functional>
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
  /// The tokenizer written with it: "stories" (the bundled 512-piece
  /// SentencePiece model, built in) or a folder of assets/tokenizers
  /// ("llama2", "llama3", "qwen3").
  std::string tokenizer = "stories";
  /// A chat template file in that folder for tokenizer_config.json (for
  /// tokenizers that carry none); empty: none or the folder's own.
  std::string chat_template;
};

/// Real shapes: llama-2-7b, llama-3-8b, mistral-7b (v0.1: sliding window
/// 4096), qwen2-7b, qwen3-8b, with their own tokenizers (mistral-7b takes
/// Llama 2's 32000-piece SentencePiece model, of the same size as its own).
/// For tests: "tiny" (Llama 2 style, the bundled tokenizer), "small" (8
/// blocks of hidden 1024 and intermediate 2816, GQA 16/4, the bundled
/// tokenizer: decoder blocks that dominate memory), and hidden-64
/// models with their family's real tokenizer and vocabulary in which every
/// architecture feature is on: "tiny-llama3" (llama3 rope scaling, tied
/// embeddings, attention_bias on q/k/v/o), "tiny-mistral" (sliding window
/// 16), "tiny-qwen2" (q/k/v biases, linear rope scaling, a sliding window from
/// layer 1), "tiny-qwen3" (q/k norms, head_dim 32, tied embeddings).
const std::vector<ModelPreset>& model_presets();
/// The preset called `name`; throws woq::Error listing the valid names.
const ModelPreset& find_preset(const std::string& name);

struct RandomCheckpointOptions {
  std::string preset = "llama-2-7b";
  std::int64_t layers = 0;           ///< 0 = the preset's count
  DType dtype = DType::kF16;         ///< F16, BF16 or F32
  std::uint64_t seed = 0;
  std::uint64_t max_shard_bytes = 4ull << 30;
  double weight_std = 0.02;          ///< embeddings, linear layers and lm_head: N(0, weight_std)
  /// Where the preset's tokenizer folder is (assets/tokenizers); empty: the
  /// repository's, as configured at build time.
  std::string tokenizer_root;
  /// Called after each tensor is filled with (tensors done, tensors in all); may be empty.
  std::function<void(std::int64_t, std::int64_t)> progress;
};

/// Writes DIR/config.json, generation_config.json, the preset's tokenizer
/// (write_preset_tokenizer) and safetensors whose weights are
/// N(0, weight_std), biases N(0, 0.5), q/k norm weights 1 + N(0, 0.3) and the
/// other norm weights 1, reproducible from the seed whatever the thread
/// count. Creates DIR if needed. Returns the bytes of tensors written. Throws
/// woq::Error on a bad preset, dtype, missing tokenizer files or I/O failure.
std::uint64_t write_random_checkpoint(const std::string& dir, const RandomCheckpointOptions& options,
                                      ThreadPool& pool);

/// Writes the tokenizer files of `preset` into DIR: tokenizer.json and
/// tokenizer_config.json (llama3, with the TemplateProcessing post-processor
/// of Meta's current file, which adds <|begin_of_text|>; qwen3 as is), or
/// tokenizer.model with a LlamaTokenizer tokenizer_config.json (stories,
/// llama2, with the preset's chat template). `tokenizer_root` as in
/// RandomCheckpointOptions. Throws woq::Error
/// when the source files are missing or a write fails.
void write_preset_tokenizer(const ModelPreset& preset, const std::string& dir, const std::string& tokenizer_root = {});

}  // namespace woq
