// The OpenAI API's request and response bodies for /v1/completions and
// /v1/chat/completions (https://platform.openai.com/docs/api-reference),
// without the transport: parsing with validation into what the engine needs,
// and building responses, stream chunks and errors.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "generate/sampler.h"
#include "server/engine.h"
#include "server/request_fields.h"
#include "tokenizer/tokenizer.h"

namespace woq::server {

/// One completions prompt: text, or token ids (checked against the
/// vocabulary by the server, naming `param`).
struct PromptInput {
  std::string text;
  std::optional<std::vector<std::int32_t>> ids;
  std::string param;  ///< "prompt", "prompt[3]": where it was in the request
};

/// Most prompts one completions request may batch.
inline constexpr std::size_t kMaxBatchPrompts = 256;

/// A validated request.
struct ApiRequest {
  bool chat = false;
  std::string model;                     ///< as sent (checked against the served name)
  /// completions: the prompts, one choice each (`index` in this order): one
  /// for a string or a list of token ids, several for a batch (a list of
  /// strings or of token-id lists; at most kMaxBatchPrompts).
  std::vector<PromptInput> prompts;
  /// completions: answer with the prompt before the completion, and with
  /// logprobs, the prompt tokens' log-probabilities (the first null).
  bool echo = false;
  nlohmann::ordered_json messages;       ///< chat: [{"role", "content": string}], content parts joined
  /// chat: extra variables for the chat template (vLLM's chat_template_kwargs,
  /// e.g. {"enable_thinking": false} for Qwen3); an object, possibly empty.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  std::int64_t max_tokens = -1;          ///< -1: until the context is full
  SamplingParams sampling;
  std::vector<std::string> stop;
  float presence_penalty = 0, frequency_penalty = 0;
  /// llama.cpp's `repeat_penalty` over the last `repeat_last_n` tokens (-1: all), or vLLM's
  /// `repetition_penalty` over all of them (prompt and generated); off by default.
  Penalties penalties;
  bool logprobs = false;
  int top_logprobs = 0;
  bool stream = false;
  bool include_usage = false;            ///< stream_options.include_usage
};

/// Parses a request body. `served_model` is the name /v1/models lists; a
/// different "model" is a 404. Throws ApiError (400) naming the field for
/// malformed JSON, wrong types, values out of range, n != 1 and bodies over the budgets of request_fields.h.
ApiRequest parse_request(const std::string& body, bool chat, const std::string& served_model);

/// What a finished (or streaming) generation produced, for the response.
struct Generated {
  /// echo: the prompt's text (as sent, or its ids decoded), ids and scores (FinishEvent::prompt).
  std::string prompt_text;
  std::vector<std::int32_t> prompt_ids;
  std::vector<TokenEvent> prompt_logprobs;
  std::string text;
  std::vector<TokenEvent> tokens;  ///< kept when logprobs were asked for
  std::string finish_reason;       ///< "stop" or "length"
  std::int64_t prompt_tokens = 0, completion_tokens = 0;
  std::int64_t cached_tokens = 0;  ///< prompt tokens the prefix cache gave (usage.prompt_tokens_details)
};

/// The non-streaming response body: one choice per generation (one per
/// prompt of a batch, `index` in order), usage summed over them.
nlohmann::ordered_json response_body(const ApiRequest& r, const std::string& id, std::int64_t created,
                                     const std::string& model, const std::vector<Generated>& gs,
                                     const Tokenizer& tokenizer);

/// One streamed chunk: `text` (possibly with the role first, for chat) and,
/// for the last one, finish_reason; `tokens` carries logprobs when asked for.
nlohmann::ordered_json chunk_body(const ApiRequest& r, const std::string& id, std::int64_t created,
                                  const std::string& model, const std::string& text, const std::vector<TokenEvent>& tokens,
                                  const std::string& finish_reason, bool first, const Tokenizer& tokenizer);

/// The last chunk of stream_options.include_usage: empty choices and the usage.
nlohmann::ordered_json usage_chunk(const ApiRequest& r, const std::string& id, std::int64_t created,
                                   const std::string& model, const Generated& g);

}  // namespace woq::server
