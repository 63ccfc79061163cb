#include "io/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>

#include "core/error.h"
#include "core/utf8.h"

namespace woq {

namespace {

constexpr std::uint64_t kMaxDims = 4;
constexpr std::int64_t kMaxBytes = std::int64_t{1} << 62;

// Bytes of one element of a scalar type; 0 for strings and arrays.
std::size_t scalar_size(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8: case GgufValueType::kInt8: case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16: case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32: case GgufValueType::kInt32: case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64: case GgufValueType::kInt64: case GgufValueType::kFloat64: return 8;
    case GgufValueType::kString: case GgufValueType::kArray: return 0;
  }
  return 0;
}

bool known_type(std::uint32_t t) { return t <= static_cast<std::uint32_t>(GgufValueType::kFloat64); }

bool is_integer(GgufValueType t) {
  return t != GgufValueType::kFloat32 && t != GgufValueType::kFloat64 && t != GgufValueType::kBool &&
         t != GgufValueType::kString && t != GgufValueType::kArray;
}

// Little-endian scalar at p.
template <typename T>
T load(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// A bounds-checked cursor over the header; every failure names the file and
// what was being read.
class Cursor {
 public:
  Cursor(std::span<const std::uint8_t> bytes, const std::string& path) : b_(bytes), path_(path) {}

  std::size_t pos() const { return pos_; }
  std::size_t left() const { return b_.size() - pos_; }

  std::span<const std::uint8_t> take(std::uint64_t n, std::string_view what) {
    if (n > left())
      fail("{}: truncated: {} needs {} bytes at offset {}, the file has {} left", path_, what, n, pos_, left());
    const auto s = b_.subspan(pos_, static_cast<std::size_t>(n));
    pos_ += static_cast<std::size_t>(n);
    return s;
  }
  template <typename T>
  T read(std::string_view what) {
    return load<T>(take(sizeof(T), what).data());
  }
  std::string_view string(std::string_view what) {
    const auto n = read<std::uint64_t>(what);
    const auto s = take(n, what);
    return {reinterpret_cast<const char*>(s.data()), s.size()};
  }

 private:
  std::span<const std::uint8_t> b_;
  const std::string& path_;
  std::size_t pos_ = 0;
};

// Sets `out`'s fields from the scalar of type `t` stored at `p` (`what` names it for errors).
void read_scalar(GgufValueType t, std::span<const std::uint8_t> p, GgufValue& out, const std::string& path,
                 const std::string& what) {
  switch (t) {
    case GgufValueType::kUint8: out.u = p[0]; break;
    case GgufValueType::kInt8: out.i = load<std::int8_t>(p.data()); break;
    case GgufValueType::kUint16: out.u = load<std::uint16_t>(p.data()); break;
    case GgufValueType::kInt16: out.i = load<std::int16_t>(p.data()); break;
    case GgufValueType::kUint32: out.u = load<std::uint32_t>(p.data()); break;
    case GgufValueType::kInt32: out.i = load<std::int32_t>(p.data()); break;
    case GgufValueType::kUint64: out.u = load<std::uint64_t>(p.data()); break;
    case GgufValueType::kInt64: out.i = load<std::int64_t>(p.data()); break;
    case GgufValueType::kFloat32: out.f = load<float>(p.data()); break;
    case GgufValueType::kFloat64: out.f = load<double>(p.data()); break;
    case GgufValueType::kBool:
      if (p[0] > 1) fail("{}: {} is a bool holding {}", path, what, p[0]);
      out.u = p[0];
      break;
    default: break;
  }
  if (t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
      t == GgufValueType::kUint64 || t == GgufValueType::kBool)
    out.i = static_cast<std::int64_t>(out.u);  // beyond 2^63 - 1 only u is meaningful (get_int refuses it)
  else if (is_integer(t))
    out.u = static_cast<std::uint64_t>(out.i);
}

// The value of metadata pair `what` after its key: type, then a scalar, a string or an array.
GgufValue read_value(Cursor& c, const std::string& path, const std::string& what) {
  const auto type = c.read<std::uint32_t>(what);
  if (!known_type(type)) fail("{}: {} has unknown value type {}", path, what, type);
  GgufValue v;
  v.type = static_cast<GgufValueType>(type);
  if (v.type == GgufValueType::kString) {
    v.s = c.string(what);
    if (!is_valid_utf8(v.s)) fail("{}: {} is not valid UTF-8: '{}'", path, what, printable(v.s));
  } else if (v.type == GgufValueType::kArray) {
    const auto et = c.read<std::uint32_t>(what);
    if (!known_type(et)) fail("{}: {} is an array of unknown type {}", path, what, et);
    v.element_type = static_cast<GgufValueType>(et);
    if (v.element_type == GgufValueType::kArray) fail("{}: {} is an array of arrays (not supported)", path, what);
    v.count = c.read<std::uint64_t>(what);
    if (v.element_type == GgufValueType::kString) {
      if (v.count > c.left() / 8) fail("{}: {} claims {} strings, more than the file can hold", path, what, v.count);
      v.strings.reserve(static_cast<std::size_t>(v.count));
      for (std::uint64_t i = 0; i < v.count; ++i) {
        const std::string_view s = c.string(fmt::format("{}[{}]", what, i));
        if (!is_valid_utf8(s)) fail("{}: {}[{}] is not valid UTF-8: '{}'", path, what, i, printable(s));
        v.strings.push_back(s);
      }
    } else {
      const std::size_t es = scalar_size(v.element_type);
      if (v.count > c.left() / es)
        fail("{}: {} claims {} elements of {}, more than the file can hold", path, what, v.count,
             gguf_type_name(v.element_type));
      v.raw = c.take(v.count * es, what);
      if (v.element_type == GgufValueType::kBool)
        for (std::size_t i = 0; i < v.raw.size(); ++i)
          if (v.raw[i] > 1) fail("{}: {}[{}] is a bool holding {}", path, what, i, v.raw[i]);
    }
  } else {
    read_scalar(v.type, c.take(scalar_size(v.type), what), v, path, what);
  }
  return v;
}

// Tensor info `t`: name, dimensions, ggml type and data offset (a multiple of `alignment`).
GgufTensorInfo read_tensor_info(Cursor& c, const std::string& path, std::uint64_t t, std::uint64_t alignment) {
  GgufTensorInfo info;
  const std::string_view name = c.string(fmt::format("the name of tensor {}", t));
  if (!is_valid_utf8(name)) fail("{}: the name of tensor {} is not valid UTF-8: '{}'", path, t, printable(name));
  if (name.empty()) fail("{}: tensor {} has an empty name", path, t);
  info.name = std::string(name);
  const std::string what = fmt::format("tensor '{}'", printable(name));
  const auto n_dims = c.read<std::uint32_t>(what);
  if (n_dims < 1 || n_dims > kMaxDims) fail("{}: {} has {} dimensions (1 to {} allowed)", path, what, n_dims, kMaxDims);
  std::int64_t numel = 1;
  for (std::uint32_t d = 0; d < n_dims; ++d) {
    const auto n = c.read<std::uint64_t>(what);
    if (n == 0 || n > static_cast<std::uint64_t>(kMaxBytes) || numel > kMaxBytes / static_cast<std::int64_t>(n))
      fail("{}: {} has dimension {} = {} (must be positive, the whole below 2^62)", path, what, d, n);
    numel *= static_cast<std::int64_t>(n);
    info.ne.push_back(static_cast<std::int64_t>(n));
  }
  const auto type = c.read<std::uint32_t>(what);
  info.type = find_ggml_type(type);
  if (info.type == nullptr) fail("{}: {} has unknown ggml type {}", path, what, type);
  if (info.ne[0] % info.type->block_size != 0)
    fail("{}: {} has rows of {} elements, not a multiple of {}'s block of {}", path, what, info.ne[0],
         info.type->name, info.type->block_size);
  // A row's bytes (computed below as blocks * type_size) must not overflow either.
  if (info.ne[0] / info.type->block_size > kMaxBytes / info.type->type_size)
    fail("{}: {} has rows of {} elements of {}, beyond 2^62 bytes", path, what, info.ne[0], info.type->name);
  info.offset = c.read<std::uint64_t>(what);
  if (info.offset % alignment != 0)
    fail("{}: {} data offset {} is not a multiple of general.alignment {}", path, what, info.offset, alignment);
  return info;
}

// Points each tensor at its bytes in the data section (from `data_start` of `bytes`), checking that it lies
// inside the file and overlaps no other.
void place_tensors(std::vector<GgufTensorInfo>& tensors, std::span<const std::uint8_t> bytes, std::uint64_t data_start,
                   const std::string& path) {
  if (!tensors.empty() && data_start > bytes.size())
    fail("{}: truncated: the tensor data would start at {}, the file has {} bytes", path, data_start, bytes.size());
  const std::uint64_t data_size = bytes.size() - std::min<std::uint64_t>(data_start, bytes.size());
  std::vector<std::size_t> order(tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) {
    GgufTensorInfo& info = tensors[i];
    const std::int64_t rows = info.numel() / info.ne[0];
    const std::int64_t row_bytes = ggml_row_bytes(*info.type, info.ne[0]);
    if (rows > kMaxBytes / row_bytes) fail("{}: tensor '{}' is beyond 2^62 bytes", path, printable(info.name));
    const auto size = static_cast<std::uint64_t>(rows * row_bytes);
    if (info.offset > data_size || size > data_size - info.offset)
      fail("{}: tensor '{}' ({} bytes at data offset {}) extends past the end of the file (data section of {} bytes)",
           path, printable(info.name), size, info.offset, data_size);
    info.bytes = bytes.subspan(static_cast<std::size_t>(data_start + info.offset), static_cast<std::size_t>(size));
    order[i] = i;
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return tensors[a].offset < tensors[b].offset; });
  for (std::size_t k = 1; k < order.size(); ++k) {
    const GgufTensorInfo& prev = tensors[order[k - 1]];
    const GgufTensorInfo& next = tensors[order[k]];
    if (prev.offset + prev.bytes.size() > next.offset)
      fail("{}: tensors '{}' and '{}' overlap (data offsets {} + {} bytes and {})", path, printable(prev.name),
           printable(next.name), prev.offset, prev.bytes.size(), next.offset);
  }
}

}  // namespace

