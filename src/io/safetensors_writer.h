// Writing safetensors files and sharded checkpoints, atomically (each file
// is written to a temporary name in the same directory, then renamed).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace woq {

/// Name, dtype and shape of a tensor to write.
struct TensorSpec {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;

  std::uint64_t bytes() const;
};

/// Fills the little-endian bytes of tensors[index] (exactly spec.bytes() of them).
using TensorFiller = std::function<void(std::size_t index, std::span<std::uint8_t> out)>;

/// Writes `tensors` (in order) to `path` with metadata {"format": "pt"}.
/// Throws woq::Error naming the path on I/O failure; a partial file never
/// replaces `path`.
void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const TensorFiller& fill);

/// Writes a checkpoint's tensors into `dir` the way transformers saves them:
/// one model.safetensors when they total at most `max_shard_bytes`, else
/// model-0000i-of-0000n.safetensors shards (tensors kept whole, in order)
/// plus model.safetensors.index.json with metadata.total_size and weight_map.
void write_checkpoint_tensors(const std::string& dir, const std::vector<TensorSpec>& tensors,
                              const TensorFiller& fill, std::uint64_t max_shard_bytes);

}  // namespace woq
