#include "io/safetensors_writer.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_file.h"

namespace woq {

std::uint64_t TensorSpec::bytes() const {
  std::uint64_t n = dtype_size(dtype);
  for (const auto d : shape) n *= static_cast<std::uint64_t>(d);
  return n;
}

void write_safetensors(const std::string& path, const std::vector<TensorSpec>& tensors,
                       const TensorFiller& fill) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.bytes()}}};
    offset += t.bytes();
  }
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // data starts 8-byte aligned

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) fail("{}: cannot create: {}", tmp, std::strerror(errno));
  auto check = [&](bool ok) {
    if (!ok) {
      const int err = errno;
      std::fclose(f);
      std::remove(tmp.c_str());
      fail("{}: write failed: {}", tmp, std::strerror(err));
    }
  };
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>((h.size() >> (8 * i)) & 0xff);
  check(std::fwrite(len, 1, 8, f) == 8);
  check(std::fwrite(h.data(), 1, h.size(), f) == h.size());
  std::vector<std::uint8_t> buf;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    buf.resize(tensors[i].bytes());
    try {
      fill(i, buf);
    } catch (...) {
      std::fclose(f);
      std::remove(tmp.c_str());
      throw;
    }
    check(std::fwrite(buf.data(), 1, buf.size(), f) == buf.size());
  }
  check(std::fflush(f) == 0);
  if (std::fclose(f) != 0) {
    std::remove(tmp.c_str());
    fail("{}: close failed: {}", tmp, std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) fail("{}: cannot rename to {}: {}", tmp, path, ec.message());
}

void write_checkpoint_tensors(const std::string& dir, const std::vector<TensorSpec>& tensors,
                              const TensorFiller& fill, std::uint64_t max_shard_bytes) {
  namespace fs = std::filesystem;
  // Greedy split into shards of at most max_shard_bytes (a larger tensor gets its own).
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0, total = 0;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const std::uint64_t b = tensors[i].bytes();
    if (!shards.back().empty() && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  auto write_shard = [&](const std::string& path, const std::vector<std::size_t>& ids) {
    std::vector<TensorSpec> specs;
    for (const auto i : ids) specs.push_back(tensors[i]);
    write_safetensors(path, specs, [&](std::size_t j, std::span<std::uint8_t> out) { fill(ids[j], out); });
  };
  if (shards.size() == 1) {
    write_shard((fs::path(dir) / "model.safetensors").string(), shards[0]);
    return;
  }
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", total}};
  index["weight_map"] = nlohmann::ordered_json::object();
  for (std::size_t s = 0; s < shards.size(); ++s) {
    const std::string name = fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, shards.size());
    write_shard((fs::path(dir) / name).string(), shards[s]);
    for (const auto i : shards[s]) index["weight_map"][tensors[i].name] = name;
  }
  write_json_file((fs::path(dir) / "model.safetensors.index.json").string(), index);
}

}  // namespace woq
