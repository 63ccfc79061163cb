// llama-quantize's K-quant file types (Q2_K, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M,
// Q6_K): which ggml type each tensor of a Llama-family model gets, as
// llama.cpp's llama_tensor_get_type (src/llama-quant.cpp,
// https://github.com/ggml-org/llama.cpp, commit c392e5094) decides without an
// importance matrix and without --pure: more bits for attn_v and ffn_down in
// some layers, output in Q6_K, and a fallback type where a row length K is
// not a multiple of the 256-weight super-block.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "arch/architecture.h"
#include "formats/ggml_types.h"

namespace woq::kquant {

/// One of llama-quantize's K-quant file types.
struct Mix {
  std::string_view name;        ///< woq's --low-bit name: "q4_k_m"
  std::string_view llama_name;  ///< llama-quantize's: "Q4_K_M"
  std::uint32_t file_type;      ///< llama_ftype, written as general.file_type (LLAMA_FTYPE_MOSTLY_Q4_K_M = 15)
  GgmlType base;                ///< the type of every tensor no rule changes (llama-quantize's default_type)
};

/// Every K-quant file type, Q2_K first.
std::span<const Mix> mixes();
/// The file type named `name` ("q4_k_m", case-insensitive, or llama-quantize's "Q4_K_M"), or nullptr.
const Mix* find_mix(std::string_view name);

/// The model facts llama-quantize's rule reads.
struct MixModel {
  std::int64_t n_layer = 0;
  std::int64_t n_head = 0;
  std::int64_t n_head_kv = 0;
  /// The file has an output.weight (else token_embd doubles as it and gets its type).
  bool has_output = true;
  /// llama.cpp's architecture name ("llama", "qwen2", ...): its LLM_TYPE_70B
  /// is any 80-layer model, except that "llama" also needs grouped KV heads.
  std::string_view architecture = "llama";
  /// q/k/v are one fused attn_qkv tensor in llama.cpp's file (Phi-3): they
  /// take the type llama-quantize gives attn_qkv.
  bool fused_qkv = false;
};

/// A tensor to type: token_embd, output, or block `layer`'s linear `role`, with K = row length.
struct MixTensor {
  enum Kind { kTokenEmbd, kOutput, kBlockLinear } kind = kBlockLinear;
  LinearRole role = LinearRole::kQ;
  std::int64_t layer = 0;
  std::int64_t k = 0;
};

/// What llama-quantize writes a tensor in: `type`, which is `ruled` (the
/// rule's choice) unless K does not fit `ruled`'s blocks.
struct MixChoice {
  GgmlType type;
  GgmlType ruled;
};

/// The ggml type llama-quantize writes `t` in under file type `mix`. A K that
/// the ruled K-quant cannot hold falls back as llama-quantize does (q2_K /
/// q3_K -> iq4_nl, q4_K -> q5_0, q5_K -> q5_1, q6_K -> q8_0, then F16 when
/// K % 32 != 0; output -> q8_0, and F16 where llama-quantize gives up).
MixChoice mix_type(const Mix& mix, const MixTensor& t, const MixModel& model);

/// llama.cpp's tensor name of `t` ("blk.3.attn_v.weight").
std::string mix_tensor_name(const MixTensor& t);

}  // namespace woq::kquant
