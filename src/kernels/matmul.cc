#include "kernels/matmul.h"

#include <algorithm>
#include <vector>

#include "core/thread_pool.h"

namespace woq {

namespace detail {
namespace {

float dot_f32_scalar(const float* a, const float* b, std::int64_t k) {
  float sum = 0.0f;
  for (std::int64_t j = 0; j < k; ++j) sum += a[j] * b[j];
  return sum;
}

// Reference: expand the row with the codec's own dequantizer, then dot.
float dot_row_scalar(const QuantMatrix& w, std::int64_t row, const float* x, float* scratch) {
  dequantize_row(w, row, scratch);
  return dot_f32_scalar(scratch, x, w.cols);
}

}  // namespace

const RowKernels& scalar_kernels() {
  static const RowKernels k{dot_row_scalar, dot_f32_scalar};
  return k;
}

}  // namespace detail

namespace {

// Inputs at or above this count take the dequantize-a-tile-once path.
constexpr std::int64_t kTiledMinRows = 4;
// Weight rows dequantized together on the tiled path.
constexpr std::int64_t kTileRows = 8;

}  // namespace

void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool,
            Isa isa) {
  const detail::RowKernels& kern =
      isa == Isa::kAvx2 ? detail::avx2_kernels() : detail::scalar_kernels();
  const std::int64_t n = w.rows;
  const std::int64_t k = w.cols;
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
          for (std::int64_t r = 0; r < rows; ++r) dequantize_row(w, t0 + r, tile.data() + r * k);
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t r = 0; r < rows; ++r)
              y[i * n + t0 + r] = kern.dot_f32(tile.data() + r * k, x + i * k, k);
        }
      },
      kTileRows);
}

}  // namespace woq
