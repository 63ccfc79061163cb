// The safetensors reader on arbitrary bytes: the input is written as
// DIR/model.safetensors and opened as a checkpoint (TensorStore::open ->
// SafetensorsFile: 8-byte header length, JSON header, offsets checked
// against the data). The reader only takes paths, so each run writes the
// file (on tmpfs). Every tensor it accepts is then read back in full.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "fuzz_common.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = woq_fuzz::scratch();
  dir.write("model.safetensors", {reinterpret_cast<const char*>(data), size});
  try {
    const woq::TensorStore store = woq::TensorStore::open(dir.path());
    std::size_t total = 0;
    for (const std::string& name : store.names()) {
      const woq::TensorView& t = store.get(name);
      WOQ_FUZZ_CHECK(store.find(name) == &t, name);
      // Accepted tensors must lie inside the file and match their shape.
      const auto bytes = t.bytes;
      for (const std::int64_t d : t.shape) WOQ_FUZZ_CHECK(d >= 0, name + " has a negative dimension " + t.shape_str());
      WOQ_FUZZ_CHECK(bytes.size() <= size, name);
      WOQ_FUZZ_CHECK(static_cast<std::uint64_t>(t.numel()) * woq::dtype_size(t.dtype) == bytes.size(),
                     name + " " + t.shape_str());
      total += bytes.size();
      (void)woq::dtype_name(t.dtype);
      try {
        woq::require_float_dtype(t);
        const std::int64_t n = t.numel();
        std::vector<float> out(static_cast<std::size_t>(std::max<std::int64_t>(n, 1)));
        woq::tensor_to_f32(t, out.data());
        if (n > 2) woq::tensor_to_f32(t, out.data(), 1, n - 2);
      } catch (const woq::Error&) {
        // Not a float tensor: the clear error is the expected outcome.
      }
      try {
        woq::require_shape(t, {t.numel()}, "fuzz");
      } catch (const woq::Error&) {
      }
    }
    WOQ_FUZZ_CHECK(total + 8 <= size || store.names().empty(), "tensors cover more bytes than the file has");
  } catch (const woq::Error&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
