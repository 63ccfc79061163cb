// The attention tile kernel (attention_tile.h) and llama.cpp's rounding
// (ggml_numerics_tile.h) on AVX2 + FMA: 8 lanes. This
// file alone is compiled with -mavx2 -mfma -ffp-contract=off; it is only
// called after active_isa() found them.
#include <immintrin.h>

#include "kernels/attention_tile.h"
#include "kernels/attention_transpose8.h"
#include "kernels/ggml_numerics_tile.h"

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

/// ggml_numerics_tile.h's policy: ggml_v_expf of ggml's AVX2 build on 8 lanes (ggml_expf8's steps in
/// vector form).
struct GgmlAvx2 : Avx2 {
  static void exp(const float* in, float* out) {
    const __m256 x = _mm256_loadu_ps(in);
    const __m256 r = _mm256_set1_ps(0x1.8p23f);
    const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
    const __m256 n = _mm256_sub_ps(z, r);
    const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                      _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
    const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
    const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
    const __m256 abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), n);
    const __m256 c = _mm256_cmp_ps(abs_n, _mm256_set1_ps(126), _CMP_GT_OQ);
    const __m256 u = _mm256_mul_ps(b, b);
    const __m256 j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                        _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
        u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
    if (_mm256_movemask_ps(c) == 0) {
      _mm256_storeu_ps(out, _mm256_fmadd_ps(j, k, k));
      return;
    }
    const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                       _mm256_set1_epi32(static_cast<int>(0x82000000u)));
    const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
    const __m256 d = _mm256_cmp_ps(abs_n, _mm256_set1_ps(192), _CMP_GT_OQ);
    const __m256 within = _mm256_or_ps(_mm256_and_ps(c, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                       _mm256_andnot_ps(c, _mm256_fmadd_ps(k, j, k)));
    _mm256_storeu_ps(out, _mm256_or_ps(_mm256_and_ps(d, _mm256_mul_ps(s1, s1)), _mm256_andnot_ps(d, within)));
  }
  static void transpose(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt) {
    transpose_keys8(k, stride, n, d, kt);
  }
};

}  // namespace

void attention_job_avx2(const AttentionJob& job) { run_attention_job<Avx2>(job); }

const GgmlKernels kGgmlAvx2 = {ggml_attention_items<GgmlAvx2>, ggml_attention_jobs<GgmlAvx2>, ggml_silu_rows<GgmlAvx2>};

}  // namespace woq::detail
