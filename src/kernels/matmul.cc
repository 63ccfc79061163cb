#include "kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "core/half.h"
#include "core/thread_pool.h"

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

// Reference integer path: Σ_blocks s_w · d_a · Σ (q_w − zero) q_a, with q_w
// the stored integer (nibble 0..15 or int8) and zero 8, z or 0.
float dot_q8_scalar(const QuantMatrix& w, std::int64_t row, const Q8Activations& a, std::int64_t t) {
  const std::uint8_t* p = w.data.data() + row * w.row_bytes;
  const std::uint16_t* scales = w.scales.data() + row * w.groups_per_row;
  const std::int8_t* qa = a.row(t);
  float sum = 0.0f;
  for (std::int64_t b = 0; b < a.blocks; ++b) {
    const std::int64_t g = b * kQ8Block / w.group_size;
    const std::int64_t n = std::min(kQ8Block, w.cols - b * kQ8Block);
    int isum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t j = b * kQ8Block + i;  // column
      int v = 0;
      if (w.type == LowBit::kSymInt8) {
        v = reinterpret_cast<const std::int8_t*>(p)[j];
      } else {
        const int zero = w.type == LowBit::kSymInt4 ? 8 : w.zeros[static_cast<std::size_t>(row * w.groups_per_row + g)];
        v = ((j % 2 == 0) ? (p[j / 2] & 0x0f) : (p[j / 2] >> 4)) - zero;
      }
      isum += v * qa[q8_offset(a.layout, b, i)];
    }
    sum += fp16_to_fp32(scales[g]) * a.d[static_cast<std::size_t>(t * a.padded + b)] * static_cast<float>(isum);
  }
  return sum;
}

void tile_q8_scalar(const QuantMatrix& w, std::int64_t r0, std::int64_t rows, const Q8Activations& a,
                    std::int64_t t0, std::int64_t tokens, float* y) {
  for (std::int64_t t = t0; t < t0 + tokens; ++t)
    for (std::int64_t r = r0; r < r0 + rows; ++r) y[t * w.rows + r] = dot_q8_scalar(w, r, a, t);
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
// Rows per work item of the integer path: a multiple of every decode tile's
// row count (2, 3, 4), so no row falls to the slow single-row tile.
constexpr std::int64_t kQ8RowGrain = 48;
// Bytes of int8 activations a token chunk may occupy, to stay in L2 while
// every weight row of a thread's range passes over it.
constexpr std::int64_t kQ8ChunkBytes = 192 * 1024;

void matmul_float(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
                  const detail::RowKernels& kern) {
  const std::int64_t n = w.rows;
  const std::int64_t k = w.cols;
  // dot_row is dot_f32 on the exactly widened row (quantized rows dequantized
  // in registers, in the same order), so the row path (decode) and the tiled
  // path (prefill) give the same sums.
  if (m < kTiledMinRows) {
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
          for (std::int64_t r = 0; r < rows; ++r) kern.widen_row(w, t0 + r, tile.data() + r * k);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t r = 0; r < rows; ++r)
              y[i * n + t0 + r] = kern.dot_f32(tile.data() + r * k, x + i * k, k);
        }
      },
      kTileRows);
}

void matmul_q8(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
               const detail::RowKernels& kern, Isa isa) {
  // Reused between calls; workers see it through the reference (a
  // thread_local named inside the lambda would be each worker's own).
  thread_local Q8Activations buffer;
  Q8Activations& a = buffer;
  quantize_activations(x, m, w.cols, w.type == LowBit::kSymInt8 ? Q8Layout::kNatural : Q8Layout::kPairedNibbles, a,
                       isa);
  const std::int64_t chunk =
      std::max<std::int64_t>(4, kQ8ChunkBytes / (a.padded * kQ8Block) / 4 * 4);
  pool.parallel_for(
      w.rows,
      [&a, &kern, &w, m, chunk, y](std::int64_t r0, std::int64_t r1) {
        for (std::int64_t t0 = 0; t0 < m; t0 += chunk)
          for (std::int64_t r = r0; r < r1; r += kQ8RowGrain)
            kern.tile_q8(w, r, std::min(kQ8RowGrain, r1 - r), a, t0, std::min(chunk, m - t0), y);
      },
      kQ8RowGrain);
}

}  // namespace

float dot(const float* a, const float* b, std::int64_t n, Isa isa) { return detail::kernels(isa).dot_f32(a, b, n); }

void axpy(float a, const float* x, float* y, std::int64_t n, Isa isa) { detail::kernels(isa).axpy(a, x, y, n); }

bool uses_q8_path(const QuantMatrix& w) {
  return is_quantized(w.type) && w.activations == Activations::kInt8 &&
         (w.group_size % kQ8Block == 0 || w.groups_per_row == 1);
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
