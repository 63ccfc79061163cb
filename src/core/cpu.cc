#include "core/cpu.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/error.h"

namespace woq {

namespace {

bool has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();  // libgcc's checks include the OS's saving of the YMM state (XGETBV)
  // F16C from CPUID leaf 1, ECX bit 29 (clang before 16 has no "f16c" for __builtin_cpu_supports).
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

bool has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  // libgcc's checks include the OS's saving of the ZMM and mask state (XGETBV).
  return has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
#else
  return false;
#endif
}

// AVX512_BF16: CPUID leaf 7 sub-leaf 1, EAX bit 5 (Intel SDM vol. 2, CPUID).
bool has_avx512_bf16() {
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return has_avx512() && __get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx) && (eax & (1u << 5)) != 0;
#else
  return false;
#endif
}

// AMX-BF16, AMX-TILE and AMX-INT8 (CPUID leaf 7 EDX bits 22, 24 and 25), their tile state enabled by the
// OS (XCR0 bits 17 and 18), and Linux's permission to use it (requested once; Intel SDM vol. 1 ch. 18,
// and the kernel's Documentation/arch/x86/xstate.rst).
bool has_amx() {
#if defined(__linux__) && defined(__x86_64__)
  static const bool ok = [] {
    if (!has_avx512_bf16()) return false;
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if ((edx & (1u << 22)) == 0 || (edx & (1u << 24)) == 0 || (edx & (1u << 25)) == 0) return false;
    unsigned xcr0_lo = 0, xcr0_hi = 0;
    __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
    if ((xcr0_lo & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023;
    constexpr long kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
#else
  return false;
#endif
}

struct IsaInfo {
  Isa isa;
  std::string_view name;
  std::string_view requirements;
  bool (*supported)();
};

// One row per ISA, in the enum's order.
constexpr std::array<IsaInfo, 5> kIsas = {{
    {Isa::kScalar, "scalar", "nothing", [] { return true; }},
    {Isa::kAvx2, "avx2", "AVX2 + FMA + F16C", has_avx2},
    {Isa::kAvx512, "avx512", "AVX-512 F + BW + VL + VNNI (and AVX2 + FMA + F16C)", has_avx512},
    {Isa::kAvx512Bf16, "avx512_bf16", "AVX512_BF16 (and avx512's needs)", has_avx512_bf16},
    {Isa::kAmx, "amx", "AMX-TILE + AMX-INT8 + AMX-BF16 with Linux's permission for the tile state (and avx512_bf16's needs)",
     has_amx},
}};

const IsaInfo& info(Isa isa) { return kIsas[static_cast<std::size_t>(isa)]; }

Isa detect_isa() {
  const char* env = std::getenv("WOQ_ISA");
  if (env == nullptr || *env == '\0') return available_isas().back();
  const std::string want(env);
  std::string names;
  for (const IsaInfo& i : kIsas) {
    if (i.name == want) {
      if (!i.supported()) fail("WOQ_ISA={}, but this CPU lacks {}", want, i.requirements);
      return i.isa;
    }
    names += (names.empty() ? "" : ", ") + std::string(i.name);
  }
  fail("WOQ_ISA='{}' is not one of: {}", printable(want), names);
}

}  // namespace

std::string_view isa_name(Isa isa) { return info(isa).name; }
std::string_view isa_requirements(Isa isa) { return info(isa).requirements; }
bool cpu_supports(Isa isa) { return info(isa).supported(); }

std::span<const Isa> all_isas() {
  static constexpr std::array<Isa, kIsas.size()> isas = [] {
    std::array<Isa, kIsas.size()> v{};
    for (std::size_t i = 0; i < kIsas.size(); ++i) v[i] = kIsas[i].isa;
    return v;
  }();
  return isas;
}

std::span<const Isa> available_isas() {
  static const std::vector<Isa> isas = [] {
    std::vector<Isa> v;
    for (const IsaInfo& i : kIsas)
      if (i.supported()) v.push_back(i.isa);
    return v;
  }();
  return isas;
}

Isa active_isa() {
  static const Isa isa = detect_isa();
  return isa;
}

}  // namespace woq