std::string_view gguf_type_name(GgufValueType type) {
  static constexpr std::string_view kNames[] = {"uint8", "int8",   "uint16", "int16", "uint32", "int32", "float32",
                                                "bool",  "string", "array",  "uint64", "int64", "float64"};
  const auto i = static_cast<std::size_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

std::int64_t GgufTensorInfo::numel() const {
  std::int64_t n = 1;
  for (const std::int64_t d : ne) n *= d;
  return n;
}

GgufFile::GgufFile(const std::string& path) : file_(path) {
  const auto bytes = file_.bytes();
  Cursor c(bytes, path);
  const auto magic = c.take(4, "the magic");
  if (std::memcmp(magic.data(), "GGUF", 4) != 0)
    fail("{}: not a GGUF file (magic '{}', expected 'GGUF')", path,
         printable({reinterpret_cast<const char*>(magic.data()), 4}));
  version_ = c.read<std::uint32_t>("the version");
  if (version_ == 1) fail("{}: GGUF version 1 is not supported (convert it with a newer llama.cpp)", path);
  if (version_ != 2 && version_ != 3) {
    if (__builtin_bswap32(version_) == 2 || __builtin_bswap32(version_) == 3)
      fail("{}: a big-endian GGUF (version {}); woq reads little-endian files", path, __builtin_bswap32(version_));
    fail("{}: GGUF version {} is not supported (woq reads versions 2 and 3)", path, version_);
  }
  const auto tensor_count = c.read<std::uint64_t>("tensor_count");
  const auto kv_count = c.read<std::uint64_t>("metadata_kv_count");
  // The smallest key/value pair is 8 + 1 + 4 + 1 bytes, the smallest tensor info 8 + 1 + 4 + 8 + 4 + 8.
  if (kv_count > c.left() / 14) fail("{}: metadata_kv_count {} cannot fit in the file", path, kv_count);
  if (tensor_count > c.left() / 33) fail("{}: tensor_count {} cannot fit in the file", path, tensor_count);

  for (std::uint64_t k = 0; k < kv_count; ++k) {
    const std::string_view key = c.string(fmt::format("the key of metadata pair {}", k));
    if (!is_valid_utf8(key))
      fail("{}: the key of metadata pair {} is not valid UTF-8: '{}'", path, k, printable(key));
    if (key.empty()) fail("{}: metadata pair {} has an empty key", path, k);
    GgufValue v = read_value(c, path, fmt::format("metadata '{}'", printable(key)));
    if (!kv_.emplace(std::string(key), std::move(v)).second)
      fail("{}: duplicate metadata key '{}'", path, printable(key));
  }

  if (const GgufValue* a = find("general.alignment")) {
    if (!is_integer(a->type) || a->i <= 0 || !std::has_single_bit(a->u) || a->u > (1u << 30))
      fail("{}: general.alignment must be a power of two (got {} of type {})", path, a->i, gguf_type_name(a->type));
    alignment_ = a->u;
  }

  tensors_.reserve(static_cast<std::size_t>(tensor_count));
  for (std::uint64_t t = 0; t < tensor_count; ++t) {
    GgufTensorInfo info = read_tensor_info(c, path, t, alignment_);
    if (!tensor_index_.emplace(info.name, tensors_.size()).second)
      fail("{}: duplicate tensor '{}'", path, printable(info.name));
    tensors_.push_back(std::move(info));
  }
  // The data section starts at the next multiple of the alignment.
  place_tensors(tensors_, bytes, (c.pos() + alignment_ - 1) / alignment_ * alignment_, path);
}

const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

std::optional<std::int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (!is_integer(v->type)) fail("{}: metadata '{}' is {}, expected an integer", path(), key, gguf_type_name(v->type));
  if (v->type == GgufValueType::kUint64 && v->u > static_cast<std::uint64_t>(INT64_MAX))
    fail("{}: metadata '{}' = {} is out of range", path(), key, v->u);
  return v->i;
}

