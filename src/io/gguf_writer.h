// GGUF writing (version 3, little-endian, ggml/docs/gguf.md): metadata
// key/value pairs in the order set, tensor infos, then each tensor's data at
// a multiple of general.alignment (32). Tensor bytes are produced one tensor
// at a time while the file is written, so a model is never held whole.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "formats/ggml_types.h"
#include "io/gguf.h"

namespace woq {

class GgufWriter {
 public:
  /// Fills a tensor's bytes (exactly ggml_row_bytes(type, ne[0]) * rows).
  using Fill = std::function<void(std::span<std::uint8_t> out)>;

  /// Typed metadata setters; setting a key again replaces its value in place.
  void set_u32(std::string_view key, std::uint32_t v);
  void set_f32(std::string_view key, float v);
  void set_bool(std::string_view key, bool v);
  void set_string(std::string_view key, std::string_view v);
  void set_strings(std::string_view key, const std::vector<std::string>& v);
  void set_f32s(std::string_view key, const std::vector<float>& v);
  void set_i32s(std::string_view key, const std::vector<std::int32_t>& v);
  /// Copies a value read from another GGUF (any type, arrays included).
  void set_value(std::string_view key, const GgufValue& v);
  /// Whether `key` has been set.
  bool has(std::string_view key) const;

  /// Adds a tensor of ggml dimensions `ne` (innermost first) and `type`;
  /// `fill` runs once, during write(). Throws woq::Error for a duplicate
  /// name or a row length that is not a multiple of the type's block.
  void add_tensor(std::string name, std::vector<std::int64_t> ne, GgmlType type, Fill fill);

  /// Writes the file to `path` through a temporary file beside it
  /// (PATH.tmp-PID), renamed into place only once complete; on any error the
  /// temporary file is removed and `path` is left as it was. Throws
  /// woq::Error naming the path for I/O failures and rethrows fill's errors.
  void write(const std::string& path) const;

 private:
  struct Pair {
    std::string key;
    std::vector<std::uint8_t> value;  ///< type + payload, serialized
  };
  struct Tensor {
    std::string name;
    std::vector<std::int64_t> ne;
    GgmlType type;
    Fill fill;
    std::uint64_t bytes;
  };
  void set(std::string_view key, std::vector<std::uint8_t> value);
  std::vector<Pair> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace woq
