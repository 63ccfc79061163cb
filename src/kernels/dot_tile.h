#pragma once
// The walk of RowKernels::dot_f32_tile: a rows × m product of float dot
// products cut into micro-tiles of K::R weight rows × K::T tokens, tokens
// outer, and along k into panels of kDotTilePanel inputs (a panel of T inputs stays
// in L1 while the rows' panels pass over it; each product's accumulators wait
// in a buffer between panels, so its fused multiply-adds are still one chain in
// dot_f32's order). Rows and tokens past an edge repeat the last one (computed,
// not stored). Each ISA gives K:
//   Acc                                  one product's accumulators (dot_f32's);
//   zero(Acc&)
//   steps(w, x, j0, j1, Acc (&)[R][T])   dot_f32's steps of 16 over [j0, j1);
//   finish(const Acc&, w, x, j, k)       its step of 8, horizontal sum and scalar tail from j.

#include <algorithm>
#include <cstdint>

namespace woq::detail {

/// Inputs per panel (a multiple of 16).
constexpr std::int64_t kDotTilePanel = 256;
/// Weight rows whose accumulators are kept at once.
constexpr std::int64_t kDotTileRows = 64;

template <typename K>
void walk_dot_tiles(const float* w, std::int64_t ldw, std::int64_t rows, const float* x, std::int64_t m, std::int64_t k,
                    float* y, std::int64_t ldy) {
  constexpr int R = K::R, T = K::T;
  static_assert(kDotTileRows % R == 0);
  typename K::Acc acc[kDotTileRows / R][R][T];
  const float* wr[kDotTileRows / R][R];
  const float* xt[T];
  const std::int64_t body = k / 16 * 16;
  for (std::int64_t rc0 = 0; rc0 < rows; rc0 += kDotTileRows) {
    const std::int64_t rc = std::min(kDotTileRows, rows - rc0);
    const std::int64_t groups = (rc + R - 1) / R;
    for (std::int64_t g = 0; g < groups; ++g)
      for (int r = 0; r < R; ++r) wr[g][r] = w + (rc0 + std::min<std::int64_t>(g * R + r, rc - 1)) * ldw;
    for (std::int64_t t0 = 0; t0 < m; t0 += T) {
      const std::int64_t nt = std::min<std::int64_t>(T, m - t0);
      for (int t = 0; t < T; ++t) xt[t] = x + (t0 + std::min<std::int64_t>(t, nt - 1)) * k;
      for (std::int64_t g = 0; g < groups; ++g)
        for (int r = 0; r < R; ++r)
          for (int t = 0; t < T; ++t) K::zero(acc[g][r][t]);
      for (std::int64_t j0 = 0; j0 < body; j0 += kDotTilePanel)
        for (std::int64_t g = 0; g < groups; ++g) K::steps(wr[g], xt, j0, std::min(body, j0 + kDotTilePanel), acc[g]);
      for (std::int64_t g = 0; g < groups; ++g)
        for (std::int64_t r = 0; r < std::min<std::int64_t>(R, rc - g * R); ++r)
          for (std::int64_t t = 0; t < nt; ++t)
            y[(t0 + t) * ldy + rc0 + g * R + r] = K::finish(acc[g][r][t], wr[g][r], xt[t], body, k);
    }
  }
}

}  // namespace woq::detail
