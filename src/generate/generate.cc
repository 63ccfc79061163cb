#include "generate/generate.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "generate/decode_step.h"

namespace woq {

std::vector<std::int32_t> end_of_generation_ids(const ModelConfig& config, const Tokenizer& tokenizer) {
  std::vector<std::int32_t> ids;
  for (const auto id : config.eos_token_ids) ids.push_back(static_cast<std::int32_t>(id));
  const std::int32_t eos = tokenizer.eos_id();
  if (eos >= 0 && std::find(ids.begin(), ids.end(), eos) == ids.end()) ids.push_back(eos);
  return ids;
}

GenerateResult generate(LlamaModel& model, const Tokenizer& tokenizer, std::string_view prompt,
                        const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text) {
  const std::vector<std::int32_t> ids = tokenizer.encode(prompt);
  if (ids.empty()) fail("the prompt is empty and the tokenizer adds no BOS");
  return generate(model, tokenizer, ids, options, on_text);
}

GenerateResult generate(LlamaModel& model, const Tokenizer& tokenizer, std::span<const std::int32_t> prompt_ids,
                        const GenerateOptions& options,
                        const std::function<void(std::string_view)>& on_text) {
  using Clock = std::chrono::steady_clock;
  GenerateResult result;
  result.prompt_ids.assign(prompt_ids.begin(), prompt_ids.end());
  if (result.prompt_ids.empty()) fail("the prompt has no tokens");
  const auto prompt_len = static_cast<std::int64_t>(result.prompt_ids.size());
  if (options.max_new_tokens < 0) fail("the number of tokens to generate must be >= 0");
  if (tokenizer.vocab_size() > model.config().vocab_size)
    fail("the tokenizer has {} pieces but config.json vocab_size is {}: they do not belong together",
         tokenizer.vocab_size(), model.config().vocab_size);
  const std::int64_t context = model.context_limit();
  if (options.max_new_tokens > 0 && prompt_len >= context)
    fail("the prompt ({} tokens) fills the model's context of {} tokens: no room to generate", prompt_len, context);
  // As llama.cpp: generation stops where the context is full (the result says so) rather than refusing.
  const std::int64_t max_new = std::min(options.max_new_tokens, context - prompt_len);
  const std::int64_t needed = prompt_len + max_new;

  DecodeOptions decode;
  decode.sampling = options.sampling;
  decode.penalties = options.penalties;
  decode.stop_ids = options.stop_ids.empty() ? end_of_generation_ids(model.config(), tokenizer) : options.stop_ids;
  decode.stop_strings = options.stop_strings;
  DecodeStep step(tokenizer, std::move(decode), result.prompt_ids);
  if (options.echo_prompt) {  // the prompt's text as the tokenizer round-trips it, BOS left out
    TextStream echo(tokenizer);
    const bool skip_bos = tokenizer.add_bos() && result.prompt_ids.front() == tokenizer.bos_id();
    for (std::size_t i = skip_bos ? 1 : 0; i < result.prompt_ids.size(); ++i) on_text(echo.push(result.prompt_ids[i]));
    on_text(echo.flush());
  }
  const auto emit = [&](const std::string& text) {
    result.text += text;
    on_text(text);
  };
  if (options.max_new_tokens == 0) return result;

  std::optional<KVCache> own;
  ConversationCache* conv = options.conversation;
  if (conv && !conv->cache) conv->cache.emplace(model.make_cache(context));
  KVCache& cache = conv ? *conv->cache : own.emplace(model.make_cache(needed));
  if (conv) {  // keep what this prompt starts with (at least one token to prefill for the logits)
    const auto held = std::mismatch(conv->tokens.begin(), conv->tokens.end(), result.prompt_ids.begin(),
                                    result.prompt_ids.end() - 1).first;
    result.cached_tokens = held - conv->tokens.begin();
    cache.truncate(result.cached_tokens);
    conv->tokens.resize(static_cast<std::size_t>(result.cached_tokens));
  }
  std::vector<float> logits;
  auto t0 = Clock::now();
  model.forward(std::span(result.prompt_ids).subspan(static_cast<std::size_t>(result.cached_tokens)), cache,
                /*all_logits=*/false, logits);
  if (conv) conv->tokens = result.prompt_ids;
  result.prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  t0 = Clock::now();
  for (;;) {
    const DecodeStep::Token next = step.next(logits);
    if (next.stop_id) {
      result.stopped = true;
      result.stop_token = next.id;
      break;
    }
    result.generated_ids.push_back(next.id);
    emit(next.text);
    if (step.stopped_by_string()) break;
    if (static_cast<std::int64_t>(result.generated_ids.size()) >= max_new) {
      result.context_full = max_new < options.max_new_tokens;
      break;
    }
    model.forward(std::span(&next.id, 1), cache, false, logits);
    if (conv) conv->tokens.push_back(next.id);
  }
  result.decode_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!step.stopped_by_string()) emit(step.finish());
  if (step.stopped_by_string()) {
    result.stopped = true;
    result.stop_string = step.stop_string();
  }
  return result;
}

}  // namespace woq
