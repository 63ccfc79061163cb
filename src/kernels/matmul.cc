#include "kernels/matmul.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "core/error.h"
#include "core/half.h"
#include "core/thread_pool.h"
#include "formats/format_traits.h"
#include "formats/group_rule.h"
#include "formats/interleave.h"
#include "formats/kquant.h"
#include "formats/scale.h"
#include "kernels/kquant_dot.h"
#include "kernels/q8_tile.h"

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
// per group for asym_int4, 0 for sym_int8; a the int8 activations, or the
// int16 ones 255·hi + lo), added up over the blocks of a scale unit (one
// block for int8 activations; for int16 ones the blocks that share both the
// activations' scale and the weights' group: unit_ends), then
// acc = fma(sum, s_w·d_a, acc).
// `q` is the row gathered into the row-major layout.
template <LowBit T>
float dot_q8_scalar(const QuantMatrix& w, const std::uint8_t* q, const std::uint16_t* scales,
                    const std::uint8_t* zeros, const Q8Activations& a, std::int64_t t) {
  const GroupOf group_of(w, a.blocks);
  float acc = 0.0f;
  int unit_sum = 0;
  for (std::int64_t b = 0; b < a.blocks; ++b) {
    const std::int64_t g = group_of(b);
    const std::int64_t n = std::min(kQ8Block, w.cols - b * kQ8Block);
    int isum = 0;
    for (std::int64_t i = 0; i < n; ++i) {
      const std::int64_t j = b * kQ8Block + i;  // column
      const int v = T == LowBit::kSymInt8 ? static_cast<std::int8_t>(q[j]) : codec::get_nibble(q, j);
      isum += v * a.value(t, j);
    }
    const std::size_t at = static_cast<std::size_t>(t * a.padded + b);
    if constexpr (T != LowBit::kSymInt8) isum -= (T == LowBit::kSymInt4 ? 8 : zeros[g]) * a.qsum[at];
    unit_sum += isum;
    if (unit_ends(group_of, a, b)) {
      acc = std::fma(static_cast<float>(unit_sum), fp16_to_fp32(scales[g]) * a.d[at], acc);
      unit_sum = 0;
    }
  }
  return acc;
}


// Reference bf16 path (Activations::kBf16), in the order of AVX512_BF16's
// vdpbf16ps with one output per lane (matmul_avx512_bf16.cc): per group, the
// products of the bf16 inputs and the weights' integers (q - z, exact in
// fp32) are added to an fp32 sum one input pair after another, the odd input
// of each pair first, from 0 over the group's whole blocks (inputs past K are
// zero); then acc = fma(sum, s_w, acc), group after group.
template <LowBit T>
float dot_bf16_scalar(const QuantMatrix& w, const std::uint8_t* q, const std::uint16_t* scales,
                      const std::uint8_t* zeros, const Bf16Activations& a, std::int64_t t) {
  const std::uint16_t* x = a.row(t);
  const std::int64_t padded = a.blocks * kBf16Block;
  const std::int64_t group = w.groups_per_row == 1 ? padded : w.group_size;
  float acc = 0.0f;
  for (std::int64_t g0 = 0, g = 0; g0 < padded; g0 += group, ++g) {
    auto product = [&](std::int64_t j) {
      if (j >= w.cols) return 0.0f;
      const int v = T == LowBit::kSymInt8 ? static_cast<std::int8_t>(q[j])
                                          : codec::get_nibble(q, j) - (T == LowBit::kSymInt4 ? 8 : zeros[g]);
      return bf16_to_fp32(x[j]) * static_cast<float>(v);  // exact: 8 by at most 8 significant bits
    };
    float sum = 0.0f;
    for (std::int64_t j = g0; j < std::min(g0 + group, padded); j += 2) {
      sum += product(j + 1);
      sum += product(j);
    }
    acc = std::fma(sum, fp16_to_fp32(scales[g]), acc);
  }
  return acc;
}

