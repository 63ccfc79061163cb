// The invariants read_model_config promises (io/hf_config.h) for the
// configs it accepts; shared by hf_config_fuzz and generation_config_fuzz.
#pragma once

#include <string>

#include "fuzz_common.h"
#include "arch/architecture.h"
#include "io/hf_config.h"

namespace woq_fuzz {

inline void check_model_config(const woq::ModelConfig& c) {
  WOQ_FUZZ_CHECK(woq::find_architecture(c.architecture) != nullptr, c.architecture);
  WOQ_FUZZ_CHECK(c.hidden_size > 0 && c.intermediate_size > 0 && c.num_hidden_layers > 0, "non-positive size");
  WOQ_FUZZ_CHECK(c.num_attention_heads > 0 && c.num_key_value_heads > 0, "non-positive head count");
  WOQ_FUZZ_CHECK(c.num_attention_heads % c.num_key_value_heads == 0, "kv heads do not divide heads");
  WOQ_FUZZ_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "head_dim " + std::to_string(c.head_dim));
  WOQ_FUZZ_CHECK(c.vocab_size > 0 && c.max_position_embeddings > 0, "vocab or positions");
  WOQ_FUZZ_CHECK(c.sliding_window >= 0, "sliding_window");
  WOQ_FUZZ_CHECK(c.sliding_layers.empty() || c.sliding_layers.size() == static_cast<std::size_t>(c.num_hidden_layers),
                 "sliding_layers has " + std::to_string(c.sliding_layers.size()) + " entries for " +
                     std::to_string(c.num_hidden_layers) + " layers");
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) WOQ_FUZZ_CHECK(c.window(l) >= 0, "window");
  WOQ_FUZZ_CHECK(c.rms_norm_eps > 0 && c.rope_theta > 1, "eps / theta");
  WOQ_FUZZ_CHECK(c.rope_scaling.factor >= 1, "rope factor");
  WOQ_FUZZ_CHECK(c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size, "bos " + std::to_string(c.bos_token_id));
  for (const auto id : c.eos_token_ids)
    WOQ_FUZZ_CHECK(id >= 0 && id < c.vocab_size, "eos " + std::to_string(id));
  // Products the loader and the KV cache compute must not overflow.
  (void)c.q_dim();
  (void)c.kv_dim();
  (void)c.context_limit();
}

}  // namespace woq_fuzz
