// The K-quant kernels compiled for AVX-512 VL + VNNI (kernels/kquant_dot_x86.h): the AVX2 code
// with 32 vector registers and vpdpwssd for vpmaddwd + vpaddd.
#define KQUANT_ISA avx512
#include "kernels/kquant_dot_x86.h"

namespace woq::detail {

KQuantDot kquant_dot_avx512(LowBit type) { return avx512::kernel_of(type); }

}  // namespace woq::detail
