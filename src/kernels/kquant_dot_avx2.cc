// The K-quant kernels compiled for AVX2 + FMA + F16C (kernels/kquant_dot_x86.h).
#define KQUANT_ISA avx2
#include "kernels/kquant_dot_x86.h"

namespace woq::detail {

KQuantDot kquant_dot_avx2(LowBit type) { return avx2::kernel_of(type); }

}  // namespace woq::detail
