#include "io/safetensors.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <utility>

#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/half.h"
#include "io/gguf.h"
#include "io/gguf_model.h"
#include "io/json_file.h"

namespace woq {

namespace {

constexpr std::array<std::pair<DType, std::string_view>, 10> kDTypes{{
    {DType::kF64, "F64"},
    {DType::kF32, "F32"},
    {DType::kF16, "F16"},
    {DType::kBF16, "BF16"},
    {DType::kI64, "I64"},
    {DType::kI32, "I32"},
    {DType::kI16, "I16"},
    {DType::kI8, "I8"},
    {DType::kU8, "U8"},
    {DType::kBool, "BOOL"},
}};

// Headers larger than this are rejected rather than parsed (the format's
// reference implementation uses the same 100 MB bound).
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;

TensorView parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e,
                       std::span<const std::uint8_t> data) {
  auto bad = [&](const std::string& what) -> Error {
    return Error(fmt::format("{}: tensor '{}': {}", path, name, what));
  };
  if (!e.is_object()) throw bad("header entry is not an object");
  TensorView t;
  t.name = name;
  t.file = path;
  const auto dt = e.find("dtype");
  if (dt == e.end() || !dt->is_string()) throw bad("missing or non-string 'dtype'");
  const std::string dtype = dt->get<std::string>();
  bool known = false;
  for (const auto& [d, n] : kDTypes) {
    if (n == dtype) {
      t.dtype = d;
      known = true;
    }
  }
  if (!known) throw bad(fmt::format("unsupported dtype '{}'", dtype));

  const auto sh = e.find("shape");
  if (sh == e.end() || !sh->is_array()) throw bad("missing or non-array 'shape'");
  if (sh->size() > 8) throw bad(fmt::format("shape has {} dimensions (at most 8 are accepted)", sh->size()));
  std::uint64_t numel = 1;
  for (const auto& d : *sh) {
    if (!d.is_number_unsigned()) throw bad(fmt::format("shape has a non-integer or negative dimension ({})", describe_json(d)));
    const std::uint64_t v = d.get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      throw bad(fmt::format("shape has a dimension of {}, beyond the 64-bit signed range", v));
    if (v != 0 && numel > std::numeric_limits<std::uint64_t>::max() / 16 / v)
      throw bad("shape is too large");
    numel *= v;
    t.shape.push_back(static_cast<std::int64_t>(v));
  }

  const auto off = e.find("data_offsets");
  if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
      !(*off)[1].is_number_unsigned())
    throw bad("'data_offsets' must be two non-negative integers");
  const std::uint64_t begin = (*off)[0].get<std::uint64_t>();
  const std::uint64_t end = (*off)[1].get<std::uint64_t>();
  if (begin > end) throw bad(fmt::format("data_offsets [{}, {}] are reversed", begin, end));
  if (end > data.size())
    throw bad(fmt::format("data_offsets [{}, {}] point past the end of the data ({} bytes; file truncated?)",
                          begin, end, data.size()));
  const std::uint64_t want = numel * dtype_size(t.dtype);
  if (end - begin != want)
    throw bad(fmt::format("data_offsets span {} bytes but shape {} of {} needs {}", end - begin,
                          t.shape_str(), dtype, want));
  t.bytes = data.subspan(begin, end - begin);
  return t;
}

}  // namespace

std::string_view dtype_name(DType dtype) {
  for (const auto& [d, n] : kDTypes)
    if (d == dtype) return n;
  return dtype == DType::kGgml ? "GGML" : "?";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF64:
    case DType::kI64: return 8;
    case DType::kF32:
    case DType::kI32: return 4;
    case DType::kF16:
    case DType::kBF16:
    case DType::kI16: return 2;
    case DType::kI8:
    case DType::kU8:
    case DType::kBool:
    case DType::kGgml: return 1;
  }
  return 1;
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::string TensorView::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

std::string_view TensorView::type_name() const { return ggml != nullptr ? ggml->name : dtype_name(dtype); }