// One reference tile: rows of groups [g0, g1) x tokens [t0, t0 + tokens) by Dot, on the interleaved layout.
template <typename Activations, typename Dot>
void tile_scalar(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Activations& a, std::int64_t t0,
                 std::int64_t tokens, float* y, const Dot& dot) {
  std::vector<std::uint8_t> q(static_cast<std::size_t>(w.row_bytes)), zeros(static_cast<std::size_t>(w.groups_per_row));
  std::vector<std::uint16_t> scales(static_cast<std::size_t>(w.groups_per_row));
  for (std::int64_t r = g0 * kInterleaveRows; r < std::min(w.rows, g1 * kInterleaveRows); ++r) {
    gather_row(w, r, q.data(), scales.data(), zeros.data());
    for (std::int64_t t = t0; t < t0 + tokens; ++t) y[t * w.rows + r] = dot(q.data(), scales.data(), zeros.data(), a, t);
  }
}

void tile_bf16_scalar(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Bf16Activations& a,
                      std::int64_t t0, std::int64_t tokens, float* y, ScratchArena&) {
  for_integer_format(w.type, [&](auto type) {
    tile_scalar(w, g0, g1, a, t0, tokens, y,
                [&](auto... args) { return dot_bf16_scalar<decltype(type)::value>(w, args...); });
  });
}

void tile_q8_scalar(const QuantMatrix& w, std::int64_t g0, std::int64_t g1, const Q8Activations& a,
                    std::int64_t t0, std::int64_t tokens, float* y, ScratchArena&) {
  for_integer_format(w.type, [&](auto type) {
    tile_scalar(w, g0, g1, a, t0, tokens, y,
                [&](auto... args) { return dot_q8_scalar<decltype(type)::value>(w, args...); });
  });
}

void quantize_q8_scalar(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1) {
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t b = 0; b < out.blocks; ++b) quantize_block(x, r, b, out);
}

}  // namespace

void quantize_int16_scalar(const float* x, Q8Activations& out, std::int64_t r0, std::int64_t r1) {
  for (std::int64_t r = r0; r < r1; ++r)
    for (std::int64_t j0 = 0; j0 < out.k; j0 += kInt16ScaleBlocks * kQ8Block) quantize_int16_unit(x, r, j0, out);
}

bool quantize_groups_scalar(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                            std::int32_t* q, GroupRule* rules) {
  for (std::int64_t j = 0; j < cols; ++j)
    if (!std::isfinite(x[j])) return false;
  for (std::int64_t g = 0, c0 = 0; c0 < cols; ++g, c0 += group) {
    const std::int64_t len = std::min(group, cols - c0);
    rules[g] = fit_group(type, range, x + c0, len);
    rules[g].quantize(x + c0, len, q + c0);
  }
  return true;
}

const RowKernels& scalar_kernels() {
  static const RowKernels k{dot_row_scalar, dot_rows_by_row<dot_row_scalar>, dot_f32_scalar, axpy_scalar,
                            tile_q8_scalar, tile_bf16_scalar, dequantize_stored_row, quantize_q8_scalar};
  return k;
}

const RowKernels& kernels(Isa isa) {
  switch (isa) {
    case Isa::kScalar: return scalar_kernels();
    case Isa::kAvx2: return avx2_kernels();
    case Isa::kAvx512: return avx512_kernels();
    case Isa::kAvx512Bf16: return avx512_bf16_kernels();
    case Isa::kAmx: return amx_kernels();
  }
  return scalar_kernels();
}

}  // namespace detail

