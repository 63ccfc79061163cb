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

// A fixture file read front to back: its magic, a header of u32 (the first 0x4c4d4747), then data.
// Throws std::runtime_error naming the file when it is short, mislabelled or longer than read.
class FixtureReader {
 public:
  FixtureReader(const std::string& file, const char* magic, std::uint32_t* header, std::size_t words)
      : file_(file), bytes_(test::read_file(kGgmlDir + file)) {
    char got[8];
    take(got, 8);
    take(header, words * 4);
    if (std::memcmp(got, magic, 8) != 0 || header[0] != 0x4c4d4747u) throw std::runtime_error("bad " + file);
  }
  void take(void* out, std::size_t len) {
    if (at_ + len > bytes_.size()) throw std::runtime_error(file_ + " is truncated");
    std::memcpy(out, bytes_.data() + at_, len);
    at_ += len;
  }
  void finish() const {
    if (at_ != bytes_.size()) throw std::runtime_error(file_ + " has trailing bytes");
  }

 private:
  std::string file_, bytes_;
  std::size_t at_ = 0;
};

inline Fixture load(const std::string& name) {
  std::uint32_t hdr[4];
  FixtureReader in(name + ".bin", "WOQFIX01", hdr, 4);
  const auto take = [&](void* out, std::size_t len) { in.take(out, len); };
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
  in.finish();
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
