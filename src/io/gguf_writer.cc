#include "io/gguf_writer.h"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "core/error.h"

namespace woq {

namespace {

constexpr std::uint64_t kAlignment = 32;

void put_bytes(std::vector<std::uint8_t>& out, const void* p, std::size_t n) {
  const std::size_t at = out.size();
  out.resize(at + n);
  if (n > 0) std::memcpy(out.data() + at, p, n);
}

template <typename T>
void put(std::vector<std::uint8_t>& out, T v) {
  put_bytes(out, &v, sizeof v);
}

void put_string(std::vector<std::uint8_t>& out, std::string_view s) {
  put<std::uint64_t>(out, s.size());
  put_bytes(out, s.data(), s.size());
}

void put_type(std::vector<std::uint8_t>& out, GgufValueType t) { put<std::uint32_t>(out, static_cast<std::uint32_t>(t)); }

std::vector<std::uint8_t> scalar(GgufValueType t, const void* v, std::size_t n) {
  std::vector<std::uint8_t> out;
  put_type(out, t);
  put_bytes(out, v, n);
  return out;
}

template <typename T>
std::vector<std::uint8_t> array(GgufValueType element, const std::vector<T>& v) {
  std::vector<std::uint8_t> out;
  put_type(out, GgufValueType::kArray);
  put_type(out, element);
  put<std::uint64_t>(out, v.size());
  for (const T& x : v) put(out, x);
  return out;
}

// Bytes of one element of a scalar GGUF type.
std::size_t element_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    default: return 8;
  }
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace

void GgufWriter::set(std::string_view key, std::vector<std::uint8_t> value) {
  for (Pair& p : kv_)
    if (p.key == key) {
      p.value = std::move(value);
      return;
    }
  kv_.push_back({std::string(key), std::move(value)});
}

void GgufWriter::set_u32(std::string_view key, std::uint32_t v) { set(key, scalar(GgufValueType::kUint32, &v, 4)); }
void GgufWriter::set_f32(std::string_view key, float v) { set(key, scalar(GgufValueType::kFloat32, &v, 4)); }
void GgufWriter::set_bool(std::string_view key, bool v) {
  const std::uint8_t b = v ? 1 : 0;
  set(key, scalar(GgufValueType::kBool, &b, 1));
}
void GgufWriter::set_string(std::string_view key, std::string_view v) {
  std::vector<std::uint8_t> out;
  put_type(out, GgufValueType::kString);
  put_string(out, v);
  set(key, std::move(out));
}
void GgufWriter::set_strings(std::string_view key, const std::vector<std::string>& v) {
  std::vector<std::uint8_t> out;
  put_type(out, GgufValueType::kArray);
  put_type(out, GgufValueType::kString);
  put<std::uint64_t>(out, v.size());
  for (const std::string& s : v) put_string(out, s);
  set(key, std::move(out));
}
void GgufWriter::set_f32s(std::string_view key, const std::vector<float>& v) { set(key, array(GgufValueType::kFloat32, v)); }
void GgufWriter::set_i32s(std::string_view key, const std::vector<std::int32_t>& v) { set(key, array(GgufValueType::kInt32, v)); }

void GgufWriter::set_value(std::string_view key, const GgufValue& v) {
  std::vector<std::uint8_t> out;
  put_type(out, v.type);
  switch (v.type) {
    case GgufValueType::kString: put_string(out, v.s); break;
    case GgufValueType::kArray:
      put_type(out, v.element_type);
      put<std::uint64_t>(out, v.count);
      if (v.element_type == GgufValueType::kString) {
        for (const std::string_view s : v.strings) put_string(out, s);
      } else {
        put_bytes(out, v.raw.data(), v.raw.size());
      }
      break;
    case GgufValueType::kFloat32: put(out, static_cast<float>(v.f)); break;
    case GgufValueType::kFloat64: put(out, v.f); break;
    default: {  // integers and bool: the low bytes of u, little-endian
      const std::uint64_t u = v.u;
      put_bytes(out, &u, element_size(v.type));
    }
  }
  set(key, std::move(out));
}

bool GgufWriter::has(std::string_view key) const {
  for (const Pair& p : kv_)
    if (p.key == key) return true;
  return false;
}

void GgufWriter::add_tensor(std::string name, std::vector<std::int64_t> ne, GgmlType type, Fill fill) {
  for (const Tensor& t : tensors_)
    if (t.name == name) fail("GGUF writer: tensor '{}' added twice", name);
  const GgmlTypeTraits& traits = ggml_type_traits(type);
  if (ne.empty() || ne.size() > 4 || ne[0] % traits.block_size != 0)
    fail("GGUF writer: tensor '{}': {} dimensions with rows of {} cannot be stored as {}", name, ne.size(),
         ne.empty() ? 0 : ne[0], traits.name);
  std::uint64_t rows = 1;
  for (std::size_t d = 1; d < ne.size(); ++d) rows *= static_cast<std::uint64_t>(ne[d]);
  const auto bytes = rows * static_cast<std::uint64_t>(ggml_row_bytes(traits, ne[0]));
  tensors_.push_back({std::move(name), std::move(ne), type, std::move(fill), bytes});
}

void GgufWriter::write(const std::string& path) const {
  std::vector<std::uint8_t> header;
  put_bytes(header, "GGUF", 4);
  put<std::uint32_t>(header, 3);
  put<std::uint64_t>(header, tensors_.size());
  put<std::uint64_t>(header, kv_.size());
  for (const Pair& p : kv_) {
    put_string(header, p.key);
    put_bytes(header, p.value.data(), p.value.size());
  }
  std::uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    put_string(header, t.name);
    put<std::uint32_t>(header, static_cast<std::uint32_t>(t.ne.size()));
    for (const std::int64_t n : t.ne) put<std::uint64_t>(header, static_cast<std::uint64_t>(n));
    put<std::uint32_t>(header, static_cast<std::uint32_t>(t.type));
    put<std::uint64_t>(header, offset);
    offset += (t.bytes + kAlignment - 1) / kAlignment * kAlignment;
  }
  header.resize((header.size() + kAlignment - 1) / kAlignment * kAlignment, 0);

