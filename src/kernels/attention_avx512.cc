// The attention tile kernel (attention_tile.h) on AVX-512F: 16 lanes. This
// file alone is compiled with AVX-512 flags and -ffp-contract=off; it is only
// called after active_isa() found them.
#include <immintrin.h>

#include "kernels/attention_tile.h"
#include "kernels/attention_transpose8.h"

namespace woq::detail {
namespace {

struct Avx512 {
  using R = __m512;
  static constexpr std::int64_t kLanes = 16;
  static constexpr int kRegs = 32;
  static R load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, R v) { _mm512_storeu_ps(p, v); }
  static R set1(float x) { return _mm512_set1_ps(x); }
  static R fma(R a, R b, R c) { return _mm512_fmadd_ps(a, b, c); }
  static R mul(R a, R b) { return _mm512_mul_ps(a, b); }
  static R add(R a, R b) { return _mm512_add_ps(a, b); }
  static R sub(R a, R b) { return _mm512_sub_ps(a, b); }
  static R max(R a, R b) { return _mm512_max_ps(a, b); }
  static float reduce_max(R v) { return _mm512_reduce_max_ps(v); }
  static R round(R x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static R scale_pow2(R p, R n) {
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    return _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
  }
};

template <>
void transpose_keys<Avx512>(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt) {
  transpose_keys8(k, stride, n, d, kt);
}

}  // namespace

void attention_job_avx512(const AttentionJob& job) { run_attention_job<Avx512>(job); }

}  // namespace woq::detail
