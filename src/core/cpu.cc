#include "core/cpu.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace woq {

std::string_view isa_name(Isa isa) { return isa == Isa::kAvx2 ? "avx2" : "scalar"; }

namespace {

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return false;
#endif
}

Isa detect_isa() {
  const bool avx2 = cpu_has_avx2();
  const char* env = std::getenv("WOQ_ISA");
  if (env == nullptr || *env == '\0') return avx2 ? Isa::kAvx2 : Isa::kScalar;
  const std::string want(env);
  if (want == "scalar") return Isa::kScalar;
  if (want == "avx2") {
    if (!avx2) fail("WOQ_ISA=avx2, but this CPU lacks AVX2/FMA/F16C");
    return Isa::kAvx2;
  }
  fail("WOQ_ISA='{}' is not one of: scalar, avx2", want);
}

}  // namespace

Isa active_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

}  // namespace woq