std::optional<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type == GgufValueType::kFloat32 || v->type == GgufValueType::kFloat64) return v->f;
  if (is_integer(v->type)) return static_cast<double>(v->i);
  fail("{}: metadata '{}' is {}, expected a number", path(), key, gguf_type_name(v->type));
}

std::optional<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::kBool) fail("{}: metadata '{}' is {}, expected a bool", path(), key, gguf_type_name(v->type));
  return v->u != 0;
}

std::optional<std::string_view> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::kString)
    fail("{}: metadata '{}' is {}, expected a string", path(), key, gguf_type_name(v->type));
  return v->s;
}

const std::vector<std::string_view>* GgufFile::get_strings(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return nullptr;
  if (v->type != GgufValueType::kArray || v->element_type != GgufValueType::kString)
    fail("{}: metadata '{}' is {}, expected an array of strings", path(), key,
         v->type == GgufValueType::kArray ? fmt::format("an array of {}", gguf_type_name(v->element_type))
                                          : std::string(gguf_type_name(v->type)));
  return &v->strings;
}

std::optional<std::vector<float>> GgufFile::get_floats(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::kArray ||
      (v->element_type != GgufValueType::kFloat32 && v->element_type != GgufValueType::kFloat64))
    fail("{}: metadata '{}' is {}, expected an array of float32", path(), key,
         v->type == GgufValueType::kArray ? fmt::format("an array of {}", gguf_type_name(v->element_type))
                                          : std::string(gguf_type_name(v->type)));
  std::vector<float> out(static_cast<std::size_t>(v->count));
  for (std::size_t i = 0; i < out.size(); ++i)
    out[i] = v->element_type == GgufValueType::kFloat32 ? load<float>(v->raw.data() + 4 * i)
                                                         : static_cast<float>(load<double>(v->raw.data() + 8 * i));
  return out;
}

