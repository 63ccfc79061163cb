#include "kernels/blas.h"

#include <strings.h>

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <vector>

#include <fmt/format.h>

extern "C" {
// OpenBLAS's own API, weak so that another BLAS links too.
char* openblas_get_corename(void) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
void openblas_set_num_threads(int) __attribute__((weak));
}

namespace woq {

namespace {

// What OpenBLAS's SkylakeX kernels are compiled for (libgcc's checks include the OS's saving of the ZMM state).
bool cpu_runs_skylakex_kernels() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

}  // namespace

std::string blas_description() {
  if (openblas_get_corename == nullptr) return "BLAS";
  const std::string core = openblas_get_corename();
  const char* forced = std::getenv("OPENBLAS_CORETYPE");
  if (forced == nullptr || *forced == '\0') return fmt::format("OpenBLAS {} kernels", core);
  if (strcasecmp(forced, core.c_str()) != 0)  // OpenBLAS falls back to its own choice for a name it does not know
    return fmt::format("OpenBLAS {} kernels (OpenBLAS did not take OPENBLAS_CORETYPE={} as such)", core, forced);
  const bool avx512 = core == "SkylakeX" || core == "Cooperlake" || core == "SapphireRapids";
  if (avx512 || !cpu_runs_skylakex_kernels())
    return fmt::format("OpenBLAS {} kernels (OPENBLAS_CORETYPE={})", core, forced);
  return fmt::format("OpenBLAS {} kernels, as OPENBLAS_CORETYPE={} says; this CPU can run OpenBLAS's AVX-512 kernels "
                     "(1.7 times the Haswell kernels' rate for GPTQ on Zen 5): unset OPENBLAS_CORETYPE to use them",
                     core, forced);
}

bool choose_blas_kernels() {
  if (openblas_get_corename == nullptr || !cpu_runs_skylakex_kernels()) return false;
  if (const char* forced = std::getenv("OPENBLAS_CORETYPE"); forced != nullptr && *forced != '\0') return false;
  std::string wanted = "SkylakeX";
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx512bf16")) wanted = "Cooperlake";
#endif
  setenv("OPENBLAS_CORETYPE", wanted.c_str(), 1);
  return wanted != openblas_get_corename();
}

namespace {

// The count before the first of the scopes alive now (they may overlap: two quantizations in one process).
std::mutex scopes_mutex;
int scopes = 0;
int count_before = 0;

}  // namespace

int blas_threads() { return openblas_get_num_threads != nullptr ? openblas_get_num_threads() : 0; }

ScopedBlasThreads::ScopedBlasThreads(int threads) {
  if (openblas_get_num_threads == nullptr || openblas_set_num_threads == nullptr) return;
  const std::lock_guard lock(scopes_mutex);
  if (scopes++ == 0) count_before = openblas_get_num_threads();
  openblas_set_num_threads(threads);
  active_ = true;
}

ScopedBlasThreads::~ScopedBlasThreads() {
  if (!active_) return;
  const std::lock_guard lock(scopes_mutex);
  if (--scopes == 0) openblas_set_num_threads(count_before);
}

namespace {

// Panels and bands are fixed by the shape alone, so the sums (OpenBLAS picks
// its kernels, and their order of summation, by shape) never depend on the
// number of threads: GPTQ writes the same bytes at any --threads.
constexpr std::int64_t kPanel = 128;  // columns of y per sgemm call
constexpr std::int64_t kBands = 24;   // row bands of the triangle (1, 2, 3, 4, 6 or 8 threads share them evenly)

}  // namespace

void parallel_sgemm_nt(ThreadPool& pool, std::int64_t rows, std::int64_t n, std::int64_t k, const float* x,
                       const float* w, float* y) {
  if (rows <= 0 || n <= 0) return;
  const ScopedBlasThreads one_blas_thread(1);
  const std::int64_t panels = (n + kPanel - 1) / kPanel;
  pool.parallel_for(panels, [&](std::int64_t p0, std::int64_t p1) {
    for (std::int64_t p = p0; p < p1; ++p) {
      const std::int64_t n0 = p * kPanel, n1 = std::min(n, n0 + kPanel);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(n1 - n0),
                  static_cast<int>(k), 1.0f, x, static_cast<int>(k), w + n0 * k, static_cast<int>(k), 0.0f, y + n0,
                  static_cast<int>(n));
    }
  });
}

void quadratic_forms(std::int64_t rows, std::int64_t len, const float* d, std::int64_t ld, const float* h,
                     double* out, std::vector<float>& scratch) {
  if (rows <= 0 || len <= 0) return;
  scratch.resize(static_cast<std::size_t>(rows * len));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), static_cast<int>(len),
              static_cast<int>(len), 1.0f, d, static_cast<int>(ld), h, static_cast<int>(len), 0.0f, scratch.data(),
              static_cast<int>(len));
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* dr = d + r * ld;
    const float* e = scratch.data() + r * len;
    double sum = 0;
    for (std::int64_t c = 0; c < len; ++c) sum += static_cast<double>(e[c]) * dr[c];
    out[r] = sum;
  }
}

void parallel_ssyrk_upper(ThreadPool& pool, std::int64_t rows, std::int64_t k, const float* x, float* c) {
  if (rows <= 0 || k <= 0) return;
  const ScopedBlasThreads one_blas_thread(1);
  // Band t holds rows [edge(t), edge(t + 1)): row i costs k - i, so the bands are of equal area.
  const std::int64_t bands = std::min<std::int64_t>(kBands, std::max<std::int64_t>(1, k / 16));
  const auto edge = [&](std::int64_t t) -> std::int64_t {
    if (t >= bands) return k;
    const double f = 1.0 - std::sqrt(1.0 - static_cast<double>(t) / static_cast<double>(bands));
    return std::min(k, static_cast<std::int64_t>(std::lround(f * static_cast<double>(k) / 16.0)) * 16);
  };
  const int ld = static_cast<int>(k);
  pool.parallel_for(bands, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t i0 = edge(t), i1 = edge(t + 1);
      if (i1 <= i0) continue;
      cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, static_cast<int>(i1 - i0), static_cast<int>(rows), 1.0f,
                  x + i0, ld, 1.0f, c + i0 * k + i0, ld);
      if (i1 < k)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(i1 - i0), static_cast<int>(k - i1),
                    static_cast<int>(rows), 1.0f, x + i0, ld, x + i1, ld, 1.0f, c + i0 * k + i1, ld);
    }
  });
}

}  // namespace woq
