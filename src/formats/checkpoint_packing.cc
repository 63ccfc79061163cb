#include "formats/checkpoint_packing.h"

#include <algorithm>
#include <atomic>

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

}  // namespace

GptqTensors pack_gptq(const IntMatrix& m, GptqZeros zeros) {
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
  for (std::int64_t n = 0; n < m.rows; ++n) {
    for (std::int64_t k = 0; k < m.cols; ++k)
      put_field(t.qweight[static_cast<std::size_t>(k / per_word * t.n + n)], m.bits, k % per_word,
                m.q[static_cast<std::size_t>(n * m.cols + k)]);
    for (std::int64_t g = 0; g < m.groups; ++g) {
      const std::uint16_t zero = m.zero[static_cast<std::size_t>(n * m.groups + g)];
      if (zeros == GptqZeros::kV1 && zero == 0)
        fail("row {} group {} has zero point 0, which GPTQ v1 cannot store (it would be written as -1); "
             "write the v2 format (checkpoint_format gptq_v2) instead",
             n, g);
      put_field(t.qzeros[static_cast<std::size_t>(g * t.qzeros_cols() + n / per_word)], m.bits, n % per_word,
                zeros == GptqZeros::kV1 ? zero - 1u : zero);
      t.scales[static_cast<std::size_t>(g * t.n + n)] = m.scale[static_cast<std::size_t>(n * m.groups + g)];
    }
  }
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

}  // namespace woq
