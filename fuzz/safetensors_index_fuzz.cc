// model.safetensors.index.json on arbitrary bytes: the input is the index of
// a checkpoint directory that also holds two small valid shards (written once
// at start-up); TensorStore::open checks the weight_map against them.
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "fuzz_common.h"
#include "io/safetensors.h"

namespace {

// A safetensors file with one F32 tensor `name` of `n` elements.
std::string shard(const std::string& name, int n) {
  const std::string header = "{\"" + name + "\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) +
                             "],\"data_offsets\":[0," + std::to_string(4 * n) + "]},\"__metadata__\":{\"format\":\"pt\"}}";
  std::string out(8, '\0');
  const std::uint64_t len = header.size();
  for (int i = 0; i < 8; ++i) out[static_cast<std::size_t>(i)] = static_cast<char>((len >> (8 * i)) & 0xff);
  out += header;
  out.append(static_cast<std::size_t>(4 * n), '\0');
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const auto& dir = woq_fuzz::scratch();
  dir.write("model-00001-of-00002.safetensors", shard("model.embed_tokens.weight", 16));
  dir.write("model-00002-of-00002.safetensors", shard("lm_head.weight", 8));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = woq_fuzz::scratch();
  dir.write("model.safetensors.index.json", {reinterpret_cast<const char*>(data), size});
  try {
    const woq::TensorStore store = woq::TensorStore::open(dir.path());
    for (const std::string& name : store.names()) {
      const woq::TensorView& t = store.get(name);
      // Only the shards written above can be opened.
      WOQ_FUZZ_CHECK(std::filesystem::path(t.file).parent_path() == dir.path(), t.file);
      WOQ_FUZZ_CHECK(t.bytes.size() == 4 * static_cast<std::size_t>(t.numel()), name);
    }
  } catch (const woq::Error&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