namespace {

// Inputs at or above this count take the tiled (prefill) path.
constexpr std::int64_t kTiledMinRows = 4;
// Weight rows taken together on the float tiled path: at least kTileRows, at most 64, about kTileBytes
// of widened rows (each token's input is read once per tile).
constexpr std::int64_t kTileRows = 8;
constexpr std::int64_t kTileBytes = 512 * 1024;
// Least tokens per tile call on the bf16 path: each call unpacks its rows' integers to bf16 (about a
// decode's work), so fewer tokens than this per unpack cost more than the activations falling out of L2
// (measured on AMX: the K = 11008 down projection at pp512 takes 123 ms in chunks of 32 tokens, 57 in
// chunks of 176; K = 4096 in chunks of 128 takes 21 ms, of 512 35).
constexpr std::int64_t kBf16ChunkTokens = 128;
// Row groups (of 8 rows) per work item of the integer path.
constexpr std::int64_t kQ8GroupGrain = 4;

// Rows [r0, r1) of y = x · wᵀ on the float path.
// dot_row is dot_f32 on the exactly widened row (quantized rows dequantized
// in registers, in the same order), so the row path (decode) and the tiled
// path (prefill) give the same sums.
// Interleaved matrices (prepared for int8 activations, then switched to
// f32 ones, as explain does) are widened row by row through the reference.
void float_rows(const QuantMatrix& w, const float* x, std::int64_t m, float* y, const detail::RowKernels& kern,
                std::int64_t r0, std::int64_t r1, ScratchArena& arena) {
  const std::int64_t n = w.rows;
  const std::int64_t k = w.cols;
  const bool flat = w.interleave == 1;
  if (m < kTiledMinRows && flat) {
    float* scratch = arena.get<float>(kSlotDotRow, k);
    float out[detail::kDotRows];
    for (std::int64_t r = r0; r < r1; r += detail::kDotRows) {
      const std::int64_t rows = std::min(detail::kDotRows, r1 - r);
      for (std::int64_t i = 0; i < m; ++i) {
        kern.dot_rows(w, r, rows, x + i * k, out, scratch);
        for (std::int64_t j = 0; j < rows; ++j) y[i * n + r + j] = out[j];
      }
    }
    return;
  }
  // fp32 rows are read where they are; others are widened a tile at a time. A tile of about
  // kTileBytes stays in L2 while every token passes over it.
  const bool in_place = flat && w.type == LowBit::kFp32 && kern.dot_f32_tile != nullptr;
  const std::int64_t tile_rows = std::clamp<std::int64_t>(kTileBytes / std::max<std::int64_t>(4 * k, 1), kTileRows, 64);
  const auto widen_row = flat ? kern.widen_row : dequantize_stored_row;
  float* tile = in_place ? nullptr : arena.get<float>(kSlotWidenTile, tile_rows * k);
  for (std::int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const std::int64_t rows = std::min(tile_rows, r1 - t0);
    const float* rows_at = tile;
    std::int64_t ldw = k;
    if (in_place) {
      rows_at = reinterpret_cast<const float*>(w.data.data() + t0 * w.row_bytes);
      ldw = w.row_bytes / 4;
    } else {
      for (std::int64_t r = 0; r < rows; ++r) widen_row(w, t0 + r, tile + r * k);
    }
    if (kern.dot_f32_tile != nullptr) {
      kern.dot_f32_tile(rows_at, ldw, rows, x, m, k, y + t0, n);
    } else {
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t r = 0; r < rows; ++r) y[i * n + t0 + r] = kern.dot_f32(rows_at + r * ldw, x + i * k, k);
    }
  }
}

// One parallel pass over the work units (rows on the float path, 8-row groups
// on the integer path) of several matrices laid end to end: fn(i, u0, u1, arena)
// covers units [u0, u1) of matrix i with the running thread's arena of `ws`.
template <typename Fn>
void parallel_over(std::span<const MatmulOutput> outs, std::int64_t (*units)(const QuantMatrix&), std::int64_t grain,
                   ThreadPool& pool, Workspace& ws, const Fn& fn) {
  std::int64_t total = 0;
  for (const MatmulOutput& o : outs) total += units(*o.w);
  ws.fit(pool.size());
  pool.parallel_for_threads(
      total,
      [&](int thread, std::int64_t u0, std::int64_t u1) {
        std::int64_t start = 0;
        for (std::size_t i = 0; i < outs.size() && start < u1; ++i) {
          const std::int64_t end = start + units(*outs[i].w);
          if (end > u0) fn(i, std::max(u0, start) - start, std::min(u1, end) - start, ws.arena(thread));
          start = end;
        }
      },
      grain);
}

std::int64_t row_units(const QuantMatrix& w) { return w.rows; }
std::int64_t group_units(const QuantMatrix& w) { return (w.rows + kInterleaveRows - 1) / kInterleaveRows; }

