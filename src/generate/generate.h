// The generation loop: one batched prefill of the prompt, then one token per
// decode step, streaming text as it is produced.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "generate/sampler.h"
#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

struct GenerateOptions {
  std::int64_t max_new_tokens = 128;  ///< tokens generated, not counting the prompt
  SamplingParams sampling;
  /// Generation stops (without emitting the token) on any of these; empty
  /// means the model's eos_token_ids.
  std::vector<std::int32_t> stop_ids;
};

struct GenerateResult {
  std::vector<std::int32_t> prompt_ids;     ///< including BOS when the tokenizer adds it
  std::vector<std::int32_t> generated_ids;  ///< excluding the stop token
  bool stopped = false;                     ///< true: hit a stop id; false: reached max_new_tokens
  std::int32_t stop_token = -1;             ///< the stop id that ended generation, when stopped
  double prefill_seconds = 0;               ///< the prompt's forward pass (first-token latency)
  double decode_seconds = 0;                ///< every later forward pass
};

/// Generates from `prompt`. `on_text` receives the text of the prompt (as the
/// tokenizer round-trips it) and then each new piece of generated text, as
/// llama.cpp prints them. Throws woq::Error if prompt + max_new_tokens exceeds
/// the model's context limit or the prompt is empty.
GenerateResult generate(LlamaModel& model, const Tokenizer& tokenizer, std::string_view prompt,
                        const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text);

}  // namespace woq
