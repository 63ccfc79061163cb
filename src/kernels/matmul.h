// Matrix products with weights in any LowBit format, dequantized inside the
// dot product (the weights are never expanded to fp32 in memory).
#pragma once

#include <cstdint>

#include "core/cpu.h"
#include "formats/low_bit.h"

namespace woq {

class ThreadPool;

/// y = x · Wᵀ: y[i, n] = Σ_k x[i, k] · W[n, k] for i < m, n < W.rows.
///
/// x: [m, W.cols] fp32 row-major; y: [m, W.rows] fp32 row-major (must not
/// alias x). Parallel over output rows n. For small m (decode) every dot
/// product reads the packed row directly; for larger m (prefill) a tile of
/// rows is dequantized once and reused for all m inputs. `isa` selects the
/// kernels (the scalar ones are the reference); results of different ISAs
/// agree to float rounding, not bit for bit.
void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
            Isa isa = active_isa());

namespace detail {

/// One ISA's row kernels. Internal to the kernels library.
struct RowKernels {
  /// Σ_k W[row, k] · x[k]; `scratch` has room for W.cols floats.
  float (*dot_row)(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch);
  /// Σ_k a[k] · b[k].
  float (*dot_f32)(const float* a, const float* b, std::int64_t k);
};

const RowKernels& scalar_kernels();
const RowKernels& avx2_kernels();

}  // namespace detail
}  // namespace woq
