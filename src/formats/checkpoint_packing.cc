#include "formats/checkpoint_packing.h"

#include <algorithm>
#include <atomic>
#include <functional>

#include <fmt/core.h>

#include "core/error.h"
#include "core/thread_pool.h"

namespace woq {

namespace {

std::uint32_t field(std::int32_t word, int bits, std::int64_t slot) {
  return (static_cast<std::uint32_t>(word) >> (bits * slot)) & ((1u << bits) - 1);
}

void put_field(std::int32_t& word, int bits, std::int64_t slot, std::uint32_t v) {
  word = static_cast<std::int32_t>(static_cast<std::uint32_t>(word) | (v << (bits * slot)));
}

void check_bits(int bits) {
  if (bits != 4 && bits != 8) fail("bits = {} is not supported (woq reads 4- and 8-bit weights)", bits);
}

template <typename T>
void check_size(const std::vector<T>& v, std::int64_t want, const char* what) {
  if (static_cast<std::int64_t>(v.size()) != want) fail("{} holds {} values, expected {}", what, v.size(), want);
}

IntMatrix empty_matrix(int bits, std::int64_t n, std::int64_t k, std::int64_t groups) {
  IntMatrix m;
  m.bits = bits;
  m.rows = n;
  m.cols = k;
  m.groups = groups;
  m.q.resize(static_cast<std::size_t>(n * k));
  m.zero.resize(static_cast<std::size_t>(n * groups));
  return m;
}

// fn(n0, n1) over the rows [0, n) in spans of whole octets of rows (packed words hold 8 rows' fields at most:
// the spans write disjoint words), split over `pool` when given.
void over_row_octets(std::int64_t n, ThreadPool* pool, const std::function<void(std::int64_t, std::int64_t)>& fn) {
  if (pool == nullptr) return fn(0, n);
  pool->parallel_for((n + 7) / 8, [&](std::int64_t o0, std::int64_t o1) { fn(o0 * 8, std::min(n, o1 * 8)); });
}

}  // namespace

GptqTensors pack_gptq(const IntMatrix& m, GptqZeros zeros, ThreadPool* pool) {
  check_bits(m.bits);
  GptqTensors t;
  t.bits = m.bits;
  t.k = m.cols;
  t.n = m.rows;
  t.groups = m.groups;
  const std::int64_t per_word = 32 / m.bits;
  t.qweight.assign(static_cast<std::size_t>(t.qweight_rows() * t.n), 0);
  t.qzeros.assign(static_cast<std::size_t>(t.groups * t.qzeros_cols()), 0);
  t.scales.resize(static_cast<std::size_t>(t.groups * t.n));
  t.g_idx = m.g_idx;
  if (zeros == GptqZeros::kV1)
    for (std::int64_t n = 0; n < m.rows; ++n)
      for (std::int64_t g = 0; g < m.groups; ++g)
        if (m.zero[static_cast<std::size_t>(n * m.groups + g)] == 0)
          fail("row {} group {} has zero point 0, which GPTQ v1 cannot store (it would be written as -1); "
               "write the v2 format (checkpoint_format gptq_v2) instead",
               n, g);
  over_row_octets(m.rows, pool, [&](std::int64_t n0, std::int64_t n1) {
    for (std::int64_t n = n0; n < n1; ++n) {
      for (std::int64_t k = 0; k < m.cols; ++k)
        put_field(t.qweight[static_cast<std::size_t>(k / per_word * t.n + n)], m.bits, k % per_word,
                  m.q[static_cast<std::size_t>(n * m.cols + k)]);
      for (std::int64_t g = 0; g < m.groups; ++g) {
        const std::uint16_t zero = m.zero[static_cast<std::size_t>(n * m.groups + g)];
        put_field(t.qzeros[static_cast<std::size_t>(g * t.qzeros_cols() + n / per_word)], m.bits, n % per_word,
                  zeros == GptqZeros::kV1 ? zero - 1u : zero);
        t.scales[static_cast<std::size_t>(g * t.n + n)] = m.scale[static_cast<std::size_t>(n * m.groups + g)];
      }
    }
  });
  return t;
}

IntMatrix unpack_gptq(const GptqTensors& t, GptqZeros zeros, bool sym, std::vector<std::string>& warnings,
                      ThreadPool* pool) {
  check_bits(t.bits);
  check_size(t.qweight, t.qweight_rows() * t.n, "qweight");
  check_size(t.qzeros, t.groups * t.qzeros_cols(), "qzeros");
  check_size(t.scales, t.groups * t.n, "scales");
  check_size(t.g_idx, t.k, "g_idx");
  const std::int64_t per_word = 32 / t.bits;
  const std::uint32_t sym_zero = 1u << (t.bits - 1);
  const std::uint32_t all_ones = (1u << t.bits) - 1;
  bool add_one = zeros == GptqZeros::kV1;
  if (add_one && sym) {
    bool all_v2 = true;
    for (std::int64_t g = 0; g < t.groups && all_v2; ++g)
      for (std::int64_t n = 0; n < t.n && all_v2; ++n)
        all_v2 = field(t.qzeros[static_cast<std::size_t>(g * t.qzeros_cols() + n / per_word)], t.bits, n % per_word) ==
                 sym_zero;
    if (all_v2) {
      warnings.push_back(fmt::format(
          "the checkpoint says GPTQ v1 but every stored zero is {} (the v2 value; v1 stores {}): read as gptq_v2",
          sym_zero, sym_zero - 1));
      add_one = false;
    }
  }
  IntMatrix m = empty_matrix(t.bits, t.n, t.k, t.groups);
  m.scale.resize(static_cast<std::size_t>(t.n * t.groups));
  m.g_idx = t.g_idx;
  std::atomic<bool> wrapped = false;
  // Blocks of columns: qweight rows are read contiguously within a block
  // while each output row receives 32 / bits consecutive values per word.
  constexpr std::int64_t kColumns = 64;
  auto unpack = [&](std::int64_t b0, std::int64_t b1) {
    for (std::int64_t n0 = b0 * kColumns; n0 < std::min(t.n, b1 * kColumns); n0 += kColumns) {
      const std::int64_t n1 = std::min(t.n, n0 + kColumns);
      for (std::int64_t w = 0; w < t.qweight_rows(); ++w)
        for (std::int64_t n = n0; n < n1; ++n) {
          const std::int32_t word = t.qweight[static_cast<std::size_t>(w * t.n + n)];
          std::uint8_t* dst = m.q.data() + n * t.k;
          for (std::int64_t j = 0; j < per_word && w * per_word + j < t.k; ++j)
            dst[w * per_word + j] = static_cast<std::uint8_t>(field(word, t.bits, j));
        }
      for (std::int64_t n = n0; n < n1; ++n)
        for (std::int64_t g = 0; g < t.groups; ++g) {
          std::uint32_t z =
              field(t.qzeros[static_cast<std::size_t>(g * t.qzeros_cols() + n / per_word)], t.bits, n % per_word);
          if (add_one) {
            if (z == all_ones) wrapped = true;
            z = (z + 1) & all_ones;
          }
          m.zero[static_cast<std::size_t>(n * t.groups + g)] = static_cast<std::uint16_t>(z);
          m.scale[static_cast<std::size_t>(n * t.groups + g)] = t.scales[static_cast<std::size_t>(g * t.n + n)];
        }
    }
  };
  const std::int64_t blocks = (t.n + kColumns - 1) / kColumns;
  if (pool != nullptr) {
    pool->parallel_for(blocks, unpack);
  } else {
    unpack(0, blocks);
  }
  if (wrapped)
    warnings.push_back(fmt::format("some v1 qzeros hold {} (a zero of 0 written as -1): read as 0, as AutoGPTQ does",
                                   all_ones));
  return m;
}

IntMatrix unpack_pack_quantized(const PackQuantizedTensors& t, std::int64_t group_size) {
  check_bits(t.bits);
  const std::int64_t per_word = 32 / t.bits;
  const std::int64_t words_per_row = (t.k + per_word - 1) / per_word;
  check_size(t.weight_packed, t.n * words_per_row, "weight_packed");
  check_size(t.weight_scale, t.n * t.groups, "weight_scale");
  if (!t.weight_zero_point.empty())
    check_size(t.weight_zero_point, (t.n + per_word - 1) / per_word * t.groups, "weight_zero_point");
  IntMatrix m = empty_matrix(t.bits, t.n, t.k, t.groups);
  m.scale = t.weight_scale;
  if (t.g_idx.empty()) {
    const std::int64_t g = group_size == -1 ? t.k : group_size;
    m.g_idx.resize(static_cast<std::size_t>(t.k));
    for (std::int64_t k = 0; k < t.k; ++k) m.g_idx[static_cast<std::size_t>(k)] = static_cast<std::int32_t>(k / g);
  } else {
    check_size(t.g_idx, t.k, "weight_g_idx");
    m.g_idx = t.g_idx;
  }
  const std::uint16_t offset = static_cast<std::uint16_t>(1u << (t.bits - 1));
  for (std::int64_t n = 0; n < t.n; ++n) {
    for (std::int64_t k = 0; k < t.k; ++k)
      m.q[static_cast<std::size_t>(n * t.k + k)] = static_cast<std::uint8_t>(
          field(t.weight_packed[static_cast<std::size_t>(n * words_per_row + k / per_word)], t.bits, k % per_word));
    for (std::int64_t g = 0; g < t.groups; ++g)
      m.zero[static_cast<std::size_t>(n * t.groups + g)] =
          t.weight_zero_point.empty()
              ? offset
              : static_cast<std::uint16_t>(field(
                    t.weight_zero_point[static_cast<std::size_t>(n / per_word * t.groups + g)], t.bits, n % per_word));
  }
  return m;
}

std::vector<std::int64_t> AwqTensors::qweight_shape() const {
  return version == AwqVersion::kGemm ? std::vector<std::int64_t>{k, n / 8} : std::vector<std::int64_t>{n, k / 8};
}

std::vector<std::int64_t> AwqTensors::qzeros_shape() const {
  return version == AwqVersion::kGemm ? std::vector<std::int64_t>{groups, n / 8}
                                      : std::vector<std::int64_t>{n, zeros_width};
}

std::vector<std::int64_t> AwqTensors::scales_shape() const {
  return version == AwqVersion::kGemm ? std::vector<std::int64_t>{groups, n}
                                      : std::vector<std::int64_t>{n, 8 * zeros_width};
}

std::int64_t awq_gemv_zeros_width(std::int64_t k, std::int64_t group_size) {
  const std::int64_t multiple = group_size >= 128 ? 1 : group_size == 64 ? 2 : group_size == 32 ? 4 : 0;
  if (multiple == 0) fail("AWQ GEMV has group sizes 32, 64 and >= 128, not {}", group_size);
  const std::int64_t words = (k / group_size + 7) / 8;
  return (words + multiple - 1) / multiple * multiple;
}

AwqTensors awq_layout(AwqVersion version, std::int64_t n, std::int64_t k, std::int64_t group_size) {
  const std::int64_t g = group_size == -1 ? k : group_size;
  if (g <= 0 || n <= 0 || k <= 0) fail("AWQ layout of [{}, {}] with group_size {}", n, k, group_size);
  if (n % 8 != 0) fail("N = {} is not a multiple of 8, which AWQ's packing along N needs", n);
  if (k % g != 0) fail("K = {} is not a multiple of group_size {}, which AWQ needs", k, g);
  if (version == AwqVersion::kGemv && k % 8 != 0) fail("K = {} is not a multiple of 8, which AWQ GEMV needs", k);
  AwqTensors t;
  t.version = version;
  t.n = n;
  t.k = k;
  t.groups = k / g;
  if (version == AwqVersion::kGemv) t.zeros_width = awq_gemv_zeros_width(k, g);
  const auto numel = [](const std::vector<std::int64_t>& shape) { return static_cast<std::size_t>(shape[0] * shape[1]); };
  t.qweight.assign(numel(t.qweight_shape()), 0);
  t.qzeros.assign(numel(t.qzeros_shape()), 0);
  t.scales.assign(numel(t.scales_shape()), 0);
  return t;
}

namespace {

// Where AWQ keeps value (n, k), zero (n, g) and scale (n, g): word index and nibble, or element index.
struct AwqIndex {
  const AwqTensors& t;
  std::pair<std::size_t, int> weight(std::int64_t n, std::int64_t k) const {
    if (t.version == AwqVersion::kGemm) return {static_cast<std::size_t>(k * (t.n / 8) + n / 8), nibble_of(n)};
    return {static_cast<std::size_t>(n * (t.k / 8) + k / 8), static_cast<int>(k % 8)};
  }
  std::pair<std::size_t, int> zero(std::int64_t n, std::int64_t g) const {
    if (t.version == AwqVersion::kGemm) return {static_cast<std::size_t>(g * (t.n / 8) + n / 8), nibble_of(n)};
    return {static_cast<std::size_t>(n * t.zeros_width + g / 8), static_cast<int>(g % 8)};
  }
  std::size_t scale(std::int64_t n, std::int64_t g) const {
    return static_cast<std::size_t>(t.version == AwqVersion::kGemm ? g * t.n + n : n * 8 * t.zeros_width + g);
  }
  static int nibble_of(std::int64_t n) {  // the j with kAwqOrder[j] = n % 8
    for (int j = 0; j < 8; ++j)
      if (kAwqOrder[j] == n % 8) return j;
    return 0;
  }
};

}  // namespace

AwqTensors pack_awq(const IntMatrix& m, AwqVersion version, std::int64_t group_size, ThreadPool* pool) {
  if (m.bits != 4) fail("AWQ stores 4-bit weights, not {}-bit", m.bits);
  AwqTensors t = awq_layout(version, m.rows, m.cols, group_size);
  if (m.groups != t.groups) fail("{} groups per row, but group_size {} gives {}", m.groups, group_size, t.groups);
  const std::int64_t g_len = m.cols / t.groups;
  for (std::int64_t k = 0; k < m.cols; ++k)
    if (!m.g_idx.empty() && m.g_idx[static_cast<std::size_t>(k)] != k / g_len)
      fail("input feature {} is in group {}: AWQ has no act order (g_idx)", k, m.g_idx[static_cast<std::size_t>(k)]);
  const AwqIndex at{t};
  over_row_octets(m.rows, pool, [&](std::int64_t n0, std::int64_t n1) {
    for (std::int64_t n = n0; n < n1; ++n) {
      for (std::int64_t k = 0; k < m.cols; ++k) {
        const auto [word, slot] = at.weight(n, k);
        put_field(t.qweight[word], 4, slot, m.q[static_cast<std::size_t>(n * m.cols + k)]);
      }
      for (std::int64_t g = 0; g < t.groups; ++g) {
        const auto [word, slot] = at.zero(n, g);
        put_field(t.qzeros[word], 4, slot, m.zero[static_cast<std::size_t>(n * m.groups + g)]);
        t.scales[at.scale(n, g)] = m.scale[static_cast<std::size_t>(n * m.groups + g)];
      }
    }
  });
  return t;
}

IntMatrix unpack_awq(const AwqTensors& t, ThreadPool* pool) {
  const AwqTensors sized = awq_layout(t.version, t.n, t.k, t.k / std::max<std::int64_t>(t.groups, 1));
  check_size(t.qweight, static_cast<std::int64_t>(sized.qweight.size()), "qweight");
  check_size(t.qzeros, static_cast<std::int64_t>(sized.qzeros.size()), "qzeros");
  check_size(t.scales, static_cast<std::int64_t>(sized.scales.size()), "scales");
  IntMatrix m = empty_matrix(4, t.n, t.k, t.groups);
  m.scale.resize(static_cast<std::size_t>(t.n * t.groups));
  m.g_idx.resize(static_cast<std::size_t>(t.k));
  const std::int64_t g_len = t.k / t.groups;
  for (std::int64_t k = 0; k < t.k; ++k) m.g_idx[static_cast<std::size_t>(k)] = static_cast<std::int32_t>(k / g_len);
  const AwqIndex at{t};
  const auto rows = [&](std::int64_t n0, std::int64_t n1) {
    for (std::int64_t n = n0; n < n1; ++n) {
      for (std::int64_t k = 0; k < t.k; ++k) {
        const auto [word, slot] = at.weight(n, k);
        m.q[static_cast<std::size_t>(n * t.k + k)] = static_cast<std::uint8_t>(field(t.qweight[word], 4, slot));
      }
      for (std::int64_t g = 0; g < t.groups; ++g) {
        const auto [word, slot] = at.zero(n, g);
        m.zero[static_cast<std::size_t>(n * t.groups + g)] = static_cast<std::uint16_t>(field(t.qzeros[word], 4, slot));
        m.scale[static_cast<std::size_t>(n * t.groups + g)] = t.scales[at.scale(n, g)];
      }
    }
  };
  if (pool != nullptr) {
    pool->parallel_for(t.n, rows);
  } else {
    rows(0, t.n);
  }
  return m;
}

}  // namespace woq
