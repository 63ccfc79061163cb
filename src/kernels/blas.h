// The BLAS woq's quantizer calls (OpenBLAS: sgemm for the calibration forward,
// ssyrk for Hessians, LAPACK potrf/trtri and dgemm for GPTQ's solve), and
// what it runs on this CPU.
#pragma once

#include <cstdint>
#include <string>

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

/// c[k x k] += x^T x for x [rows x k], row-major f32, upper triangle only
/// (the lower one is left as it is): bands of c's rows of equal work, each a
/// cblas_ssyrk on its diagonal block and a cblas_sgemm beside it, spread over
/// pool's threads with one OpenBLAS thread each. The bands depend on k only:
/// the same bits at any pool size.
void parallel_ssyrk_upper(ThreadPool& pool, std::int64_t rows, std::int64_t k, const float* x, float* c);

}  // namespace woq
