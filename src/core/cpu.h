// Instruction-set selection for the kernels, decided once at run time.
#pragma once

#include <string_view>

namespace woq {

/// Instruction sets a kernel may be specialised for.
enum class Isa { kScalar, kAvx2 };

/// "scalar" or "avx2".
std::string_view isa_name(Isa isa);

/// The best ISA this CPU supports (AVX2 needs AVX2 + FMA + F16C), unless the
/// environment variable WOQ_ISA=scalar|avx2 asks for another. Asking for an
/// ISA the CPU lacks throws woq::Error. Evaluated once and cached.
Isa active_isa();

}  // namespace woq
