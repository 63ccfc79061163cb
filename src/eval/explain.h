// `woq explain`: why a quantized model's output differs from the original's.
// Both generate greedily from the same prompt; the report gives the first
// generated position where they diverge, the original's top-2 probabilities
// there (a near tie means the flip is expected and harmless), the KL
// divergence at every generated position (teacher-forced on the original's
// tokens), and every block linear's quantization error: relative weight
// error ||W - W_hat|| / ||W|| and the relative error of its output on this
// very sequence's activations, ranked, with the part the weights alone cause
// when the layer quantizes its inputs to int8.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/llama.h"
#include "tokenizer/tokenizer.h"

namespace woq {

/// One candidate next token.
struct TokenProb {
  std::int32_t id = -1;
  std::string text;
  double p = 0;
};

/// A block linear's quantization error.
struct LinearError {
  std::int64_t layer = 0;
  std::string name;            ///< e.g. "mlp.down_proj"
  double weight_error = 0;     ///< ||W - W_hat||_F / ||W||_F
  double output_error = 0;     ///< ||X W^T - X W_hat^T||_F / ||X W^T||_F on this sequence's inputs X
  /// The same with the inputs unquantized (f32 activations): the weights'
  /// share of output_error when the layer runs with int8 activations; -1 when
  /// it does not (float formats, f32 activations).
  double weights_only_error = -1;
};

/// What explain() found.
struct Explanation {
  std::vector<std::int32_t> prompt_ids;
  std::vector<std::int32_t> original_ids, quantized_ids;  ///< greedy continuations
  std::string original_text, quantized_text;
  std::int64_t diverges_at = -1;  ///< first differing generated index; -1 = identical
  std::vector<TokenProb> original_top, quantized_top;  ///< top-2 of each model there (teacher-forced on the original)
  std::vector<double> kl;          ///< KL(P_orig || P_quant) at each generated position of the original's sequence
  std::vector<LinearError> layers; ///< sorted by output_error, largest first
  double near_tie_margin = 0.1;    ///< p1 - p2 below this counts as a near tie
  bool near_tie() const;
};

/// Runs both models greedily for `max_new_tokens` from `prompt` and explains
/// the difference. Both models must have the same shapes (same checkpoint).
/// Throws woq::Error for an empty prompt, a context overflow, or models of
/// different shapes.
Explanation explain(LlamaModel& original, LlamaModel& quantized, const Tokenizer& tokenizer, const std::string& prompt,
                    std::int64_t max_new_tokens);

}  // namespace woq