std::optional<std::vector<std::int64_t>> GgufFile::get_ints(std::string_view key) const {
  const GgufValue* v = find(key);
  if (v == nullptr) return std::nullopt;
  if (v->type != GgufValueType::kArray || !is_integer(v->element_type))
    fail("{}: metadata '{}' is {}, expected an array of integers", path(), key,
         v->type == GgufValueType::kArray ? fmt::format("an array of {}", gguf_type_name(v->element_type))
                                          : std::string(gguf_type_name(v->type)));
  std::vector<std::int64_t> out(static_cast<std::size_t>(v->count));
  const std::uint8_t* p = v->raw.data();
  for (std::size_t i = 0; i < out.size(); ++i) {
    switch (v->element_type) {
      case GgufValueType::kUint8: out[i] = p[i]; break;
      case GgufValueType::kInt8: out[i] = load<std::int8_t>(p + i); break;
      case GgufValueType::kUint16: out[i] = load<std::uint16_t>(p + 2 * i); break;
      case GgufValueType::kInt16: out[i] = load<std::int16_t>(p + 2 * i); break;
      case GgufValueType::kUint32: out[i] = load<std::uint32_t>(p + 4 * i); break;
      case GgufValueType::kInt32: out[i] = load<std::int32_t>(p + 4 * i); break;
      case GgufValueType::kInt64: out[i] = load<std::int64_t>(p + 8 * i); break;
      default: {
        const auto u = load<std::uint64_t>(p + 8 * i);
        if (u > static_cast<std::uint64_t>(INT64_MAX)) fail("{}: metadata '{}'[{}] = {} is out of range", path(), key, i, u);
        out[i] = static_cast<std::int64_t>(u);
      }
    }
  }
  return out;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

bool is_gguf_path(std::string_view path) { return path.ends_with(".gguf"); }

namespace {

// NAME-00001-of-00003.gguf: "-" 5 digits "-of-" 5 digits ".gguf".
constexpr std::string_view kSplitTail = "-00000-of-00000.gguf";

// {part, count} of a split-set name, or {-1, -1}.
std::pair<int, int> split_numbers(std::string_view path) {
  if (path.size() < kSplitTail.size() || !path.ends_with(".gguf")) return {-1, -1};
  const std::string_view tail = path.substr(path.size() - kSplitTail.size());
  auto digits = [&](std::size_t at) {
    int v = 0;
    for (std::size_t i = at; i < at + 5; ++i) {
      if (tail[i] < '0' || tail[i] > '9') return -1;
      v = v * 10 + (tail[i] - '0');
    }
    return v;
  };
  if (tail[0] != '-' || tail.substr(6, 4) != "-of-") return {-1, -1};
  const int no = digits(1), count = digits(10);
  if (no < 0 || count < 0) return {-1, -1};
  return {no, count};
}

}  // namespace

bool gguf_split_paths_pattern(std::string_view path) { return split_numbers(path).first >= 0; }

std::vector<std::string> gguf_split_paths(const std::string& path) {
  const auto [no, count] = split_numbers(path);
  if (no < 0) return {path};
  if (count < 1 || no < 1 || no > count)
    fail("{}: split part {} of {} is not a valid gguf-split name", path, no, count);
  const std::string stem = path.substr(0, path.size() - kSplitTail.size());
  std::vector<std::string> parts;
  for (int i = 1; i <= count; ++i) {
    std::string part = fmt::format("{}-{:05}-of-{:05}.gguf", stem, i, count);
    if (!std::filesystem::exists(part)) fail("{}: split part {} of {} is missing: {}", path, i, count, part);
    parts.push_back(std::move(part));
  }
  return parts;
}

std::vector<GgufFile> open_gguf(const std::string& path) {
  const std::vector<std::string> paths = gguf_split_paths(path);
  std::vector<GgufFile> parts;
  parts.reserve(paths.size());
  std::map<std::string_view, std::string_view> owner;  // tensor -> part
  for (std::size_t i = 0; i < paths.size(); ++i) {
    parts.emplace_back(paths[i]);
    const GgufFile& p = parts.back();
    if (paths.size() > 1) {
      const auto no = p.get_int("split.no");
      const auto count = p.get_int("split.count");
      if (!no || !count || *no != static_cast<std::int64_t>(i) || *count != static_cast<std::int64_t>(paths.size()))
        fail("{}: split.no / split.count are {} / {}, expected {} / {} for part {} of {}", p.path(),
             no ? std::to_string(*no) : "absent", count ? std::to_string(*count) : "absent", i, paths.size(), i + 1,
             paths.size());
    }
    for (const GgufTensorInfo& t : p.tensors())
      if (const auto [it, fresh] = owner.emplace(t.name, p.path()); !fresh)
        fail("{}: tensor '{}' is also in {}", p.path(), printable(t.name), it->second);
  }
  if (paths.size() == 1) {
    if (const auto count = parts.front().get_int("split.count"); count && *count > 1)
      fail("{}: metadata split.count = {} but the file is not named as part of a split set (NAME-00001-of-{:05}.gguf)",
           path, *count, *count);
  } else if (const auto total = parts.front().get_int("split.tensors.count");
             total && *total != static_cast<std::int64_t>(owner.size())) {
    fail("{}: metadata split.tensors.count = {} but the {} parts hold {} tensors", parts.front().path(), *total,
         paths.size(), owner.size());
  }
  return parts;
}

namespace {

// The size and modification time of each file of a parsed set, to see a file replaced under the same name.
std::vector<std::pair<std::uintmax_t, std::filesystem::file_time_type>> file_stamps(const std::vector<GgufFile>& files) {
  std::vector<std::pair<std::uintmax_t, std::filesystem::file_time_type>> stamps;
  for (const GgufFile& f : files) {
    std::error_code ec;
    const std::uintmax_t size = std::filesystem::file_size(f.path(), ec);
    const std::filesystem::file_time_type time = std::filesystem::last_write_time(f.path(), ec);
    stamps.emplace_back(ec ? 0 : size, time);
  }
  return stamps;
}

}  // namespace

std::shared_ptr<const std::vector<GgufFile>> shared_gguf(const std::string& path) {
  struct Entry {
    std::weak_ptr<const std::vector<GgufFile>> files;
    std::vector<std::pair<std::uintmax_t, std::filesystem::file_time_type>> stamps;
  };
  static std::mutex mutex;
  static std::map<std::string, Entry> cache;
  const std::lock_guard lock(mutex);
  for (auto it = cache.begin(); it != cache.end();) it = it->second.files.expired() ? cache.erase(it) : std::next(it);
  if (const auto it = cache.find(path); it != cache.end())
    if (auto files = it->second.files.lock(); files && file_stamps(*files) == it->second.stamps) return files;
  auto files = std::make_shared<const std::vector<GgufFile>>(open_gguf(path));
  cache[path] = Entry{files, file_stamps(*files)};
  return files;
}

std::optional<std::int64_t> gguf_token_id(const GgufFile& file, std::string_view key, std::int64_t vocab_size) {
  const auto id = file.get_int(fmt::format("tokenizer.ggml.{}", key));
  if (!id || *id < 0 || *id >= vocab_size) return std::nullopt;
  return id;
}

std::vector<std::string> gguf_token_id_warnings(const GgufFile& file, std::int64_t vocab_size) {
  constexpr std::string_view kPrefix = "tokenizer.ggml.", kSuffix = "_token_id";
  std::vector<std::string> warnings;
  for (const auto& [key, value] : file.metadata()) {
    if (!key.starts_with(kPrefix) || !key.ends_with(kSuffix) || key.size() <= kPrefix.size() + kSuffix.size()) continue;
    const std::optional<std::int64_t> id = file.get_int(key);
    if (id && (*id < 0 || *id >= vocab_size) && *id != 0xFFFFFFFF && *id != -1)
      warnings.push_back(fmt::format("{}: metadata '{}' = {} is outside the vocabulary of {} tokens: ignored, as "
                                     "llama.cpp ignores it", file.path(), key, *id, vocab_size));
  }
  return warnings;
}

}  // namespace woq
