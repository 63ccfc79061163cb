// The BLAS woq's quantizer calls (OpenBLAS: sgemm for the calibration forward,
// ssyrk for Hessians, LAPACK potrf/trtri and dgemm for GPTQ's solve), and
// what it runs on this CPU.
#pragma once

#include <string>

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

}  // namespace woq