std::int64_t TensorView::row_length() const { return shape.size() < 2 ? (row_order ? 1 : numel()) : shape.back(); }

std::span<const std::uint8_t> TensorView::stored_row_bytes(std::int64_t stored_row) const {
  const std::int64_t n = row_length();
  const std::int64_t size = ggml != nullptr ? ggml_row_bytes(*ggml, n) : n * static_cast<std::int64_t>(dtype_size(dtype));
  return bytes.subspan(static_cast<std::size_t>(stored_row * size), static_cast<std::size_t>(size));
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  const auto bytes = file_.bytes();
  if (bytes.size() < 8)
    fail("{}: truncated safetensors file ({} bytes; the 8-byte header length is missing)", path,
         bytes.size());
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[static_cast<std::size_t>(i)];
  if (header_len > kMaxHeaderBytes)
    fail("{}: header length {} is implausible (limit {} bytes); not a safetensors file?", path,
         header_len, kMaxHeaderBytes);
  if (header_len > bytes.size() - 8)
    fail("{}: header length {} exceeds the file size {} (file truncated?)", path, header_len,
         bytes.size());
  const auto header = bytes.subspan(8, header_len);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(header.begin(), header.end());
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for numbers like 1E400
    fail("{}: malformed JSON header: {}", path, e.what());
  }
  if (!json.is_object()) fail("{}: header is not a JSON object", path);
  const auto data = bytes.subspan(8 + header_len);
  for (const auto& [name, entry] : json.items()) {
    if (name == "__metadata__") continue;
    tensors_.emplace(name, parse_entry(path, name, entry, data));
  }
  // As the format's reference implementation requires: tensors tile the data
  // buffer exactly, without overlaps, holes or trailing bytes.
  std::vector<const TensorView*> by_offset;
  for (const auto& [name, t] : tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorView* a, const TensorView* b) { return a->bytes.data() < b->bytes.data(); });
  std::size_t expect = 0;
  for (const TensorView* t : by_offset) {
    const auto begin = static_cast<std::size_t>(t->bytes.data() - data.data());
    if (begin != expect)
      fail("{}: tensor '{}' starts at data offset {}, but the previous tensor ends at {} ({})", path, t->name,
           begin, expect, begin < expect ? "overlapping tensors" : "a hole in the data");
    expect = begin + t->bytes.size();
  }
  if (expect != data.size())
    fail("{}: the tensors cover {} bytes of data but the file holds {} after the header", path, expect,
         data.size());
}

TensorStore TensorStore::open(const std::string& dir) {
  namespace fs = std::filesystem;
  TensorStore store;
  if (is_gguf_path(dir)) {
    store.source_ = dir;
    store.files_.push_back(open_gguf_tensors(dir));
    for (const auto& [name, t] : store.files_.back()->tensors()) store.index_[name] = &t;
    return store;
  }
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    store.source_ = index.string();
    const JsonFields idx(read_json_file(index.string()), index.string());
    const auto it = idx.json().find("weight_map");
    if (it == idx.json().end() || !it->is_object()) idx.field_error("weight_map", "is missing or not an object");
    std::map<std::string, std::string> wanted;  // tensor -> shard
    std::set<std::string> shards;
    for (const auto& [name, file] : it->items()) {
      if (!file.is_string()) idx.field_error("weight_map", fmt::format("entry '{}' is not a file name", name));
      const std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "..")
        idx.field_error("weight_map", fmt::format("entry '{}' names '{}', not a file in {}", name, f, dir));
      wanted[name] = f;
      shards.insert(f);
    }
    std::map<std::string, const TensorSource*> by_name;
    for (const auto& shard : shards) {
      store.files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / shard).string()));
      by_name[shard] = store.files_.back().get();
    }
    for (const auto& [name, shard] : wanted) {
      const auto& tensors = by_name[shard]->tensors();
      const auto t = tensors.find(name);
      if (t == tensors.end())
        fail("{}: weight_map puts '{}' in {}, but that shard has no such tensor", index.string(), name, shard);
      store.index_[name] = &t->second;
    }
    return store;
  }
  if (!fs::exists(single))
    fail("{}: no model.safetensors or model.safetensors.index.json (is this a Hugging Face model directory?)",
         dir);
  store.source_ = single.string();
  store.files_.push_back(std::make_unique<SafetensorsFile>(single.string()));
  for (const auto& [name, t] : store.files_.back()->tensors()) store.index_[name] = &t;
  return store;
}

