// Instruction-set selection for the kernels, decided once at run time: the
// seam where a new ISA goes in (one enum value and one row of the table in
// cpu.cc here, one kernel file and one CMake line in src/kernels).
#pragma once

#include <span>
#include <string_view>

namespace woq {

/// Instruction sets a kernel may be specialised for, in increasing order of preference.
/// kAvx512Bf16 is kAvx512 plus AVX512_BF16 (vdpbf16ps, for bf16 activations); kAmx is kAvx512Bf16 plus
/// Intel AMX (AMX-TILE + AMX-INT8 + AMX-BF16) for the integer and bf16 paths' tiles.
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Bf16, kAmx };

/// "scalar", "avx2", "avx512", "avx512_bf16", "amx".
std::string_view isa_name(Isa isa);

/// What `isa` needs of the CPU, for messages ("AVX2 + FMA + F16C").
std::string_view isa_requirements(Isa isa);

/// Whether this CPU (and its OS) runs kernels of `isa`. For kAmx this also asks
/// Linux for the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA),
/// which a process must hold before its first tile instruction; a refused
/// request means AMX is unavailable, not an error.
bool cpu_supports(Isa isa);

/// Every ISA woq has kernels for, in the enum's order (whether or not this CPU runs them).
std::span<const Isa> all_isas();

/// The ISAs this CPU runs, scalar first and the best last: what tests and
/// benchmarks loop over.
std::span<const Isa> available_isas();

/// The best ISA this CPU supports, unless the environment variable WOQ_ISA
/// names another (one of isa_name's values). Asking for an ISA the CPU lacks,
/// or an unknown name, throws woq::Error. Evaluated once and cached.
Isa active_isa();

}  // namespace woq
