// The generation loop: one batched prefill of the prompt, then one token per
// decode step, streaming text as it is produced.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "generate/sampler.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// The KV cache a conversation keeps between turns (woq chat, Python's Model.chat): a generate() given it
/// prefills only the prompt tokens after the longest prefix it holds (the earlier turns, as the chat template
/// renders them again), with the bits of a cold prefill (LlamaModel::forward in any split gives the same).
struct ConversationCache {
  std::optional<KVCache> cache;       ///< of the model's context, allocated by the first turn
  std::vector<std::int32_t> tokens;  ///< the tokens whose keys and values it holds
};

struct GenerateOptions {
  std::int64_t max_new_tokens = 128;  ///< tokens generated, not counting the prompt
  SamplingParams sampling;
  /// Generation stops (without emitting the token) on any of these; empty
  /// means end_of_generation_ids().
  std::vector<std::int32_t> stop_ids;
  /// Generation also stops when the generated text contains one of these
  /// (lm-eval's `until`, OpenAI's `stop`); the text from the stop string on is
  /// neither streamed nor kept. Text that could begin a stop string is held
  /// back until it is known not to. Empty strings are ignored.
  std::vector<std::string> stop_strings;
  /// Repetition penalties over the prompt and generated ids (off by default).
  Penalties penalties;
  /// Stream the prompt's text to on_text before the generated text (as llama-cli prints it).
  bool echo_prompt = true;
  /// Continue this conversation's KV cache (and leave this turn in it); null: a cache of this call only.
  ConversationCache* conversation = nullptr;
};

struct GenerateResult {
  std::vector<std::int32_t> prompt_ids;     ///< including BOS when the tokenizer adds it
  std::vector<std::int32_t> generated_ids;  ///< excluding the stop token
  std::string text;                         ///< the generated text, cut before a stop string
  bool stopped = false;                     ///< true: hit a stop id or stop string; false: reached max_new_tokens
  std::int32_t stop_token = -1;             ///< the stop id that ended generation, if one did
  std::string stop_string;                  ///< the stop string that ended generation, if one did
  /// Generation ended because prompt + generated tokens reached the model's
  /// context, before max_new_tokens.
  bool context_full = false;
  std::int64_t cached_tokens = 0;           ///< prompt tokens the conversation's cache already held
  double prefill_seconds = 0;               ///< the prompt's forward pass (first-token latency)
  double decode_seconds = 0;                ///< every later forward pass
};

/// The tokens that end a generation: generation_config.json's eos_token_id
/// (a number or a list, e.g. Llama 3 Instruct's <|end_of_text|> and
/// <|eot_id|>) and the tokenizer's eos_token (e.g. Qwen's <|im_end|>), as
/// vLLM stops on both.
std::vector<std::int32_t> end_of_generation_ids(const ModelConfig& config, const Tokenizer& tokenizer);

/// Generates from `prompt`. `on_text` receives the text of the prompt (as the
/// tokenizer round-trips it) and then each new piece of generated text, as
/// llama.cpp prints them. Generation stops when the context is full
/// (GenerateResult::context_full). Throws woq::Error if the prompt is empty or
/// fills the whole context (with max_new_tokens > 0).
GenerateResult generate(LlamaModel& model, const Tokenizer& tokenizer, std::string_view prompt,
                        const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text);

/// The same from prompt token ids (BOS included when wanted), e.g. a prompt
/// already cut to fit the context. Throws woq::Error as above, and for an id
/// outside the vocabulary.
GenerateResult generate(LlamaModel& model, const Tokenizer& tokenizer, std::span<const std::int32_t> prompt_ids,
                        const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text);

}  // namespace woq
