// The GGUF reader on arbitrary bytes: the input is written as DIR/model.gguf
// and read three ways: GgufFile (header, metadata, tensor infos, checked
// against the file), gguf_model_config (metadata -> ModelConfig, held to the
// invariants of model_config_check.h) and TensorStore::open ->
// open_gguf_tensors (Hugging Face names, shapes, q/k row orders), after which
// every tensor it accepts is read back in full. An input that mentions
// "split.count" is written as DIR/model-00001-of-00002.gguf instead, beside a
// fixed valid second part (written once at start-up), so that split sets
// (open_gguf: split.no / split.count, tensors in two parts) are fuzzed too.
// The reader only takes paths, so each run writes the file (on tmpfs).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "io/gguf.h"
#include "io/gguf_model.h"
#include "io/safetensors.h"
#include "model_config_check.h"

namespace {

template <typename T>
std::string le(T v) {
  std::string s(sizeof v, '\0');
  std::memcpy(s.data(), &v, sizeof v);
  return s;
}
std::string gstr(std::string_view s) { return le<std::uint64_t>(s.size()) + std::string(s); }

// Part 2 of 2 of a split set: split.no 1, split.count 2, one F32 tensor
// output.weight [6, 8] (ne 8, 6) at data offset 0.
std::string second_part() {
  std::string out = "GGUF" + le<std::uint32_t>(3) + le<std::uint64_t>(1) + le<std::uint64_t>(2);
  out += gstr("split.no") + le<std::uint32_t>(2) + le<std::uint16_t>(1);
  out += gstr("split.count") + le<std::uint32_t>(2) + le<std::uint16_t>(2);
  out += gstr("output.weight") + le<std::uint32_t>(2) + le<std::uint64_t>(8) + le<std::uint64_t>(6) +
         le<std::uint32_t>(0) + le<std::uint64_t>(0);
  out.resize((out.size() + 31) / 32 * 32, '\0');
  for (int i = 0; i < 48; ++i) out += le(static_cast<float>(i % 7) - 3.0f);
  return out;
}

// Bytes of one element of a numeric metadata type (gguf_type_size).
std::uint64_t scalar_bytes(woq::GgufValueType t) {
  using T = woq::GgufValueType;
  switch (t) {
    case T::kUint8: case T::kInt8: case T::kBool: return 1;
    case T::kUint16: case T::kInt16: return 2;
    case T::kUint32: case T::kInt32: case T::kFloat32: return 4;
    case T::kUint64: case T::kInt64: case T::kFloat64: return 8;
    default: return 0;
  }
}

// The promises of GgufFile's constructor for what it accepts.
void check_file(const woq::GgufFile& f, std::size_t size) {
  WOQ_FUZZ_CHECK(f.version() == 2 || f.version() == 3, "version " + std::to_string(f.version()));
  WOQ_FUZZ_CHECK(f.alignment() > 0 && (f.alignment() & (f.alignment() - 1)) == 0, "alignment");
  for (const auto& [key, v] : f.metadata()) {
    WOQ_FUZZ_CHECK(!key.empty() && woq_fuzz::valid_utf8(key), "key '" + woq::printable(key) + "'");
    WOQ_FUZZ_CHECK(f.find(key) == &v, key);
    if (v.type == woq::GgufValueType::kString) WOQ_FUZZ_CHECK(woq_fuzz::valid_utf8(v.s), key);
    if (v.type == woq::GgufValueType::kArray) {
      WOQ_FUZZ_CHECK(v.element_type != woq::GgufValueType::kArray, key + " is an array of arrays");
      if (v.element_type == woq::GgufValueType::kString) {
        WOQ_FUZZ_CHECK(v.strings.size() == v.count, key);
        for (const std::string_view s : v.strings) WOQ_FUZZ_CHECK(woq_fuzz::valid_utf8(s), key);
      } else {
        WOQ_FUZZ_CHECK(v.raw.size() == v.count * scalar_bytes(v.element_type) && v.raw.size() <= size, key);
      }
    }
    // Every getter either answers or throws woq::Error naming the key.
    try { (void)f.get_int(key); } catch (const woq::Error&) {}
    try { (void)f.get_float(key); } catch (const woq::Error&) {}
    try { (void)f.get_bool(key); } catch (const woq::Error&) {}
    try { (void)f.get_string(key); } catch (const woq::Error&) {}
    try { (void)f.get_strings(key); } catch (const woq::Error&) {}
    try {
      if (const auto x = f.get_floats(key)) WOQ_FUZZ_CHECK(x->size() == v.count, key);
    } catch (const woq::Error&) {
    }
    try {
      if (const auto x = f.get_ints(key)) WOQ_FUZZ_CHECK(x->size() == v.count, key);
    } catch (const woq::Error&) {
    }
  }
  std::uint64_t total = 0;
  std::vector<std::span<const std::uint8_t>> spans;
  for (const woq::GgufTensorInfo& t : f.tensors()) {
    WOQ_FUZZ_CHECK(f.find_tensor(t.name) == &t, t.name);
    WOQ_FUZZ_CHECK(!t.ne.empty() && t.ne.size() <= 4 && t.type != nullptr, t.name);
    for (const std::int64_t d : t.ne) WOQ_FUZZ_CHECK(d > 0, t.name);
    WOQ_FUZZ_CHECK(t.ne[0] % t.type->block_size == 0, t.name);
    WOQ_FUZZ_CHECK(t.offset % f.alignment() == 0, t.name);
    const auto bytes = static_cast<std::uint64_t>(t.numel() / t.ne[0]) *
                       static_cast<std::uint64_t>(woq::ggml_row_bytes(*t.type, t.ne[0]));
    WOQ_FUZZ_CHECK(t.bytes.size() == bytes, t.name);
    total += t.bytes.size();
    spans.push_back(t.bytes);
  }
  WOQ_FUZZ_CHECK(total <= size, "tensors cover more bytes than the file has");
  std::sort(spans.begin(), spans.end(), [](const auto& a, const auto& b) { return a.data() < b.data(); });
  for (std::size_t i = 1; i < spans.size(); ++i)
    WOQ_FUZZ_CHECK(spans[i - 1].data() + spans[i - 1].size() <= spans[i].data(), "overlapping tensors");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  woq_fuzz::scratch().write("model-00002-of-00002.gguf", second_part());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = woq_fuzz::scratch();
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const bool split = input.find("split.count") != std::string_view::npos;
  const std::string path = dir.write(split ? "model-00001-of-00002.gguf" : "model.gguf", input);

  try {
    const woq::GgufFile f(path);
    check_file(f, size);
  } catch (const woq::Error&) {
  }
  try {
    woq_fuzz::check_model_config(woq::gguf_model_config(woq::open_gguf(path)));
  } catch (const woq::Error&) {
  }
  try {
    const woq::TensorStore store = woq::TensorStore::open(path);
    for (const std::string& name : store.names()) {
      const woq::TensorView& t = store.get(name);
      WOQ_FUZZ_CHECK(store.find(name) == &t, name);
      WOQ_FUZZ_CHECK(woq::gguf_tensor_name(name).has_value(), name + " has no GGUF name");
      WOQ_FUZZ_CHECK(!t.shape.empty() && t.shape.size() <= 4, name + " " + t.shape_str());
      for (const std::int64_t d : t.shape) WOQ_FUZZ_CHECK(d > 0, name + " " + t.shape_str());
      if (t.row_order) {
        // A permutation of the rows.
        WOQ_FUZZ_CHECK(t.shape.size() <= 2 && static_cast<std::int64_t>(t.row_order->size()) == t.shape[0],
                       name + " " + t.shape_str() + " with a row order of " + std::to_string(t.row_order->size()));
        std::vector<bool> seen(t.row_order->size());
        for (const std::int64_t r : *t.row_order) {
          WOQ_FUZZ_CHECK(r >= 0 && r < t.shape[0] && !seen[static_cast<std::size_t>(r)], name);
          seen[static_cast<std::size_t>(r)] = true;
        }
      }
      try {
        woq::require_float_dtype(t);
        const std::int64_t n = t.numel();
        std::vector<float> out(static_cast<std::size_t>(n));
        woq::tensor_to_f32(t, out.data());
        const std::int64_t len = t.row_length();
        if (n >= 2 * len) woq::tensor_to_f32(t, out.data(), len, n - len);  // from the second row on
      } catch (const woq::Error&) {
        // Not a type woq decodes: the clear error is the expected outcome.
      }
    }
  } catch (const woq::Error&) {
  }
  return 0;
}