// Which kernels a matrix's product takes.
// kKQuant and kQ8_1Blocks: the block formats kept as stored (kquant.h), with Q8_K or Q8_1 activations.
enum class Path { kFloat, kInt8, kInt16, kBf16, kKQuant, kQ8_1Blocks };

Path path_of(const QuantMatrix& w) {
  const ActivationBlocks blocks = format_traits(w.type).activation_blocks;
  if (blocks == ActivationBlocks::kQ8_K || blocks == ActivationBlocks::kQ8_1) {
    if (w.activations == Activations::kF32) return Path::kFloat;
    return blocks == ActivationBlocks::kQ8_K ? Path::kKQuant : Path::kQ8_1Blocks;
  }
  if (w.activations == Activations::kF32 || !can_interleave(w)) return Path::kFloat;
  switch (w.activations) {
    case Activations::kInt8: return Path::kInt8;
    case Activations::kInt16: return Path::kInt16;
    default: return Path::kBf16;
  }
}

// Tokens of one tile call: as many as kern.tile_chunk_bytes of activations hold (token_bytes each), in
// multiples of kern.tile_chunk_tokens.
std::int64_t tile_chunk(const detail::RowKernels& kern, std::int64_t token_bytes) {
  const std::int64_t grain = kern.tile_chunk_tokens;
  return std::max(grain, kern.tile_chunk_bytes / token_bytes / grain * grain);
}

// The tile kernel `tile` of every matrix of `outs` (all interleaved) over activations `a` of m tokens:
// one parallel pass over 8-row groups, tokens in chunks of `chunk`.
template <typename Activations, typename Tile>
void tiles_over(std::span<const MatmulOutput> outs, const Activations& a, std::int64_t m, std::int64_t chunk,
                ThreadPool& pool, Workspace& ws, Tile tile) {
  for (const MatmulOutput& o : outs)
    if (o.w->interleave != kInterleaveRows)
      fail("matmul: a [{}, {}] {} matrix with {} activations must be prepared first (prepare_for_kernels)",
           o.w->rows, o.w->cols, low_bit_name(o.w->type), activations_name(o.w->activations));
  parallel_over(outs, group_units, kQ8GroupGrain, pool, ws,
                [&](std::size_t i, std::int64_t g0, std::int64_t g1, ScratchArena& arena) {
                  for (std::int64_t t0 = 0; t0 < m; t0 += chunk)
                    tile(*outs[i].w, g0, g1, a, t0, std::min(chunk, m - t0), outs[i].y, arena);
                });
}

// Rows of a block-format matrix per pass over the tokens (prefill): their blocks stay in L1 while the
// tokens' activations stream from L2.
constexpr std::int64_t kKQuantTileRows = 4;

// The path of the block formats kept as stored (all of `outs` take the same activation blocks, Q8_K
// or Q8_1): x [m, K] quantized once (tokens in parallel), then each output y[t, r] = kquant_dot(row r,
// token t), rows in parallel. Every output is the same call whatever m.
void kquant_matmul(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool, Workspace& ws,
                   Isa isa) {
  const std::int64_t k = outs[0].w->cols;
  const kquant::Format& format = *kquant::find(outs[0].w->type);
  const std::int64_t token_bytes = kquant::activation_bytes(format, k);
  ws.q8k.resize(static_cast<std::size_t>(m * token_bytes));
  std::uint8_t* a = ws.q8k.data();
  pool.parallel_for(m, [&](std::int64_t t0, std::int64_t t1) {
    for (std::int64_t t = t0; t < t1; ++t) kquant::quantize_activations(format, x + t * k, k, a + t * token_bytes);
  });
  parallel_over(outs, row_units, m < kTiledMinRows ? 8 : kKQuantTileRows, pool, ws,
                [&](std::size_t i, std::int64_t r0, std::int64_t r1, ScratchArena&) {
                  const QuantMatrix& w = *outs[i].w;
                  const KQuantDot dot = kquant_dot(w.type, isa);
                  const std::int64_t blocks = w.groups_per_row;
                  float* y = outs[i].y;
                  float out[kKQuantTokens];
                  for (std::int64_t g = r0; g < r1; g += kKQuantTileRows)
                    for (std::int64_t t = 0; t < m; t += kKQuantTokens) {
                      const int tokens = static_cast<int>(std::min<std::int64_t>(kKQuantTokens, m - t));
                      for (std::int64_t r = g; r < std::min(r1, g + kKQuantTileRows); ++r) {
                        dot(w.data.data() + r * w.row_bytes, a + t * token_bytes, token_bytes, tokens, blocks, out);
                        for (int j = 0; j < tokens; ++j) y[(t + j) * w.rows + r] = out[j];
                      }
                    }
                });
}

