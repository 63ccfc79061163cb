// What lets an interrupted GPTQ run continue (`woq quantize --resume`): the
// quantized decoder blocks finished so far, kept in a directory beside the
// output, .NAME.partial for output NAME, with a manifest that names the run
// (its fingerprint: input files (input_fingerprint), options, calibration) and
// the FNV-1a 64 hash of each block file. Every file is written to a temporary name and renamed,
// the manifest last, so a run killed at any point leaves a directory that
// holds exactly the blocks its manifest lists.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "arch/architecture.h"
#include "formats/low_bit.h"

namespace woq {

/// What identifies one input file without reading it: {"name", "bytes",
/// "mtime_ns", "ctime_ns", "inode"} from stat(2), the times in nanoseconds
/// since the Unix epoch. A rewrite that keeps the size and restores the mtime
/// (cp -p, rsync -t, touch -d) still changes the ctime, which no ordinary tool
/// sets back; a file replaced by another (rename) has another inode. Throws
/// woq::Error naming the file when it cannot be stat'ed.
nlohmann::ordered_json file_fingerprint(const std::string& path);

/// What identifies the input of a quantize run: its canonical path and the
/// file_fingerprint of each of its regular files (a directory's, sorted by
/// name; each part of a GGUF split set). The tensors are not read.
nlohmann::ordered_json input_fingerprint(const std::string& input);

/// The partial-results directory of one output.
class ResumeDir {
 public:
  /// The directory for output `out` of a run described by `fingerprint`
  /// with `layers` decoder blocks. With `resume`, an existing directory whose
  /// manifest has the same fingerprint and layer count is continued (each
  /// block file's hash is checked); any other is an error saying what
  /// differs (a manifest of another version than this woq writes, or with a
  /// field of the wrong type, is an error naming the manifest and the
  /// field). Without `resume`, an existing one holding finished blocks is
  /// an error unless `discard` (--force): then it is emptied and reported to
  /// `log` and a new run starts over. Locked with flock(2) while open: a
  /// second run on the same output is refused. Each block holds
  /// `block_matrices` matrices (GPTQ: the seven linears; AWQ adds its folded
  /// norms and scales). Throws woq::Error on I/O failure.
  ResumeDir(const std::filesystem::path& out, nlohmann::ordered_json fingerprint, std::int64_t layers, bool resume,
            bool discard, const std::function<void(const std::string&)>& log,
            std::int64_t block_matrices = static_cast<std::int64_t>(kBlockLinears.size()));
  ~ResumeDir();
  ResumeDir(const ResumeDir&) = delete;
  ResumeDir& operator=(const ResumeDir&) = delete;

  /// Blocks 0 .. completed() - 1 are stored.
  std::int64_t completed() const { return static_cast<std::int64_t>(hashes_.size()); }
  /// Stores block `layer` (its block_matrices matrices) and records it in the
  /// manifest; `layer` must be completed(). Throws woq::Error on I/O failure.
  void save_block(std::int64_t layer, const std::vector<QuantMatrix>& block);
  /// Block `layer` (< completed()) as saved; throws woq::Error when its file
  /// is missing, truncated or does not match the manifest's hash.
  std::vector<QuantMatrix> load_block(std::int64_t layer) const;
  /// Removes the directory (after the output is published).
  void remove();

  const std::filesystem::path& path() const { return dir_; }

 private:
  void write_manifest() const;
  /// Takes the blocks of the manifest at `manifest` (the constructor's --resume).
  void continue_run(const std::filesystem::path& manifest);
  std::filesystem::path dir_;
  nlohmann::ordered_json fingerprint_;
  std::int64_t layers_;
  std::int64_t block_matrices_;
  std::vector<std::string> hashes_;  ///< per completed block
  int lock_fd_ = -1;
};

}  // namespace woq
