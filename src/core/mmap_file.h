// Read-only memory mapping of a whole file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace woq {

/// A file mapped read-only into memory for the lifetime of the object.
/// Movable, not copyable. An empty file maps to an empty span.
class MappedFile {
 public:
  /// Maps `path`. Throws woq::Error naming the path if it cannot be opened,
  /// stat'ed or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  /// The file's bytes.
  std::span<const std::uint8_t> bytes() const { return {data_, size_}; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Hands the whole pages inside `bytes` (a range of a MappedFile) back to the
/// kernel (madvise MADV_DONTNEED): they leave the process's resident set and
/// are re-read from the file if touched again. Used after a tensor has been
/// converted, so loading does not hold the whole checkpoint resident.
void release_pages(std::span<const std::uint8_t> bytes);

/// Asks the kernel to start reading the pages of `bytes` (a range of a
/// MappedFile) from the file in the background (madvise MADV_WILLNEED), so
/// that a later read finds them in memory. Used to read the next decoder
/// block while the current one computes.
void prefetch_pages(std::span<const std::uint8_t> bytes);

}  // namespace woq