// Every matrix of `outs` takes the same path and reads x as given (no act-order).
void matmul_same_path(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool,
                      Workspace& ws, Isa isa) {
  const detail::RowKernels& kern = detail::kernels(isa);
  const std::int64_t k = outs[0].w->cols;
  switch (path_of(*outs[0].w)) {
    case Path::kFloat: {
      const std::int64_t grain = m < kTiledMinRows ? 1 : kTileRows;
      parallel_over(outs, row_units, grain, pool, ws,
                    [&](std::size_t i, std::int64_t r0, std::int64_t r1, ScratchArena& arena) {
                      float_rows(*outs[i].w, x, m, outs[i].y, kern, r0, r1, arena);
                    });
      return;
    }
    case Path::kInt8:
    case Path::kInt16: {
      Q8Activations& buffer = ws.q8;
      const bool wide = path_of(*outs[0].w) == Path::kInt16;
      if (wide) quantize_activations_int16(x, m, k, buffer, isa, &pool);
      else quantize_activations(x, m, k, buffer, isa, &pool);
      const std::int64_t token_bytes = (wide ? 2 : 1) * buffer.padded * kQ8Block;
      const std::int64_t chunk = tile_chunk(kern, token_bytes);
      return tiles_over(outs, buffer, m, wide ? std::max(kBf16ChunkTokens, chunk) : chunk, pool, ws, kern.tile_q8);
    }
    case Path::kKQuant:
    case Path::kQ8_1Blocks: return kquant_matmul(outs, x, m, pool, ws, isa);
    case Path::kBf16: {
      Bf16Activations& buffer = ws.bf16;
      round_activations_bf16(x, m, k, buffer, kern.round_bf16);
      const std::int64_t bytes = buffer.stride() * static_cast<std::int64_t>(sizeof(std::uint16_t));
      return tiles_over(outs, buffer, m, std::max(kBf16ChunkTokens, tile_chunk(kern, bytes)), pool, ws,
                        kern.tile_bf16);
    }
  }
}

}  // namespace

float dot(const float* a, const float* b, std::int64_t n, Isa isa) { return detail::kernels(isa).dot_f32(a, b, n); }

void axpy(float a, const float* x, float* y, std::int64_t n, Isa isa) { detail::kernels(isa).axpy(a, x, y, n); }

void widen_row(const QuantMatrix& w, std::int64_t row, float* out, Isa isa) {
  if (w.interleave != 1) fail("widen_row: a [{}, {}] {} matrix is interleaved", w.rows, w.cols, low_bit_name(w.type));
  detail::kernels(isa).widen_row(w, row, out);
}

bool uses_q8_path(const QuantMatrix& w) { return path_of(w) == Path::kInt8 || path_of(w) == Path::kInt16; }

bool uses_bf16_path(const QuantMatrix& w) { return path_of(w) == Path::kBf16; }

void prepare_for_kernels(QuantMatrix& w, ThreadPool* pool) {
  if (path_of(w) != Path::kFloat && path_of(w) != Path::kKQuant && path_of(w) != Path::kQ8_1Blocks)
    interleave_rows(w, pool);
}

bool has_group_rule(const QuantSpec& spec) {
  return format_traits(spec.type).fit_group != nullptr && spec.rounding != Rounding::kGgml;
}

