// Safetensors reading through mmap: single files and sharded checkpoints
// (model.safetensors.index.json). Format: an 8-byte little-endian header
// length N, N bytes of JSON {name: {dtype, shape, data_offsets: [begin, end]}
// , "__metadata__": {...}}, then the raw little-endian tensor data, offsets
// relative to its start (https://github.com/huggingface/safetensors).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/mmap_file.h"

namespace woq {

/// Element types of the safetensors format.
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

/// Name as written in safetensors headers ("F32", "BF16", ...).
std::string_view dtype_name(DType dtype);
/// Bytes per element.
std::size_t dtype_size(DType dtype);

/// One tensor inside a mapped file. `bytes` points into the mapping and is
/// valid while the owning SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::span<const std::uint8_t> bytes;
  std::string file;  ///< path of the file holding it, for error messages

  std::int64_t numel() const;
  /// "[4096, 11008]".
  std::string shape_str() const;
};

/// One mapped .safetensors file with its validated header. Throws
/// woq::Error naming the file (and the tensor) when the file is shorter than
/// its header says, the header is malformed JSON, a dtype is unknown, or a
/// tensor's offsets are out of bounds or disagree with its shape and dtype.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
};

/// All tensors of a checkpoint directory: `model.safetensors`, or the shards
/// listed in `model.safetensors.index.json` (its weight_map says which file
/// holds which tensor, and is checked against the shards' headers).
class TensorStore {
 public:
  /// Throws woq::Error when neither file exists, the index is malformed,
  /// or a shard fails to open (see SafetensorsFile).
  static TensorStore open_dir(const std::string& dir);

  /// The tensor called `name`, or nullptr.
  const TensorView* find(const std::string& name) const;
  /// The tensor called `name`; throws woq::Error naming the checkpoint if absent.
  const TensorView& get(const std::string& name) const;
  /// Names of all tensors, sorted.
  std::vector<std::string> names() const;
  /// Where the tensors come from, for messages: the file or the index.
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> index_;
};

/// Throws woq::Error "FILE: tensor 'NAME' has shape [..], expected [..] (WHY)"
/// unless t.shape == shape.
void require_shape(const TensorView& t, const std::vector<std::int64_t>& shape, std::string_view why);

/// Throws woq::Error naming the tensor and its file unless its dtype is
/// F32, F16, BF16 or F64.
void require_float_dtype(const TensorView& t);

/// Converts elements [first, first + count) of a floating-point tensor (F32,
/// F16, BF16, F64) to fp32 into out[0, count); count < 0 means to the end.
/// Throws woq::Error naming the tensor and its file for any other dtype.
void tensor_to_f32(const TensorView& t, float* out, std::int64_t first = 0, std::int64_t count = -1);

}  // namespace woq