std::vector<std::string> TensorStore::names() const {
  std::vector<std::string> out;
  for (const auto& [name, t] : index_) out.push_back(name);
  return out;
}

void TensorStore::replace_with_views(const std::vector<std::string>& replaced, std::unique_ptr<TensorSource> views) {
  for (const std::string& name : replaced) index_.erase(name);
  for (const auto& [name, t] : views->tensors())
    if (!index_.emplace(name, &t).second) fail("{}: tensor '{}' is stored both fused and on its own", source_, name);
  files_.push_back(std::move(views));
}

const TensorView* TensorStore::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : it->second;
}

const TensorView& TensorStore::get(const std::string& name) const {
  const TensorView* t = find(name);
  if (t == nullptr) fail("{}: tensor '{}' is missing", source_, name);
  return *t;
}

void require_shape(const TensorView& t, const std::vector<std::int64_t>& shape, std::string_view why) {
  if (t.shape != shape)
    fail("{}: tensor '{}' has shape {}, expected [{}] ({})", t.file, t.name, t.shape_str(), fmt::join(shape, ", "), why);
}

std::string_view shape_source(const TensorView& t) { return is_gguf_path(t.file) ? "the GGUF metadata" : "config.json"; }

void require_float_dtype(const TensorView& t) {
  if (t.dtype == DType::kGgml && t.ggml->to_float == nullptr)
    fail("{}: tensor '{}' has ggml type {}, which woq cannot decode yet", t.file, t.name, t.ggml->name);
  if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16 && t.dtype != DType::kF64 &&
      t.dtype != DType::kGgml)
    fail("{}: tensor '{}' has dtype {}; a floating-point dtype (F32, F16, BF16) is needed here", t.file,
         t.name, dtype_name(t.dtype));
}

void tensor_to_f32(const TensorView& t, float* out, std::int64_t first, std::int64_t count) {
  const std::int64_t n = count < 0 ? t.numel() - first : count;
  if (t.row_order || t.dtype == DType::kGgml) {
    require_float_dtype(t);
    const std::int64_t len = t.row_length();
    if (first % len != 0 || n % len != 0)
      fail("{}: tensor '{}' is read by whole rows of {} (asked for {} elements at {})", t.file, t.name, len, n, first);
    for (std::int64_t r = first / len; r < (first + n) / len; ++r) {
      const std::int64_t stored = t.row_order ? (*t.row_order)[static_cast<std::size_t>(r)] : r;
      const auto row = t.stored_row_bytes(stored);
      float* dst = out + (r * len - first);
      if (t.ggml != nullptr) {
        t.ggml->to_float(row.data(), dst, len);
      } else {
        TensorView plain = t;
        plain.row_order.reset();
        plain.bytes = row;
        plain.shape = {len};
        tensor_to_f32(plain, dst);
      }
    }
    return;
  }
  const std::uint8_t* p = t.bytes.data() + first * static_cast<std::int64_t>(dtype_size(t.dtype));
  switch (t.dtype) {
    case DType::kF32: std::memcpy(out, p, static_cast<std::size_t>(n) * 4); return;
    case DType::kF64:
      for (std::int64_t i = 0; i < n; ++i) {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        out[i] = static_cast<float>(v);
      }
      return;
    case DType::kF16:
    case DType::kBF16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        out[i] = t.dtype == DType::kF16 ? fp16_to_fp32(h) : bf16_to_fp32(h);
      }
      return;
    default: require_float_dtype(t);
  }
}

}  // namespace woq