bool quantize_row_groups(LowBit type, Int4Range range, const float* x, std::int64_t cols, std::int64_t group,
                         std::int32_t* q, GroupRule* rules, Isa isa) {
  if (group < 1) fail("quantize_row_groups: group {} (give cols for one group per row)", group);
  return detail::kernels(isa).quantize_groups(type, range, x, cols, group, q, rules);
}

QuantMatrix quantize_for_kernels(const RowReader& read_row, std::int64_t rows, std::int64_t cols,
                                 const QuantSpec& spec, Activations activations, ThreadPool& pool, Isa isa) {
  QuantMatrix w = matrix_layout(rows, cols, spec);
  w.activations = activations;
  const Path path = path_of(w);
  if (path == Path::kFloat || path == Path::kKQuant || path == Path::kQ8_1Blocks || !has_group_rule(spec)) {
    w = quantize_matrix(read_row, rows, cols, spec, &pool);
    w.activations = activations;
    prepare_for_kernels(w, &pool);
    return w;
  }
  w = allocate_interleaved(rows, cols, spec);
  w.activations = activations;
  pool.parallel_for(
      (rows + kInterleaveRows - 1) / kInterleaveRows,
      [&](std::int64_t g0, std::int64_t g1) {
        std::vector<float> row(static_cast<std::size_t>(cols));
        std::vector<std::int32_t> q(static_cast<std::size_t>((cols + kInterleaveBlock - 1) / kInterleaveBlock *
                                                             kInterleaveBlock));  // zero past cols
        std::vector<GroupRule> rules(static_cast<std::size_t>(w.groups_per_row));
        for (std::int64_t r = g0 * kInterleaveRows; r < std::min(rows, g1 * kInterleaveRows); ++r) {
          read_row(r, row.data());
          bool finite = false;
          try {
            finite = quantize_row_groups(w.type, w.int4_range, row.data(), cols, w.group_size, q.data(), rules.data(),
                                         isa);
          } catch (const Error& e) {
            fail("row {}: {}", r, e.what());
          }
          if (!finite) require_finite_row(row.data(), cols, r);
          put_interleaved_row(w, r, q.data(), rules.data());
        }
      },
      2);
  return w;
}

void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool, Workspace& ws,
            Isa isa) {
  const MatmulOutput out{&w, y};
  matmul_shared_input(std::span(&out, 1), x, m, pool, ws, isa);
}

void matmul(const QuantMatrix& w, const float* x, std::int64_t m, float* y, ThreadPool& pool, Isa isa) {
  Workspace ws;
  matmul(w, x, m, y, pool, ws, isa);
}

void matmul_shared_input(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool,
                         Isa isa) {
  Workspace ws;
  matmul_shared_input(outs, x, m, pool, ws, isa);
}

void matmul_shared_input(std::span<const MatmulOutput> outs, const float* x, std::int64_t m, ThreadPool& pool,
                         Workspace& ws, Isa isa) {
  if (outs.empty()) return;
  for (const MatmulOutput& o : outs)
    if (o.w->cols != outs[0].w->cols)
      fail("matmul: matrices of {} and {} inputs cannot share one input", outs[0].w->cols, o.w->cols);
  bool same = true;
  for (const MatmulOutput& o : outs)
    same = same && o.w->input_order.empty() && path_of(*o.w) == path_of(*outs[0].w);
  if (same) return matmul_same_path(outs, x, m, pool, ws, isa);
  for (const MatmulOutput& o : outs) {
    const float* in = x;
    if (!o.w->input_order.empty()) {
      // Act-order: gather the inputs into storage order once per matrix.
      std::vector<float>& gathered = ws.gathered;
      gathered.resize(static_cast<std::size_t>(m * o.w->cols));
      for (std::int64_t i = 0; i < m; ++i)
        for (std::int64_t k = 0; k < o.w->cols; ++k)
          gathered[static_cast<std::size_t>(i * o.w->cols + k)] =
              x[i * o.w->cols + o.w->input_order[static_cast<std::size_t>(k)]];
      in = gathered.data();
    }
    const MatmulOutput one = o;
    matmul_same_path(std::span(&one, 1), in, m, pool, ws, isa);
  }
}

}  // namespace woq
