// GGUF reading through mmap (versions 2 and 3; ggml/docs/gguf.md of
// https://github.com/ggml-org/ggml). Layout, all little-endian: magic "GGUF",
// uint32 version, uint64 tensor_count, uint64 metadata_kv_count; the
// key/value pairs (gguf string key = uint64 length + bytes, uint32 value
// type, value; arrays = uint32 element type + uint64 count + elements); the
// tensor infos (name, uint32 n_dims, uint64 ne[n_dims] innermost first,
// uint32 ggml type, uint64 offset); padding to general.alignment (default
// 32); the tensor data, each tensor at its offset from the data start.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mmap_file.h"
#include "formats/ggml_types.h"

namespace woq {

/// GGUF metadata value types (gguf_type).
enum class GgufValueType : std::uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7,
  kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

/// "uint32", "string", "array", ...
std::string_view gguf_type_name(GgufValueType type);

/// One metadata value, decoded at open time. Arrays hold elements of one
/// scalar or string type (arrays of arrays are refused); numeric arrays stay
/// in the mapping (`raw`), string arrays are views into it.
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType element_type = GgufValueType::kUint8;  ///< arrays only
  std::uint64_t count = 0;                              ///< arrays only
  std::int64_t i = 0;        ///< signed and unsigned integers up to 2^63 - 1, bool as 0/1
  std::uint64_t u = 0;       ///< the same value unsigned (uint64 above 2^63 - 1 lives only here)
  double f = 0;              ///< float32 / float64
  std::string_view s;        ///< string
  std::span<const std::uint8_t> raw;         ///< numeric arrays: count elements, little-endian
  std::vector<std::string_view> strings;     ///< string arrays
};

/// A tensor as the GGUF file describes it.
struct GgufTensorInfo {
  std::string name;
  std::vector<std::int64_t> ne;  ///< ggml dimensions, innermost (contiguous) first
  const GgmlTypeTraits* type = nullptr;
  std::uint64_t offset = 0;      ///< from the start of the data section
  std::span<const std::uint8_t> bytes;  ///< in the mapping

  std::int64_t numel() const;
};

/// One mapped GGUF file with its validated header. Construction throws
/// woq::Error naming the file (and the key or tensor) for: a file shorter
/// than its header, a wrong magic or a version other than 2 and 3, counts
/// beyond what the file can hold (checked before anything is allocated),
/// an unknown value or tensor type, keys or string values that are not
/// UTF-8, duplicate keys or tensor names, more than 4 dimensions, a
/// dimension that is not positive or a size beyond 2^62 bytes, a row length
/// that is not a multiple of the type's block size, an offset that is not a
/// multiple of general.alignment (a power of two), and tensor data past the
/// end of the file or overlapping another tensor.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }

  /// All key/value pairs, by key.
  const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }
  /// The value of `key`, or nullptr.
  const GgufValue* find(std::string_view key) const;

  /// Typed getters: nullopt when the key is absent; throw woq::Error naming
  /// the file and key when present with another type. get_int accepts every
  /// integer type (and refuses a uint64 beyond int64); get_float float32,
  /// float64 and integers; get_bool bool only.
  std::optional<std::int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::string_view> get_string(std::string_view key) const;
  /// Array getters: nullptr / nullopt when absent; throw woq::Error naming
  /// the key when it is not an array of that kind.
  const std::vector<std::string_view>* get_strings(std::string_view key) const;
  std::optional<std::vector<float>> get_floats(std::string_view key) const;       ///< float32/float64 arrays
  std::optional<std::vector<std::int64_t>> get_ints(std::string_view key) const;  ///< integer arrays

  /// Tensors in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const GgufTensorInfo* find_tensor(std::string_view name) const;

 private:
  MappedFile file_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32;
  std::map<std::string, GgufValue, std::less<>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> tensor_index_;
};

/// The special token id tokenizer.ggml.`key` (e.g. "bos_token_id") as
/// llama.cpp's vocabulary loader reads it: nullopt when the key is absent or
/// its value is outside [0, vocab_size). llama.cpp's converter writes
/// 0xFFFFFFFF for "none" (a padding id of -1), and llama.cpp ignores an
/// out-of-range id with a warning; a caller that needs the token (BOS to be
/// added) says so itself. Throws woq::Error naming the file and key when the
/// value is not an integer.
std::optional<std::int64_t> gguf_token_id(const GgufFile& file, std::string_view key, std::int64_t vocab_size);

/// One line per tokenizer.ggml.*_token_id of `file` that gguf_token_id
/// ignores for being outside the vocabulary, except 0xFFFFFFFF ("none").
std::vector<std::string> gguf_token_id_warnings(const GgufFile& file, std::int64_t vocab_size);

/// True when `path` names a GGUF file (ends in ".gguf").
bool is_gguf_path(std::string_view path);

/// The files of a GGUF model: `path` alone, or, for a split set
/// (NAME-00001-of-00003.gguf, llama.cpp's gguf-split), every part in order,
/// checked for presence. Throws woq::Error naming the missing part.
std::vector<std::string> gguf_split_paths(const std::string& path);

/// True when `path` ends like a part of a split set (-NNNNN-of-NNNNN.gguf).
bool gguf_split_paths_pattern(std::string_view path);

/// Opens every part of the GGUF model `path` (gguf_split_paths). For a split
/// set, checks each part's split.no / split.count and that no tensor is in
/// two parts. Throws woq::Error naming the part.
std::vector<GgufFile> open_gguf(const std::string& path);

/// open_gguf, parsed once for all who hold it: while a result for `path` is alive (held by anyone) and none of
/// its files changed on disk (size and modification time), the same parsed files are returned; else they are
/// parsed again. A model's loading holds one from its first read (config, tokenizer, chat template) to its
/// weights, so that a GGUF header, vocabulary included, is parsed once per load. Thread-safe. Throws as
/// open_gguf.
std::shared_ptr<const std::vector<GgufFile>> shared_gguf(const std::string& path);

}  // namespace woq
