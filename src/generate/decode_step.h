// What happens to one sequence's logits between forward passes: penalties,
// sampling, the stop tokens, streaming detokenization and stop strings. One
// implementation for `woq generate`, `woq chat`, Python and the server.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "generate/sampler.h"
#include "generate/stop_strings.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// The choices of one sequence's decoding.
struct DecodeOptions {
  SamplingParams sampling;
  /// llama.cpp's penalties (llama-cli, llama-server's repeat_penalty / repeat_last_n): over a window of the
  /// last `last_n` ids, the prompt's included.
  Penalties penalties;
  /// OpenAI's presence_penalty / frequency_penalty: over the generated ids only, after `penalties`.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  /// Ids that end the sequence (not emitted): end_of_generation_ids() or the caller's.
  std::vector<std::int32_t> stop_ids;
  /// Text that ends it (StopStringFilter): the text from the stop string on is never emitted.
  std::vector<std::string> stop_strings;
};

/// One sequence's decoding: next() turns the logits of its last position into
/// the chosen id and the text it completes. Throws woq::Error (constructor)
/// for invalid sampling parameters, penalties (validate) or stop strings.
class DecodeStep {
 public:
  /// Decoding after `prompt` (its ids are the window's start and the
  /// detokenizer's context: the first piece keeps its leading space).
  DecodeStep(const Tokenizer& tokenizer, DecodeOptions options, std::span<const std::int32_t> prompt);

  /// What next() chose.
  struct Token {
    std::int32_t id;
    bool stop_id;      ///< one of stop_ids: the sequence ends, nothing is emitted
    std::string text;  ///< the text now safe to emit (held back while it could begin a stop string)
  };
  /// Applies the penalties to a copy of `logits` (the vocabulary's), samples,
  /// and unless the id stops the sequence, records it (window, counts) and
  /// detokenizes it through the stop strings. Then stopped_by_string() may be true.
  Token next(std::span<const float> logits);
  /// The text held back when the sequence ends otherwise (length, context):
  /// an incomplete UTF-8 sequence as is, then what the stop strings held.
  /// Call once, unless stopped_by_string().
  std::string finish();

  bool stopped_by_string() const { return filter_.stopped(); }
  /// The stop string that ended the text, if stopped_by_string().
  const std::string& stop_string() const { return filter_.matched(); }
  std::int64_t generated() const { return generated_; }

 private:
  DecodeOptions options_;
  Sampler sampler_;
  TextStream stream_;
  StopStringFilter filter_;
  std::vector<std::int32_t> window_;                          ///< prompt and generated ids, for `penalties`
  std::vector<std::pair<std::int32_t, std::int32_t>> counts_;  ///< (id, times generated), for OpenAI's
  std::vector<std::size_t> count_at_;                          ///< index into counts_ by id + 1; 0 = none yet
  std::vector<float> penalized_;
  std::int64_t generated_ = 0;
};

}  // namespace woq
