#include "kernels/blas.h"

#include <strings.h>

#include <cstdlib>
#include <mutex>

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

}  // namespace woq