  const std::string tmp = fmt::format("{}.tmp-{}", path, ::getpid());
  std::unique_ptr<std::FILE, FileCloser> f(std::fopen(tmp.c_str(), "wb"));
  if (!f) fail("{}: cannot create: {}", tmp, std::strerror(errno));
  auto remove_tmp = [&] {
    f.reset();
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
  };
  try {
    auto write_bytes = [&](const std::uint8_t* p, std::size_t n) {
      if (std::fwrite(p, 1, n, f.get()) != n) fail("{}: write failed: {}", tmp, std::strerror(errno));
    };
    write_bytes(header.data(), header.size());
    std::vector<std::uint8_t> buffer;
    for (const Tensor& t : tensors_) {
      buffer.assign(static_cast<std::size_t>((t.bytes + kAlignment - 1) / kAlignment * kAlignment), 0);
      t.fill(std::span<std::uint8_t>(buffer.data(), static_cast<std::size_t>(t.bytes)));
      write_bytes(buffer.data(), buffer.size());
    }
    if (std::fflush(f.get()) != 0 || ::fsync(::fileno(f.get())) != 0)
      fail("{}: write failed: {}", tmp, std::strerror(errno));
    if (std::fclose(f.release()) != 0) fail("{}: close failed: {}", tmp, std::strerror(errno));
    std::filesystem::rename(tmp, path);
  } catch (const std::filesystem::filesystem_error& e) {
    remove_tmp();
    fail("{}: cannot rename {} into place: {}", path, tmp, e.what());
  } catch (...) {
    remove_tmp();
    throw;
  }
}

}  // namespace woq
