#include "formats/kquant_mix.h"

#include <array>
#include <cctype>

#include <fmt/format.h>


namespace woq::kquant {
namespace {

using T = GgmlType;

constexpr std::array<Mix, 9> kMixes{{
    {"q2_k", "Q2_K", 10, T::kQ2_K},
    {"q3_k_s", "Q3_K_S", 11, T::kQ3_K},
    {"q3_k_m", "Q3_K_M", 12, T::kQ3_K},
    {"q3_k_l", "Q3_K_L", 13, T::kQ3_K},
    {"q4_k_s", "Q4_K_S", 14, T::kQ4_K},
    {"q4_k_m", "Q4_K_M", 15, T::kQ4_K},
    {"q5_k_s", "Q5_K_S", 16, T::kQ5_K},
    {"q5_k_m", "Q5_K_M", 17, T::kQ5_K},
    {"q6_k", "Q6_K", 18, T::kQ6_K},
}};

bool is(const Mix& m, std::string_view llama_name) { return m.llama_name == llama_name; }

// llama-quant.cpp's use_more_bits: the first and last eighth of the layers, and every third one between.
bool use_more_bits(std::int64_t i, std::int64_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

// The type before the K check: llama_tensor_get_type's rules for the K-quant
// file types of a dense (not mixture-of-experts, not Falcon) model.
GgmlType ruled_type(const Mix& mix, const MixTensor& t, const MixModel& m) {
  GgmlType type = mix.base;
  const bool output = t.kind == MixTensor::kOutput || (t.kind == MixTensor::kTokenEmbd && !m.has_output);
  if (output) return t.k % 256 != 0 ? T::kQ8_0 : T::kQ6_K;
  if (t.kind == MixTensor::kTokenEmbd) return type;
  const std::int64_t i = t.layer, n = m.n_layer;
  if (m.fused_qkv && (t.role == LinearRole::kQ || t.role == LinearRole::kK || t.role == LinearRole::kV)) {
    if (is(mix, "Q3_K_M") || is(mix, "Q3_K_L")) return T::kQ4_K;
    if (is(mix, "Q4_K_M")) return T::kQ5_K;
    if (is(mix, "Q5_K_M")) return T::kQ6_K;
    return type;
  }
  switch (t.role) {
    case LinearRole::kV: {
      const std::int64_t n_gqa = m.n_head_kv > 0 ? m.n_head / m.n_head_kv : 0;
      if (is(mix, "Q2_K")) type = n_gqa >= 4 ? T::kQ4_K : T::kQ3_K;
      else if (is(mix, "Q3_K_M")) type = i < 2 ? T::kQ5_K : T::kQ4_K;
      else if (is(mix, "Q3_K_L")) type = T::kQ5_K;
      else if ((is(mix, "Q4_K_M") || is(mix, "Q5_K_M")) && use_more_bits(i, n)) type = T::kQ6_K;
      else if (is(mix, "Q4_K_S") && i < 4) type = T::kQ5_K;
      // llama.cpp's LLM_TYPE_70B (80 layers; a llama one with grouped KV heads): attn_v is 8x smaller, so more bits.
      const bool is_70b = n == 80 && (m.architecture != "llama" || m.n_head != m.n_head_kv);
      if (is_70b && (type == T::kQ3_K || type == T::kQ4_K)) type = T::kQ5_K;
      return type;
    }
    case LinearRole::kDown:
      if (is(mix, "Q2_K")) return T::kQ3_K;
      if (is(mix, "Q3_K_M")) return i < n / 16 ? T::kQ5_K : T::kQ4_K;
      if (is(mix, "Q3_K_L")) return T::kQ5_K;
      if ((is(mix, "Q4_K_M") || is(mix, "Q5_K_M")) && use_more_bits(i, n)) return T::kQ6_K;
      if (is(mix, "Q4_K_S") && i < n / 8) return T::kQ5_K;
      return type;
    case LinearRole::kO:
      if (is(mix, "Q2_K")) return T::kQ3_K;
      if (is(mix, "Q3_K_M")) return T::kQ4_K;
      if (is(mix, "Q3_K_L")) return T::kQ5_K;
      return type;
    default: return type;
  }
}

}  // namespace

std::string mix_tensor_name(const MixTensor& t) {
  if (t.kind == MixTensor::kTokenEmbd) return "token_embd.weight";
  if (t.kind == MixTensor::kOutput) return "output.weight";
  return fmt::format("blk.{}.{}.weight", t.layer, linear_spec(t.role).gguf);
}

std::span<const Mix> mixes() { return kMixes; }

const Mix* find_mix(std::string_view name) {
  for (const Mix& m : kMixes) {
    if (name.size() != m.name.size()) continue;
    bool same = true;
    for (std::size_t i = 0; i < name.size() && same; ++i)
      same = std::tolower(static_cast<unsigned char>(name[i])) == m.name[i];
    if (same) return &m;
  }
  return nullptr;
}

MixChoice mix_type(const Mix& mix, const MixTensor& t, const MixModel& model) {
  const GgmlType type = ruled_type(mix, t, model);
  const GgmlTypeTraits& traits = ggml_type_traits(type);
  if (t.k % traits.block_size == 0) return {type, type};
  GgmlType to = GgmlType::kF16;
  switch (type) {
    case T::kQ4_K: to = T::kQ5_0; break;
    case T::kQ5_K: to = T::kQ5_1; break;
    case T::kQ6_K: to = T::kQ8_0; break;
    case T::kQ2_K:
    case T::kQ3_K: to = T::kIQ4_NL; break;
    default: break;  // q8_0: llama-quantize stops here ("Unsupported tensor size"); woq writes F16
  }
  if (t.k % ggml_type_traits(to).block_size != 0) to = GgmlType::kF16;
  return {to, type};
}

}  // namespace woq::kquant
