#include "io/fused_projections.h"

#include <map>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "arch/architecture.h"
#include "core/error.h"

namespace woq {

namespace {

// The parts: views of stored rows.
class FusedParts final : public TensorSource {
 public:
  explicit FusedParts(std::string path) : path_(std::move(path)) {}
  const std::map<std::string, TensorView>& tensors() const override { return tensors_; }
  const std::string& path() const override { return path_; }
  std::map<std::string, TensorView> tensors_;

 private:
  std::string path_;
};

// Rows [row0, row0 + rows) of the float matrix `t`, named `name`.
TensorView row_view(const TensorView& t, std::string name, std::int64_t row0, std::int64_t rows) {
  TensorView v = t;
  v.name = std::move(name);
  v.shape = {rows, t.shape[1]};
  const std::size_t row_bytes = static_cast<std::size_t>(t.shape[1]) * dtype_size(t.dtype);
  v.bytes = t.bytes.subspan(static_cast<std::size_t>(row0) * row_bytes, static_cast<std::size_t>(rows) * row_bytes);
  return v;
}

}  // namespace

void split_fused_projections(TensorStore& store, const ModelConfig& c) {
  auto parts = std::make_unique<FusedParts>(store.source());
  std::vector<std::string> replaced;
  for (std::int64_t l = 0; l < c.num_hidden_layers; ++l) {
    for (const FusedSpec& f : kFusedProjections) {
      const std::string name = layer_tensor(l, f.module) + ".weight";
      const TensorView& t = store.get(name);
      const std::span<const LinearRole> roles(f.parts.data(), f.part_count);
      std::string stacked;
      for (const LinearRole role : roles)
        stacked += fmt::format("{}{}", stacked.empty() ? "" : " + ", dim_name(linear_spec(role).rows));
      require_shape(t, {c.rows(f), c.hidden_size}, fmt::format("from {}: {}, hidden_size", shape_source(t), stacked));
      if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16)
        fail("{}: tensor '{}' is {}; woq splits fused projections stored as F32, F16 or BF16", t.file, name,
             t.type_name());
      std::int64_t row0 = 0;
      for (const LinearRole role : roles) {
        const std::int64_t n = c.size(linear_spec(role).rows);
        const std::string part = fmt::format("{} (rows {} to {})", name, row0, row0 + n - 1);
        parts->tensors_.emplace(linear_tensor(l, role), row_view(t, part, row0, n));
        row0 += n;
      }
      replaced.push_back(name);
    }
  }
  store.replace_with_views(replaced, std::move(parts));
}

}  // namespace woq
