// config.json -> ModelConfig on arbitrary bytes: the input is written as
// DIR/config.json (read_model_config takes a directory) and read; accepted
// configs must satisfy the invariants of model_config_check.h.
#include <cstdint>

#include "core/error.h"
#include "fuzz_common.h"
#include "io/hf_config.h"
#include "model_config_check.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto& dir = woq_fuzz::scratch();
  dir.write("config.json", {reinterpret_cast<const char*>(data), size});
  try {
    woq_fuzz::check_model_config(woq::read_model_config(dir.path()));
  } catch (const woq::Error&) {
  } catch (const nlohmann::json::exception& e) {
    woq_fuzz::json_exception(e);
  }
  return 0;
}
