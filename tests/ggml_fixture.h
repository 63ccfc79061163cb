// The ggml fixtures of tests/data/ggml (see its README): made once from ggml's own code.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "formats/ggml_types.h"
#include "test_files.h"

namespace woq::test {

inline const std::string kGgmlDir = std::string(WOQ_TEST_DATA) + "/ggml/";

// One tests/data/ggml/<type>.bin: "WOQFIX01", u32 magic, type, n, nr; then
// x[n] f32 (input), q (ggml's from_float_ref(x)), y[n] (ggml's to_float(q)),
// r (nr elements of random bytes), yr[nr] (ggml's to_float(r)).
struct Fixture {
  std::uint32_t type = 0;
  std::int64_t n = 0, nr = 0;
  std::vector<float> x, y, yr;
  std::vector<std::uint8_t> q, r;
};

inline Fixture load(const std::string& name) {
  const std::string bytes = test::read_file(kGgmlDir + name + ".bin");
  std::size_t at = 0;
  const auto take = [&](void* out, std::size_t len) {
    if (at + len > bytes.size()) throw std::runtime_error(name + ".bin is truncated");
    std::memcpy(out, bytes.data() + at, len);
    at += len;
  };
  char magic[8];
  std::uint32_t hdr[4];
  take(magic, 8);
  take(hdr, sizeof hdr);
  if (std::memcmp(magic, "WOQFIX01", 8) != 0 || hdr[0] != 0x4c4d4747u) throw std::runtime_error("bad " + name);
  Fixture f;
  f.type = hdr[1];
  f.n = hdr[2];
  f.nr = hdr[3];
  const GgmlTypeTraits* t = find_ggml_type(f.type);
  if (t == nullptr) throw std::runtime_error(name + ": unknown type");
  const auto floats = [&](std::vector<float>& v, std::int64_t n) {
    v.resize(static_cast<std::size_t>(n));
    take(v.data(), v.size() * 4);
  };
  const auto blocks = [&](std::vector<std::uint8_t>& v, std::int64_t n) {
    v.resize(static_cast<std::size_t>(ggml_row_bytes(*t, n)));
    take(v.data(), v.size());
  };
  floats(f.x, f.n);
  blocks(f.q, f.n);
  floats(f.y, f.n);
  blocks(f.r, f.nr);
  floats(f.yr, f.nr);
  if (at != bytes.size()) throw std::runtime_error(name + ".bin has trailing bytes");
  return f;
}

inline std::uint32_t bits(float v) { return std::bit_cast<std::uint32_t>(v); }

// Index of the first element whose bits differ, or -1.
inline std::int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (bits(a[i]) != bits(b[i])) return static_cast<std::int64_t>(i);
  return -1;
}

inline std::int64_t first_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<std::int64_t>(i);
  return -1;
}

}  // namespace woq::test
