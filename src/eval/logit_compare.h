// Comparing a candidate model's next-token distributions with a reference's
// on the same tokens (the statistics llama-perplexity --kl-divergence prints).
#pragma once

#include <cstdint>
#include <span>

namespace woq {

struct LogitAgreement {
  std::int64_t positions = 0;
  double top1_agreement = 0;  ///< fraction of positions whose argmax tokens are equal
  double mean_kl = 0;         ///< mean KL(P_ref || P_cand) in nats
  double max_kl = 0;
};

/// Compares ref and cand logits, both [positions, vocab] row-major.
/// KL divergences are computed from log-softmax in double.
LogitAgreement compare_logits(std::span<const float> ref, std::span<const float> cand,
                              std::int64_t vocab);

}  // namespace woq
