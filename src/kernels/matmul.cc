#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/interleave.h"
#include "formats/scale.h"

namespace woq {

namespace detail {
namespace {

float dot_f32_scalar(const float* a, const float* b, std::int64_t k) {
  float sum = 0.0f;
  for (std::int64_t j = 0; j < k; ++j) sum += a[j] * b[j];
  return sum;
}

void axpy_scalar(float a, const float* x, float* y, std::int64_t k) {
  for (std::int64_t j = 0; j < k; ++j) y[j] += a * x[j];
}

// Reference: expand the row with the codec's own dequantizer, then dot.
float dot_row_scalar(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch) {
  dequantize_stored_row(w, row, scratch);
  return dot_f32_scalar(scratch, x, w.cols);
}

// Reference integer path, in the kernels' order of float operations
// (matmul_avx2.cc, matmul_avx512.cc): per block, the exact integer sum
// Σ (q - z)·a = Σ q·a - z·Σa (stored values q; zero point z = 8 for sym_int4,
// per group for asym_int4, 0 for sym_int8), then acc = fma(sum, s_w·d_a, acc).
// `q` is the row gathered into the row-major layout.
template <LowBit T>
float dot_q8_scalar(const QuantMatrix& w, const std::uint8_t* q, const std::uint16_t* scales,
                    const std::uint8_t* zeros, const Q8Activations& a, std::int64_t t) {
  const std::int8_t* qa = a.row(t);
  float acc = 0.0f;
  for (std::int64_t b = 0; b < a.blocks; ++b) {
    const std::int64_t g = w.groups_per_row == 1 ? 0 : b * kQ8Block / w.group_size;
    const std::int64_t n = std::min(kQ8Block, w.cols - b * kQ8Block);
    int isum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t j = b * kQ8Block + i;  // column
      const int v = T == LowBit::kSymInt8 ? static_cast<std::int8_t>(q[j]) : codec::get_nibble(q, j);
      isum += v * qa[j];
    }
    const std::size_t at = static_cast<std::size_t>(t * a.padded + b);
    if constexpr (T != LowBit::kSymInt8) isum -= (T == LowBit::kSymInt4 ? 8 : zeros[g]) * a.qsum[at];
    acc = std::fma(static_cast<float>(isum), fp16_to_fp32(scales[g]) * a.d[at], acc);
  }
  return acc;
}

void tile_q8_scalar(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a,
                    std::int64_t t0, std::int64_t tokens, float* y) {
  std::vector<std::uint8_t> q(static_cast<std::size_t>(w.row_bytes)), zeros(static_cast<std::size_t>(w.groups_per_row));
  std::vector<std::uint16_t> scales(static_cast<std::size_t>(w.groups_per_row));
  for (std::int64_t r = g0 * kInterleaveRows; r < std::min(w.rows, g1 * kInterleaveRows); ++r) {
    gather_row(w, r, q.data(), scales.data(), zeros.data());
    for (std::int64_t t = t0; t < t0 + tokens; ++t) {
      float& out = y[t * w.rows + r];
      switch (w.type) {
        case LowBit::kSymInt4: out = dot_q8_scalar<LowBit::kSymInt4>(w, q.data(), scales.data(), zeros.data(), a, t); break;
        case LowBit::kAsymInt4: out = dot_q8_scalar<LowBit::kAsymInt4>(w, q.data(), scales.data(), zeros.data(), a, t); break;
        default: out = dot_q8_scalar<LowBit::kSymInt8>(w, q.data(), scales.data(), zeros.data(), a, t); break;
      }
    }
  }
}

void quantize_q8_scalar(const float* x, Q8Activations& out) {
  for (std::int64_t r = 0; r < out.m; ++r)
    for (std::int64_t b = 0; b < out.blocks; ++b) quantize_block(x, r, b, out);
}

}  // namespace

const RowKernels& scalar_kernels() {
  static const RowKernels k{dot_row_scalar, dot_rows_by_row<dot_row_scalar>, dot_f32_scalar, axpy_scalar,
                            tile_q8_scalar, dequantize_stored_row, quantize_q8_scalar};
  return k;
}

const RowKernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return scalar_kernels();
    case Isa::kAvx2: return avx2_kernels();
    case Isa::kAvx512: return avx512_kernels();
    case Isa::kAmx: return amx_kernels();
  }
  return scalar_kernels();
}

}  // namespace detail

namespace {

// Inputs at or above this count take the tiled (prefill) path.
constexpr std::int64_t kTiledMinRows = 4;
// Weight rows dequantized together on the float tiled path.
constexpr std::int64_t kTileRows = 8;
// Row groups (of 8 rows) per work item of the integer path.
constexpr std::int64_t kQ8GroupGrain = 4;

// Rows [r0, r1) of y = x · wᵀ on the float path.
// dot_row is dot_f32 on the exactly widened row (quantized rows dequantized
// in registers, in the same order), so the row path (decode) and the tiled
// path (prefill) give the same sums.
// Interleaved matrices (prepared for int8 activations, then switched to
// f32 ones, as explain does) are widened row by row through the reference.
void float_rows(const QuantMatrix& w, const float* x, std::int64_t m, float* y, const detail::RowKernels& kern,
                std::int64_t r0, std::int64_t r1) {
  const std::int64_t n = w.rows;
  const std::int64_t k = w.cols;
  const bool flat = w.interleave == 1;
  if (m < kTiledMinRows && flat) {
    thread_local std::vector<float> scratch;
    scratch.resize(static_cast<std::size_t>(k));
    float out[detail::kDotRows];
    for (std::int64_t r = r0; r < r1; r += detail::kDotRows) {
      const std::int64_t rows = std::min(detail::kDotRows, r1 - r);
      for (std::int64_t i = 0; i < m; ++i) {
        kern.dot_rows(w, r, rows, x + i * k, out, scratch.data());
        for (std::int64_t j = 0; j < rows; ++j) y[i * n + r + j] = out[j];
      }
    }
    return;
  }
  const auto widen_row = flat ? kern.widen_row : dequantize_stored_row;
  thread_local std::vector<float> tile;
  tile.resize(static_cast<std::size_t>(kTileRows * k));
  for (std::int64_t t0 = r0; t0 < r1; t0 += kTileRows) {
    const std::int64_t rows = std::min(kTileRows, r1 - t0);
    for (std::int64_t r = 0; r < rows; ++r) widen_row(w, t0 + r, tile.data() + r * k);
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t r = 0; r < rows; ++r) y[i * n + t0 + r] = kern.dot_f32(tile.data() + r * k, x + i * k, k);
  }
}

