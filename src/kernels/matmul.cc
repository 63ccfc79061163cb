#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
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
// (matmul_avx2.cc): per block, acc = fma(Σ q·a, s_w·d_a, acc), then for the
// 4-bit formats (stored nibbles q, zero point z = 8 or per group)
// acc = fma(-z·s_w, d_a·Σa, acc). `q` is the row gathered into the row-major layout.
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
    const float dw = fp16_to_fp32(scales[g]);
    const std::size_t at = static_cast<std::size_t>(t * a.padded + b);
    acc = std::fma(static_cast<float>(isum), dw * a.d[at], acc);
    if constexpr (T != LowBit::kSymInt8) {
      const float zdw = static_cast<float>(T == LowBit::kSymInt4 ? 8 : zeros[g]) * dw;
      acc = std::fma(-zdw, a.sum[at], acc);
    }
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
  static const RowKernels k{dot_row_scalar, dot_f32_scalar, axpy_scalar, tile_q8_scalar, dequantize_stored_row,
                            quantize_q8_scalar};
  return k;
}

const RowKernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return scalar_kernels();
    case Isa::kAvx2: return avx2_kernels();
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
// Bytes of int8 activations a token chunk may occupy, to stay in L2 while
// every weight row group of a thread's range passes over it (96 KiB by
// measurement at 2 threads on Zen 3: 192 KiB left the K = 11008 down
// projection at 1.1x its one-thread speed, 96 KiB at 1.4x).
constexpr std::int64_t kQ8ChunkBytes = 96 * 1024;

void matmul_float(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
                  const detail::RowKernels& kern) {
  const std::int64_t n = w.rows;
  const std::int64_t k = w.cols;
  // dot_row is dot_f32 on the exactly widened row (quantized rows dequantized
  // in registers, in the same order), so the row path (decode) and the tiled
  // path (prefill) give the same sums.
  // Interleaved matrices (prepared for int8 activations, then switched to
  // f32 ones, as explain does) are widened row by row through the reference.
  const bool flat = w.interleave == 1;
  const auto widen_row = flat ? kern.widen_row : dequantize_stored_row;
  if (m < kTiledMinRows && flat) {
    pool.parallel_for(n, [&](std::int64_t r0, std::int64_t r1) {
      std::vector<float> scratch(static_cast<std::size_t>(k));
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t i = 0; i < m; ++i) y[i * n + r] = kern.dot_row(w, r, x + i * k, scratch.data());
    });
    return;
  }
  pool.parallel_for(
      n,
      [&](std::int64_t r0, std::int64_t r1) {
        std::vector<float> tile(static_cast<std::size_t>(kTileRows * k));
        for (std::int64_t t0 = r0; t0 < r1; t0 += kTileRows) {
          const std::int64_t rows = std::min(kTileRows, r1 - t0);
          for (std::int64_t r = 0; r < rows; ++r) widen_row(w, t0 + r, tile.data() + r * k);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t r = 0; r < rows; ++r)
              y[i * n + t0 + r] = kern.dot_f32(tile.data() + r * k, x + i * k, k);
        }
      },
      kTileRows);
}

void matmul_q8(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
               const detail::RowKernels& kern, Isa isa) {
  if (w.interleave != kInterleaveRows)
    fail("matmul: a [{}, {}] {} matrix with int8 activations must be prepared first (prepare_for_kernels)", w.rows,
         w.cols, low_bit_name(w.type));
  // Reused between calls; workers see it through the reference (a
  // thread_local named inside the lambda would be each worker's own).
  thread_local Q8Activations buffer;
  Q8Activations& a = buffer;
  quantize_activations(x, m, w.cols, a, isa);
  const std::int64_t chunk = std::max<std::int64_t>(4, kQ8ChunkBytes / (a.padded * kQ8Block) / 4 * 4);
  const std::int64_t groups = (w.rows + kInterleaveRows - 1) / kInterleaveRows;
  pool.parallel_for(
      groups,
      [&a, &kern, &w, m, chunk, y](std::int64_t g0, std::int64_t g1) {
        for (std::int64_t t0 = 0; t0 < m; t0 += chunk) kern.tile_q8(w, g0, g1, a, t0, std::min(chunk, m - t0), y);
      },
      kQ8GroupGrain);
}

}  // namespace

float dot(const float* a, const float* b, std::int64_t n, Isa isa) { return detail::kernels(isa).dot_f32(a, b, n); }

void axpy(float a, const float* x, float* y, std::int64_t n, Isa isa) { detail::kernels(isa).axpy(a, x, y, n); }

bool uses_q8_path(const QuantMatrix& w) { return w.activations == Activations::kInt8 && can_interleave(w); }

void prepare_for_kernels(QuantMatrix& w, ThreadPool* pool) {
  if (uses_q8_path(w)) interleave_rows(w, pool);
}

void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
            Isa isa) {
  const detail::RowKernels& kern = detail::kernels(isa);
  if (!w.input_order.empty()) {
    // Act-order: gather the inputs into storage order once per call.
    thread_local std::vector<float> gathered;
    gathered.resize(static_cast<std::size_t>(m * w.cols));
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t k = 0; k < w.cols; ++k)
        gathered[static_cast<std::size_t>(i * w.cols + k)] = x[i * w.cols + w.input_order[static_cast<std::size_t>(k)]];
    x = gathered.data();
  }
  if (uses_q8_path(w)) {
    matmul_q8(w, x, m, y, pool, kern, isa);
  } else {
    matmul_float(w, x, m, y, pool, kern);
  }
}

}  // namespace woq
