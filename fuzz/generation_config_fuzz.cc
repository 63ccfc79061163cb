// generation_config.json on arbitrary bytes, next to a fixed valid
// config.json (stories260K's): read_model_config reads both, the
// generation config's bos/eos ids taking precedence.
#include <cstdint>

#include "core/error.h"
#include "fuzz_common.h"
#include "io/hf_config.h"
#include "model_config_check.h"

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  woq_fuzz::scratch().write("config.json", woq_fuzz::slurp(woq_fuzz::repo_file("assets/models/stories260K/config.json")));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = woq_fuzz::scratch();
  dir.write("generation_config.json", {reinterpret_cast<const char*>(data), size});
  try {
    woq_fuzz::check_model_config(woq::read_model_config(dir.path()));
  } catch (const woq::Error&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
