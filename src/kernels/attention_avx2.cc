// The attention tile kernel (attention_tile.h) on AVX2 + FMA: 8 lanes. This
// file alone is compiled with -mavx2 -mfma -ffp-contract=off; it is only
// called after active_isa() found them.
#include <immintrin.h>

#include "kernels/attention_tile.h"
#include "kernels/attention_transpose8.h"

namespace woq::detail {
namespace {

struct Avx2 {
  using R = __m256;
  static constexpr std::int64_t kLanes = 8;
  static constexpr int kRegs = 16;
  static R load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, R v) { _mm256_storeu_ps(p, v); }
  static R set1(float x) { return _mm256_set1_ps(x); }
  static R fma(R a, R b, R c) { return _mm256_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm256_mul_ps(a, b); }
  static R add(R a, R b) { return _mm256_add_ps(a, b); }
  static R sub(R a, R b) { return _mm256_sub_ps(a, b); }
  static R max(R a, R b) { return _mm256_max_ps(a, b); }
  static float reduce_max(R v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
  }
  static R round(R x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static R scale_pow2(R p, R n) {
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
  }
};

template <>
void transpose_keys<Avx2>(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt) {
  transpose_keys8(k, stride, n, d, kt);
}

}  // namespace

void attention_job_avx2(const AttentionJob& job) { run_attention_job<Avx2>(job); }

}  // namespace woq::detail
