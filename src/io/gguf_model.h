// What a GGUF file means to woq: its metadata as a ModelConfig, its tensor
// names mapped to the Hugging Face names woq's loader uses (one table, both
// ways), and llama.cpp's Q/K row order undone. Keys and names follow
// llama.cpp's gguf-py/gguf/constants.py and convert_hf_to_gguf.py.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "io/gguf.h"
#include "io/hf_config.h"
#include "io/safetensors.h"

namespace woq {

/// The ModelConfig of a GGUF model (`parts` from open_gguf; metadata from the first).
/// general.architecture "llama" (Llama 2/3, Mistral), "qwen2" or "qwen3";
/// sizes from ARCH.context_length, embedding_length, feed_forward_length,
/// block_count, attention.head_count(_kv), attention.key_length,
/// attention.layer_norm_rms_epsilon, rope.freq_base, rope.scaling.* and the
/// rope_freqs tensor; vocab_size from token_embd's rows; tied embeddings when
/// there is no output.weight; biases as the tensors show (llama with
/// attention_bias); BOS/EOS from tokenizer.ggml.*. The result passes the
/// same range checks as read_model_config. Throws woq::Error naming the file
/// and key for an architecture woq lacks, a mixture of experts
/// (ARCH.expert_count > 0), a missing or mistyped key, per-layer arrays where
/// woq needs one value, partial rotary (rope.dimension_count != head_dim),
/// rope scaling other than none/linear, or out-of-range values.
ModelConfig gguf_model_config(const std::vector<GgufFile>& parts);

/// The Hugging Face name of GGUF tensor `name` ("blk.3.attn_q.weight" ->
/// "model.layers.3.self_attn.q_proj.weight"), or nullopt for a name outside
/// the table (rope_freqs.weight, which the config consumes, is outside too).
std::optional<std::string> hf_tensor_name(std::string_view gguf_name);
/// The GGUF name of Hugging Face tensor `name`, or nullopt.
std::optional<std::string> gguf_tensor_name(std::string_view hf_name);

/// The tensors of the GGUF model `path` (open_gguf) under their Hugging Face
/// names, each view keeping its GGUF name (messages say 'blk.0.attn_q.weight'),
/// shapes in row-major order (GGUF's ne reversed), F32/F16/BF16 as those
/// dtypes and every other type as DType::kGgml; q/k rows of architectures
/// llama.cpp permutes carry the row_order that undoes it. Throws woq::Error
/// naming the tensor for a name outside the table (fused or unknown tensors)
/// and for the errors of open_gguf and gguf_model_config.
std::unique_ptr<TensorSource> open_gguf_tensors(const std::string& path);

/// For a q (n_head = num_attention_heads) or k (num_key_value_heads)
/// projection of `rows` = n_head * head_dim rows: element r is the GGUF row
/// that holds Hugging Face row r. GGUF row h*head_dim + 2*i + j holds HF row
/// h*head_dim + j*head_dim/2 + i (j in {0, 1}), i.e. llama.cpp interleaves
/// the two rotary halves of each head. Throws woq::Error unless rows is a
/// positive multiple of n_head with an even quotient.
std::vector<std::int64_t> gguf_qk_row_order(std::int64_t rows, std::int64_t n_head);

}  // namespace woq