// One parallel pass over the work units (rows on the float path, 8-row groups
// on the integer path) of several matrices laid end to end: fn(i, u0, u1)
// covers units [u0, u1) of matrix i.
template <typename Fn>
void parallel_over(std::span<const MatmulOutput> outs, std::int64_t (*units)(const QuantMatrix&), std::int64_t grain,
                   ThreadPool& pool, const Fn& fn) {
  std::int64_t total = 0;
  for (const MatmulOutput& o : outs) total += units(*o.w);
  pool.parallel_for(
      total,
      [&](std::int64_t u0, std::int64_t u1) {
        std::int64_t start = 0;
        for (std::size_t i = 0; i < outs.size() && start < u1; ++i) {
          const std::int64_t end = start + units(*outs[i].w);
          if (end > u0) fn(i, std::max(u0, start) - start, std::min(u1, end) - start);
          start = end;
        }
      },
      grain);
}

std::int64_t row_units(const QuantMatrix& w) { return w.rows; }
std::int64_t group_units(const QuantMatrix& w) { return (w.rows + kInterleaveRows - 1) / kInterleaveRows; }

// Every matrix of `outs` takes the same path (both integer, or both float) and
// reads x as given (no act-order).
void matmul_same_path(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool, Isa isa) {
  const detail::RowKernels& kern = detail::kernels(isa);
  if (!uses_q8_path(*outs[0].w)) {
    const std::int64_t grain = m < kTiledMinRows ? 1 : kTileRows;
    parallel_over(outs, row_units, grain, pool, [&](std::size_t i, std::int64_t r0, std::int64_t r1) {
      float_rows(*outs[i].w, x, m, outs[i].y, kern, r0, r1);
    });
    return;
  }
  for (const MatmulOutput& o : outs)
    if (o.w->interleave != kInterleaveRows)
      fail("matmul: a [{}, {}] {} matrix with int8 activations must be prepared first (prepare_for_kernels)",
           o.w->rows, o.w->cols, low_bit_name(o.w->type));
  // Reused between calls; workers see it through the reference (a
  // thread_local named inside the lambda would be each worker's own).
  thread_local Q8Activations buffer;
  Q8Activations& a = buffer;
  quantize_activations(x, m, outs[0].w->cols, a, isa);
  const std::int64_t grain = kern.q8_chunk_tokens;
  const std::int64_t chunk = std::max(grain, kern.q8_chunk_bytes / (a.padded * kQ8Block) / grain * grain);
  parallel_over(outs, group_units, kQ8GroupGrain, pool, [&](std::size_t i, std::int64_t g0, std::int64_t g1) {
    for (std::int64_t t0 = 0; t0 < m; t0 += chunk)
      kern.tile_q8(*outs[i].w, g0, g1, a, t0, std::min(chunk, m - t0), outs[i].y);
  });
}

}  // namespace

float dot(const float* a, const float* b, std::int64_t n, Isa isa) { return detail::kernels(isa).dot_f32(a, b, n); }

void axpy(float a, const float* x, float* y, std::int64_t n, Isa isa) { detail::kernels(isa).axpy(a, x, y, n); }

bool uses_q8_path(const QuantMatrix& w) { return w.activations == Activations::kInt8 && can_interleave(w); }

void prepare_for_kernels(QuantMatrix& w, ThreadPool* pool) {
  if (uses_q8_path(w)) interleave_rows(w, pool);
}

void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool, Isa isa) {
  const MatmulOutput out{&w, y};
  matmul_shared_input(std::span(&out, 1), x, m, pool, isa);
}

void matmul_shared_input(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool,
                         Isa isa) {
  if (outs.empty()) return;
  for (const MatmulOutput& o : outs)
    if (o.w->cols != outs[0].w->cols)
      fail("matmul: matrices of {} and {} inputs cannot share one input", outs[0].w->cols, o.w->cols);
  bool same = true;
  for (const MatmulOutput& o : outs)
    same = same && o.w->input_order.empty() && uses_q8_path(*o.w) == uses_q8_path(*outs[0].w);
  if (same) return matmul_same_path(outs, x, m, pool, isa);
  for (const MatmulOutput& o : outs) {
    const float* in = x;
    if (!o.w->input_order.empty()) {
      // Act-order: gather the inputs into storage order once per matrix.
      thread_local std::vector<float> gathered;
      gathered.resize(static_cast<std::size_t>(m * o.w->cols));
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t k = 0; k < o.w->cols; ++k)
          gathered[static_cast<std::size_t>(i * o.w->cols + k)] =
              x[i * o.w->cols + o.w->input_order[static_cast<std::size_t>(k)]];
      in = gathered.data();
    }
    const MatmulOutput one = o;
    matmul_same_path(std::span(&one, 1), in, m, pool, isa);
  }
}

}  // namespace woq
