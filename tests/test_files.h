// Helpers for tests that build model directories on disk.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace woq::test {

/// A fresh directory under $TMPDIR, removed with its contents on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// One tensor to write: dtype is the safetensors name ("F32", ...).
struct RawTensor {
  std::string name;
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::vector<std::uint8_t> bytes;
};

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& content);

/// Reads every tensor of a safetensors file, in file order.
std::vector<RawTensor> read_safetensors(const std::string& path);
/// Writes a valid safetensors file holding `tensors`.
void write_safetensors(const std::string& path, const std::vector<RawTensor>& tensors);

/// llama.cpp's tokenizer test data (tests/test-tokenizer-0): `base`.inp holds texts separated
/// by "\n__ggml_vocab_test__\n", `base`.out one line of expected ids per text.
std::vector<std::pair<std::string, std::vector<std::int32_t>>> llama_cpp_vocab_cases(const std::string& base);

/// Runs tests/tokenizer/hf_oracle.mjs (Hugging Face's own @huggingface/tokenizers) on `cases_json`
/// ([{"dir": TOKENIZER_DIR, "texts": [...]}]) with its files in `dir`; returns its output JSON text
/// (see the script), or "" when node or the package is missing (the caller skips). Throws
/// std::runtime_error with the script's stderr when it fails otherwise.
std::string run_hf_oracle(const std::string& cases_json, const TempDir& dir);

/// The Python interpreter the build found (CMake's Python_EXECUTABLE, the first python3 on PATH; "python3"
/// when it found none): the one tools/install-deps.sh equips with NumPy, Jinja2 and pytest, for the
/// reference scripts of tests/reference.
std::string python();

/// True when the environment sets WOQ_REQUIRE_REFERENCES (tools/test.sh, so CI) to anything but "" or "0".
bool references_required();

/// Skips the running test because its reference (an interpreter, a package) is missing, or, when
/// references_required(), fails it: CI must not pass a reference test by skipping it. `why` is streamed.
#define WOQ_SKIP_WITHOUT_REFERENCE(why)                                         \
  do {                                                                          \
    if (::woq::test::references_required()) {                                   \
      FAIL() << why << " (and WOQ_REQUIRE_REFERENCES is set)";                  \
    } else {                                                                    \
      GTEST_SKIP() << why;                                                      \
    }                                                                           \
  } while (false)

/// Copies the files of a model directory (e.g. the bundled stories260K) into
/// `dir`, creating it if needed.
void copy_model(const std::string& src_dir, const std::string& dir);

/// What `f` throws as woq::Error (its message), or "(no error)".
std::string error_of(const std::function<void()>& f);

}  // namespace woq::test
