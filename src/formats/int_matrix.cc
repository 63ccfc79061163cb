#include "formats/int_matrix.h"

#include <algorithm>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "formats/format_traits.h"
#include "formats/interleave.h"

namespace woq {

namespace {

std::uint8_t nibble(const std::uint8_t* row, std::int64_t j) {
  return static_cast<std::uint8_t>(j % 2 == 0 ? row[j / 2] & 0x0f : row[j / 2] >> 4);
}

void set_nibble(std::uint8_t* row, std::int64_t j, std::uint8_t v) {
  row[j / 2] = static_cast<std::uint8_t>(j % 2 == 0 ? (row[j / 2] & 0xf0) | v : (row[j / 2] & 0x0f) | (v << 4));
}

// The permutation that sorts features by group (stable), or empty when
// g_idx is already k / group_size. Checks every group's size.
std::vector<std::int32_t> act_order(const IntMatrix& m, std::int64_t group_size) {
  bool identity = true;
  std::vector<std::int64_t> count(static_cast<std::size_t>(m.groups), 0);
  for (std::int64_t k = 0; k < m.cols; ++k) {
    const std::int32_t g = m.g_idx[static_cast<std::size_t>(k)];
    if (g < 0 || g >= m.groups) fail("g_idx[{}] = {} is outside [0, {})", k, g, m.groups);
    ++count[static_cast<std::size_t>(g)];
    identity = identity && g == k / group_size;
  }
  if (identity) return {};
  for (std::int64_t g = 0; g < m.groups; ++g) {
    const std::int64_t want = std::min(group_size, m.cols - g * group_size);
    if (count[static_cast<std::size_t>(g)] != want)
      fail("g_idx maps {} input features to group {}, expected {} (group_size {})", count[static_cast<std::size_t>(g)],
           g, want, group_size);
  }
  std::vector<std::int32_t> order(static_cast<std::size_t>(m.cols));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&m](std::int32_t a, std::int32_t b) {
    return m.g_idx[static_cast<std::size_t>(a)] < m.g_idx[static_cast<std::size_t>(b)];
  });
  return order;
}

}  // namespace

IntMatrix to_int_matrix(const QuantMatrix& stored, ThreadPool* pool) {
  if (!is_quantized(stored.type)) fail("to_int_matrix: {} is not an integer format", low_bit_name(stored.type));
  QuantMatrix flat;
  if (stored.interleave != 1) {
    flat = stored;
    deinterleave_rows(flat);
  }
  const QuantMatrix& w = stored.interleave != 1 ? flat : stored;
  IntMatrix m;
  const FormatTraits& format = format_traits(w.type);
  m.bits = format.value_bits;
  m.rows = w.rows;
  m.cols = w.cols;
  m.groups = w.groups_per_row;
  m.q.resize(static_cast<std::size_t>(w.rows * w.cols));
  m.zero.resize(static_cast<std::size_t>(w.rows * w.groups_per_row));
  m.scale = w.scales;
  m.g_idx.resize(static_cast<std::size_t>(w.cols));
  for (std::int64_t k = 0; k < w.cols; ++k) {
    const std::int64_t feature = w.input_order.empty() ? k : w.input_order[static_cast<std::size_t>(k)];
    m.g_idx[static_cast<std::size_t>(feature)] = static_cast<std::int32_t>(k / w.group_size);
  }
  const auto rows = [&](std::int64_t n0, std::int64_t n1) {
    for (std::int64_t n = n0; n < n1; ++n) {
      const std::uint8_t* src = w.data.data() + n * w.row_bytes;
      std::uint8_t* dst = m.q.data() + n * w.cols;
      for (std::int64_t k = 0; k < w.cols; ++k) {
        const std::int64_t feature = w.input_order.empty() ? k : w.input_order[static_cast<std::size_t>(k)];
        dst[feature] = m.bits == 8 ? static_cast<std::uint8_t>(static_cast<std::int8_t>(src[k]) + 128) : nibble(src, k);
      }
      for (std::int64_t g = 0; g < w.groups_per_row; ++g) {
        const std::size_t i = static_cast<std::size_t>(n * w.groups_per_row + g);
        m.zero[i] = format.fixed_zero >= 0 ? static_cast<std::uint16_t>(format.fixed_zero) : w.zeros[i];
      }
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(w.rows, rows);
  } else {
    rows(0, w.rows);
  }
  return m;
}

QuantMatrix from_int_matrix(const IntMatrix& m, std::int64_t group_size, bool sym, ThreadPool* pool) {
  if (m.bits != 4 && m.bits != 8) fail("bits = {} is not supported (woq reads 4- and 8-bit weights)", m.bits);
  if (m.bits == 8 && !sym)
    fail("8-bit asymmetric weights (sym = false) are not supported: woq has no asym_int8 format");
  const FormatTraits* format = nullptr;  // the grouped format of m.bits whose zero is fixed (sym) or per group
  for (const FormatTraits& f : weight_formats())
    if (f.family == FormatFamily::kGrouped && f.value_bits == m.bits && (f.fixed_zero >= 0) == sym) format = &f;
  if (format == nullptr) fail("{}-bit {}symmetric weights have no woq format", m.bits, sym ? "" : "a");
  QuantMatrix w = allocate_matrix(m.rows, m.cols, QuantSpec{format->type, group_size, Int4Range::kFull});
  if (w.groups_per_row != m.groups)
    fail("{} groups per row, but K = {} with group_size {} needs {}", m.groups, m.cols, group_size, w.groups_per_row);
  const auto size = [](std::int64_t a, std::int64_t b) { return static_cast<std::size_t>(a * b); };
  if (m.q.size() != size(m.rows, m.cols) || m.zero.size() != size(m.rows, m.groups) ||
      m.scale.size() != size(m.rows, m.groups) || m.g_idx.size() != size(1, m.cols))
    fail("from_int_matrix: buffer sizes disagree with [{}, {}] and {} groups", m.rows, m.cols, m.groups);
  w.input_order = act_order(m, w.group_size);
  w.scales = m.scale;
  const auto sym_zero = static_cast<std::uint16_t>(format->fixed_zero);
  auto convert = [&](std::int64_t r0, std::int64_t r1) {
  for (std::int64_t n = r0; n < r1; ++n) {
    for (std::int64_t g = 0; g < m.groups; ++g) {
      const std::size_t i = static_cast<std::size_t>(n * m.groups + g);
      const std::uint16_t z = m.zero[i];
      if (sym && z != sym_zero)
        fail("row {} group {}: zero point {} in a symmetric checkpoint (expected {})", n, g, z, sym_zero);
      if (!sym && z > 15) fail("row {} group {}: zero point {} is outside [0, 15]", n, g, z);
      if (!sym) w.zeros[i] = static_cast<std::uint8_t>(z);
    }
    const std::uint8_t* src = m.q.data() + n * m.cols;
    std::uint8_t* dst = w.data.data() + n * w.row_bytes;
    for (std::int64_t k = 0; k < m.cols; ++k) {
      const std::int64_t feature = w.input_order.empty() ? k : w.input_order[static_cast<std::size_t>(k)];
      const std::uint8_t q = src[feature];
      if (m.bits == 8) {
        dst[k] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q - 128));
      } else {
        if (q > 15) fail("row {} feature {}: value {} does not fit in 4 bits", n, feature, q);
        set_nibble(dst, k, q);
      }
    }
  }
  };
  if (pool != nullptr) {
    pool->parallel_for(m.rows, convert, 16);
  } else {
    convert(0, m.rows);
  }
  return w;
}

}  // namespace woq
