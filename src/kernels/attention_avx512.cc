// The attention tile kernel (attention_tile.h) and llama.cpp's rounding
// (ggml_numerics_tile.h) on AVX-512F: 16 lanes. This
// file alone is compiled with AVX-512 flags and -ffp-contract=off; it is only
// called after active_isa() found them.
#include <immintrin.h>

#include "kernels/attention_tile.h"
#include "kernels/attention_transpose8.h"
#include "kernels/ggml_numerics_tile.h"

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

/// ggml_numerics_tile.h's policy: ggml_v_expf of ggml's AVX-512 build on 16 lanes (ggml_expf16's steps in
/// vector form).
struct GgmlAvx512 : Avx512 {
  static void exp(const float* in, float* out) {
    const __m512 x = _mm512_loadu_ps(in);
    const __m512 r = _mm512_set1_ps(0x1.8p23f);
    const __m512 z = _mm512_fmadd_ps(x, _mm512_set1_ps(0x1.715476p+0f), r);
    const __m512 n = _mm512_sub_ps(z, r);
    const __m512 b = _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.7f7d1cp-20f),
                                      _mm512_fnmadd_ps(n, _mm512_set1_ps(0x1.62e4p-1f), x));
    const __mmask16 d = _mm512_cmp_ps_mask(_mm512_abs_ps(n), _mm512_set1_ps(192), _CMP_GT_OQ);
    const __m512 u = _mm512_mul_ps(b, b);
    const __m512 j = _mm512_fmadd_ps(
        _mm512_fmadd_ps(_mm512_fmadd_ps(_mm512_set1_ps(0x1.0e4020p-7f), b, _mm512_set1_ps(0x1.573e2ep-5f)), u,
                        _mm512_fmadd_ps(_mm512_set1_ps(0x1.555e66p-3f), b, _mm512_set1_ps(0x1.fffdb6p-2f))),
        u, _mm512_fmadd_ps(_mm512_set1_ps(0x1.ffffecp-1f), b, _mm512_set1_ps(1.0f)));
    const __m512 res = _mm512_scalef_ps(j, n);
    const __m512 alt = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(n, _mm512_setzero_ps(), _CMP_LE_OQ),
                                            _mm512_set1_ps(INFINITY), _mm512_setzero_ps());
    _mm512_storeu_ps(out, _mm512_mask_blend_ps(d, res, alt));
  }
  static void transpose(const float* k, std::int64_t stride, std::int64_t n, std::int64_t d, float* kt) {
    transpose_keys8(k, stride, n, d, kt);
  }
};

}  // namespace

void attention_job_avx512(const AttentionJob& job) { run_attention_job<Avx512>(job); }

const GgmlKernels kGgmlAvx512 = {ggml_attention_items<GgmlAvx512>, ggml_attention_jobs<GgmlAvx512>, ggml_silu_rows<GgmlAvx512>};

}  // namespace woq::detail
