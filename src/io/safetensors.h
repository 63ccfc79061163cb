// Tensors read through mmap, behind one interface (TensorSource) that each
// checkpoint format implements: safetensors here (single files and sharded
// checkpoints, model.safetensors.index.json), GGUF in io/gguf_model.h.
// Safetensors format: an 8-byte little-endian header
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
#include "formats/ggml_types.h"

namespace woq {

/// Element types of the safetensors format, and kGgml: blocks of a ggml
/// type (GGUF's Q4_0, Q6_K, ...; TensorView::ggml says which).
enum class DType { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kGgml };

/// Name as written in safetensors headers ("F32", "BF16", ...); "GGML" for kGgml.
std::string_view dtype_name(DType dtype);
/// Bytes per element (not meaningful for kGgml).
std::size_t dtype_size(DType dtype);

/// One tensor inside a mapped file. `bytes` points into the mapping and is
/// valid while the owning SafetensorsFile lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::span<const std::uint8_t> bytes;
  std::string file;  ///< path of the file holding it, for error messages
  /// kGgml only: the block type. Rows (the last dimension) hold whole blocks.
  const GgmlTypeTraits* ggml = nullptr;
  /// When set, logical row r (element r of a 1-D tensor) is stored at row
  /// (*row_order)[r]: GGUF's permuted q/k projections, read in HF order.
  std::shared_ptr<const std::vector<std::int64_t>> row_order;

  std::int64_t numel() const;
  /// Elements of one row: the last dimension (1 for a 1-D tensor with a row_order).
  std::int64_t row_length() const;
  /// Bytes of stored row `stored_row` (row_length() elements).
  std::span<const std::uint8_t> stored_row_bytes(std::int64_t stored_row) const;
  /// "[4096, 11008]".
  std::string shape_str() const;
  /// "F16", "q4_0", ...
  std::string_view type_name() const;
};

/// A checkpoint file (or set of files) of one format: its tensors by the
/// Hugging Face names woq's loader uses. Views stay valid while it lives.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual const std::map<std::string, TensorView>& tensors() const = 0;
  /// The file (or first file) the tensors come from, for messages.
  virtual const std::string& path() const = 0;
};

/// One mapped .safetensors file with its validated header. Throws
/// woq::Error naming the file (and the tensor) when the file is shorter than
/// its header says, the header is malformed JSON, a dtype is unknown, or a
/// tensor's offsets are out of bounds or disagree with its shape and dtype.
class SafetensorsFile final : public TensorSource {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::map<std::string, TensorView>& tensors() const override { return tensors_; }
  const std::string& path() const override { return file_.path(); }

 private:
  MappedFile file_;
  std::map<std::string, TensorView> tensors_;
};

/// All tensors of a checkpoint: for a directory `model.safetensors`, or the
/// shards listed in `model.safetensors.index.json` (its weight_map says which
/// file holds which tensor, and is checked against the shards' headers); for
/// a .gguf path the GGUF file or split set (open_gguf_tensors).
class TensorStore {
 public:
  /// Throws woq::Error when neither file exists, the index is malformed,
  /// or a file fails to open (see SafetensorsFile, GgufFile).
  static TensorStore open(const std::string& path);

  /// The tensor called `name`, or nullptr.
  const TensorView* find(const std::string& name) const;
  /// The tensor called `name`; throws woq::Error naming the checkpoint if absent.
  const TensorView& get(const std::string& name) const;
  /// Names of all tensors, sorted.
  std::vector<std::string> names() const;
  /// Where the tensors come from, for messages: the file or the index.
  const std::string& source() const { return source_; }
  /// Adds the tensors of `views` (views into this store's files, e.g. split_fused_projections' parts) in place
  /// of the tensors named `replaced`. Throws woq::Error when a view's name is already taken.
  void replace_with_views(const std::vector<std::string>& replaced, std::unique_ptr<TensorSource> views);

 private:
  std::string source_;
  std::vector<std::unique_ptr<TensorSource>> files_;
  std::map<std::string, const TensorView*> index_;
};

/// Throws woq::Error "FILE: tensor 'NAME' has shape [..], expected [..] (WHY)"
/// unless t.shape == shape.
void require_shape(const TensorView& t, const std::vector<std::int64_t>& shape, std::string_view why);

/// Where the shapes a model's tensors must have come from, for require_shape's
/// WHY: "config.json", or "the GGUF metadata" for a tensor of a GGUF file.
std::string_view shape_source(const TensorView& t);

/// Throws woq::Error naming the tensor and its file unless its dtype is
/// F32, F16, BF16 or F64, or a ggml type woq can dequantize.
void require_float_dtype(const TensorView& t);

/// Converts elements [first, first + count) of a floating-point tensor (F32,
/// F16, BF16, F64, dequantizable ggml types) to fp32 into out[0, count);
/// count < 0 means to the end. With a row_order or a ggml type, first and
/// count must be whole rows. Throws woq::Error naming the tensor and its
/// file for any other dtype.
void tensor_to_f32(const TensorView& t, float* out, std::int64_t first = 0, std::int64_t count = -1);

}  // namespace woq
