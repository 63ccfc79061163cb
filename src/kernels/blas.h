// The BLAS woq's quantizer calls (OpenBLAS: sgemm for the calibration forward,
// ssyrk for Hessians, LAPACK potrf/trtri and dgemm for GPTQ's solve), and
// what it runs on this CPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/thread_pool.h"

namespace woq {

/// The kernels OpenBLAS uses, for the quantizer's log: "OpenBLAS Cooperlake
/// kernels". OpenBLAS builds with DYNAMIC_ARCH (Debian's) pick them by CPU
/// model unless the environment variable OPENBLAS_CORETYPE names others; when
/// it names kernels without AVX-512 on a CPU that runs OpenBLAS's AVX-512
/// ("SkylakeX") ones, the text says so and how much it costs (their sgemm and
/// dgemm run at about 0.6 times the rate on Zen 5). "BLAS" alone for a BLAS that is
/// not OpenBLAS.
std::string blas_description();

/// Chooses OpenBLAS's kernels by the CPU's features rather than its model:
/// when OPENBLAS_CORETYPE is unset and the CPU runs OpenBLAS's AVX-512
/// kernels, sets it to "Cooperlake" (with AVX512_BF16) or "SkylakeX".
/// OpenBLAS (a DYNAMIC_ARCH build, as Debian's) picks by CPU model and does
/// not know the models newer than its release: 0.3.21 (Debian 12) takes its
/// SSE3 "Prescott" kernels on an Emerald Rapids Xeon (model 207), whose sgemm
/// then runs at 26 GFLOP/s on one core against 143 with "Cooperlake". One
/// rule for every woq process also keeps their float results the same bits
/// (python/woq/__init__.py applies it before loading the library). Returns
/// true when the OpenBLAS already loaded runs other kernels than the ones set:
/// OpenBLAS reads the variable once, when it is loaded, so the caller runs
/// itself again (the woq CLI does). No-op, false, for a BLAS other than OpenBLAS.
bool choose_blas_kernels();

/// OpenBLAS's thread count now; 0 for a BLAS other than OpenBLAS.
int blas_threads();

/// Sets OpenBLAS's thread count for its lifetime: a ThreadPool whose threads
/// each make their own BLAS calls runs them with one (two thread systems on
/// the same cores cost GPTQ's solve a third of its time in context switches).
/// The count is process-wide: scopes alive at once share it, and the count
/// from before the first is restored when the last ends. A no-op for a BLAS
/// other than OpenBLAS.
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int threads);
  ~ScopedBlasThreads();
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;

 private:
  bool active_ = false;
};

/// y[rows x n] = x[rows x k] * w[n x k]^T, all row-major f32 (the linear
/// layers' y = x W^T), by cblas_sgemm on panels of 128 columns of y, spread
/// over pool's threads, each with one OpenBLAS thread. OpenBLAS's own threads
/// wait in a sched_yield loop, which on a machine whose other cores are busy
/// costs more than the work; woq's pool sleeps instead. The panels depend on
/// the shape only, so y is the same bits at any pool size (not necessarily
/// those of one sgemm call). Dimensions must fit in int.
void parallel_sgemm_nt(ThreadPool& pool, std::int64_t rows, std::int64_t n, std::int64_t k, const float* x,
                       const float* w, float* y);

/// out[r] = d_r · h · d_rᵀ for the rows d_r of d [rows x len] (row-major,
/// row stride ld >= len) and h [len x len] row-major, symmetric (the squared
/// error Σ_t (x_t · d_r)² of a weight difference d_r on inputs whose Gram
/// matrix is h = Σ_t x_tᵀ x_t): one cblas_sgemm d · h into `scratch` (resized
/// to rows x len), then each row's sum in f64. On the calling thread; the
/// caller sets OpenBLAS's threads (ScopedBlasThreads(1) inside a pool).
/// Dimensions must fit in int.
void quadratic_forms(std::int64_t rows, std::int64_t len, const float* d, std::int64_t ld, const float* h,
                     double* out, std::vector<float>& scratch);

/// c[k x k] += x^T x for x [rows x k], row-major f32, upper triangle only
/// (the lower one is left as it is): bands of c's rows of equal work, each a
/// cblas_ssyrk on its diagonal block and a cblas_sgemm beside it, spread over
/// pool's threads with one OpenBLAS thread each. The bands depend on k only:
/// the same bits at any pool size.
void parallel_ssyrk_upper(ThreadPool& pool, std::int64_t rows, std::int64_t k, const float* x, float* c);

}  // namespace woq
