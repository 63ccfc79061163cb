// Choosing the next token from logits: greedy, or temperature with top-k
// and top-p (nucleus, Holtzman et al. 2019) filtering.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <utility>

namespace woq {

/// Sampling settings. temperature <= 0 means greedy (argmax).
struct SamplingParams {
  float temperature = 0.8f;
  std::int32_t top_k = 40;  ///< keep the k most likely tokens; <= 0 keeps all
  float top_p = 0.95f;      ///< keep the smallest set with probability >= top_p; >= 1 keeps all
  std::uint64_t seed = 0;
};

/// Throws woq::Error when top_p is not in (0, 1], top_k is negative or
/// temperature is negative or NaN.
void validate(const SamplingParams& params);

/// A seeded sampler; the same seed and logits give the same tokens on any machine.
class Sampler {
 public:
  /// Throws as validate() does.
  explicit Sampler(const SamplingParams& params);

  /// Picks a token id from logits[0, vocab). Ties in greedy mode go to the lowest id.
  std::int32_t sample(std::span<const float> logits);

 private:
  double uniform();  ///< in [0, 1), from 53 random bits

  SamplingParams params_;
  std::mt19937_64 rng_;
};

/// OpenAI's presence and frequency penalties: logits[t] -= presence · [count_t > 0]
/// + frequency · count_t, for each token t generated so far (`counts` holds
/// (token, count) pairs with ids inside logits).
void apply_penalties(std::span<float> logits, std::span<const std::pair<std::int32_t, std::int32_t>> counts,
                     float presence, float frequency);

/// llama.cpp's repetition penalties (llama-cli --repeat-penalty, --repeat-last-n,
/// --presence-penalty, --frequency-penalty), applied to the tokens of a window
/// of recent ids (the prompt's included, as llama-cli counts them).
struct Penalties {
  float repeat = 1.0f;         ///< each token in the window: logit > 0 divided by it, else multiplied; 1 = off
  std::int64_t last_n = 64;    ///< the window: this many most recent ids; 0 = none; -1 = all (llama.cpp's -1)
  float presence = 0.0f;       ///< subtracted once from each token in the window
  float frequency = 0.0f;      ///< subtracted per occurrence in the window
  bool active() const { return last_n != 0 && (repeat != 1.0f || presence != 0.0f || frequency != 0.0f); }
};

/// Throws woq::Error when repeat is outside [0.001, 1000], last_n < -1, or
/// presence / frequency outside [-1000, 1000] (bounds that keep logits finite).
void validate(const Penalties& penalties);

/// Applies `penalties` to logits[0, vocab) for the last `penalties.last_n`
/// ids of `history` (ids outside the logits are ignored).
void apply_penalties(std::span<float> logits, std::span<const std::int32_t> history, const Penalties& penalties);

/// Index of the largest logit (lowest index on ties).
std::int32_t argmax(std::span<const float> logits);

}  // namespace woq
