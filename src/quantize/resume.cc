#include "quantize/resume.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "arch/architecture.h"
#include "core/error.h"
#include "core/hash.h"
#include "formats/format_traits.h"
#include "io/gguf.h"
#include "io/json_file.h"

namespace woq {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'W', 'O', 'Q', 'B', 'L', 'K', '0', '1'};
// 2: the input files are fingerprinted by size, mtime, ctime and inode (1 had size and a std::filesystem mtime).
constexpr int kManifestVersion = 2;

void put(std::string& out, const void* p, std::size_t n) {
  if (n > 0) out.append(static_cast<const char*>(p), n);  // an empty vector's data() may be null
}
template <class T>
void put_value(std::string& out, T v) {
  put(out, &v, sizeof v);
}
template <class T>
void put_vector(std::string& out, const std::vector<T>& v) {
  put_value<std::uint64_t>(out, v.size());
  put(out, v.data(), v.size() * sizeof(T));
}

// Reads what put wrote, failing with `name` on a short file.
struct Reader {
  const std::string& bytes;
  const std::string& name;
  std::size_t at = 0;
  void get(void* p, std::size_t n) {
    if (bytes.size() - at < n) fail("{}: truncated", name);
    if (n == 0) return;  // p may be an empty vector's null data()
    std::memcpy(p, bytes.data() + at, n);
    at += n;
  }
  template <class T>
  T value() {
    T v{};
    get(&v, sizeof v);
    return v;
  }
  template <class T>
  std::vector<T> vector() {
    const auto n = value<std::uint64_t>();
    if (n > (bytes.size() - at) / sizeof(T)) fail("{}: truncated", name);
    std::vector<T> v(static_cast<std::size_t>(n));
    get(v.data(), v.size() * sizeof(T));
    return v;
  }
};

std::string block_file(std::int64_t layer) { return fmt::format("block-{:05}.bin", layer); }

// A stored matrix whose fields agree with each other and with its buffers (the layout allocate_matrix gives its
// type, shape and group size): a block file whose hash was made to match after an edit fails here, naming it.
void check_layout(const QuantMatrix& m, const std::string& name, std::size_t index) {
  const auto damaged = [&](const std::string& what) {
    fail("{}: matrix {} is damaged ({}); start over with --force instead of --resume", name, index, what);
  };
  if (static_cast<std::uint32_t>(m.type) >= kFormatCount) damaged("unknown format");
  if (m.int4_range != Int4Range::kFull && m.int4_range != Int4Range::kClip) damaged("unknown int4 range");
  if (static_cast<std::uint32_t>(m.activations) > static_cast<std::uint32_t>(Activations::kInt16))
    damaged("unknown activations");
  constexpr std::int64_t kMaxDim = std::int64_t{1} << 31;
  if (m.rows <= 0 || m.rows >= kMaxDim || m.cols <= 0 || m.cols >= kMaxDim)
    damaged(fmt::format("shape [{}, {}]", m.rows, m.cols));
  QuantMatrix want;
  try {
    QuantSpec spec{m.type};
    spec.int4_range = m.int4_range;
    if (is_quantized(m.type)) spec.group_size = m.group_size;
    want = matrix_layout(m.rows, m.cols, spec);
  } catch (const Error& e) {
    damaged(e.what());
  }
  const std::size_t scales = is_quantized(m.type) ? static_cast<std::size_t>(m.rows * want.groups_per_row) : 0;
  if (m.group_size != want.group_size || m.groups_per_row != want.groups_per_row || m.row_bytes != want.row_bytes ||
      m.interleave != 1 || m.data.size() != static_cast<std::size_t>(m.rows * want.row_bytes) ||
      m.scales.size() != scales || m.zeros.size() != (m.type == LowBit::kAsymInt4 ? scales : 0))
    damaged("its sizes disagree");
  if (!m.input_order.empty() && m.input_order.size() != static_cast<std::size_t>(m.cols)) damaged("input order");
  for (const std::int32_t k : m.input_order)
    if (k < 0 || k >= m.cols) damaged("input order");
}

// A manifest.json as read back, every field type-checked.
struct Manifest {
  std::int64_t version = 0;
  std::int64_t layers = 0;
  nlohmann::json fingerprint;
  std::vector<std::string> hashes;  ///< per block, in order
};

// The integer field `key` of the manifest `m` read from `path`.
std::int64_t manifest_integer(const nlohmann::json& m, const std::string& path, const char* key) {
  if (!m.contains(key)) fail("{}: field '{}' is missing", path, key);
  const nlohmann::json& v = m[key];
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<std::uint64_t>() > INT64_MAX))
    fail("{}: field '{}' must be an integer, got {}", path, key, describe_json(v));
  return v.get<std::int64_t>();
}

// Reads the manifest at `path`: version and layers integers, fingerprint an object, blocks an array of
// {"file": "block-NNNNN.bin" (its position), "fnv1a64": 16 hex digits}. Throws woq::Error naming the file and the
// field for anything else. Only the version is read from a manifest of another version.
Manifest read_manifest(const std::string& path) {
  const nlohmann::json m = read_json_file(path);
  if (!m.is_object()) fail("{}: not a JSON object, got {}", path, describe_json(m));
  Manifest out;
  out.version = manifest_integer(m, path, "version");
  if (out.version != kManifestVersion) return out;
  out.layers = manifest_integer(m, path, "layers");
  if (out.layers < 0) fail("{}: field 'layers' must be >= 0, got {}", path, out.layers);
  if (!m.contains("fingerprint") || !m["fingerprint"].is_object())
    fail("{}: field 'fingerprint' must be an object, got {}", path,
         m.contains("fingerprint") ? describe_json(m["fingerprint"]) : std::string("nothing"));
  out.fingerprint = m["fingerprint"];
  if (!m.contains("blocks") || !m["blocks"].is_array())
    fail("{}: field 'blocks' must be an array, got {}", path,
         m.contains("blocks") ? describe_json(m["blocks"]) : std::string("nothing"));
  for (std::size_t i = 0; i < m["blocks"].size(); ++i) {
    const nlohmann::json& b = m["blocks"][i];
    const std::string file = block_file(static_cast<std::int64_t>(i));
    if (!b.is_object()) fail("{}: field 'blocks[{}]' must be an object, got {}", path, i, describe_json(b));
    if (!b.contains("file") || b["file"] != file)
      fail("{}: field 'blocks[{}].file' must be \"{}\", got {}", path, i, file,
           b.contains("file") ? describe_json(b["file"]) : std::string("nothing"));
    const auto* hash = b.contains("fnv1a64") ? b["fnv1a64"].get_ptr<const std::string*>() : nullptr;
    if (!hash || hash->size() != 16 || hash->find_first_not_of("0123456789abcdef") != std::string::npos)
      fail("{}: field 'blocks[{}].fnv1a64' must be a string of 16 hex digits, got {}", path, i,
           b.contains("fnv1a64") ? describe_json(b["fnv1a64"]) : std::string("nothing"));
    out.hashes.push_back(*hash);
  }
  return out;
}

}  // namespace

nlohmann::ordered_json input_fingerprint(const std::string& input) {
  std::vector<fs::path> files;
  if (is_gguf_path(input)) {
    for (const std::string& part : gguf_split_paths(input)) files.emplace_back(part);
  } else {
    for (const auto& entry : fs::directory_iterator(input))
      if (entry.is_regular_file()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  nlohmann::ordered_json out = {{"path", fs::weakly_canonical(input).string()}, {"files", nlohmann::ordered_json::array()}};
  for (const fs::path& f : files) out["files"].push_back(file_fingerprint(f.string()));
  return out;
}

nlohmann::ordered_json file_fingerprint(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) fail("{}: cannot stat: {}", path, std::strerror(errno));
  const auto ns = [](const timespec& t) { return static_cast<std::int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec; };
  return {{"name", fs::path(path).filename().string()},
          {"bytes", static_cast<std::int64_t>(st.st_size)},
          {"mtime_ns", ns(st.st_mtim)},
          {"ctime_ns", ns(st.st_ctim)},
          {"inode", static_cast<std::uint64_t>(st.st_ino)}};
}

ResumeDir::ResumeDir(const fs::path& out, nlohmann::ordered_json fingerprint, std::int64_t layers, bool resume,
                     bool discard, const std::function<void(const std::string&)>& log, std::int64_t block_matrices)
    : dir_(out.parent_path() / fmt::format(".{}.partial", out.filename().string())),
      fingerprint_(std::move(fingerprint)),
      layers_(layers), block_matrices_(block_matrices) {
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(dir_, ec);
  const bool exists = fs::exists(status);
  if (exists && !fs::is_directory(status)) fail("{}: exists and is not a directory woq made; remove it", dir_.string());
  if (!exists) {
    if (resume) fail("--resume: there is no interrupted run to continue ({} does not exist)", dir_.string());
    fs::create_directory(dir_, ec);
    if (ec) fail("{}: cannot create: {}", dir_.string(), ec.message());
  }
  lock_fd_ = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (lock_fd_ < 0) fail("{}: cannot open: {}", dir_.string(), std::strerror(errno));
  if (flock(lock_fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    close(lock_fd_);
    lock_fd_ = -1;
    fail("{}: another woq quantize is writing this output now", dir_.string());
  }
  // A failure below must not keep the lock: a retry in the same process (Python) would find it held.
  struct Unlock {
    int& fd;
    bool keep = false;
    ~Unlock() {
      if (keep || fd < 0) return;
      close(fd);
      fd = -1;
    }
  } unlock{lock_fd_};
  const fs::path manifest = dir_ / "manifest.json";
  if (exists && !resume) {
    std::int64_t done = 0;  // any version's blocks count; an unreadable manifest counts none
    try {
      const nlohmann::json m = read_json_file(manifest.string());
      if (m.is_object() && m.contains("blocks") && m["blocks"].is_array())
        done = static_cast<std::int64_t>(m["blocks"].size());
    } catch (const Error&) {
    }
    if (done > 0 && !discard)
      fail("{} holds an interrupted run's {} finished blocks: pass --resume to continue that run, or --force to "
           "discard them and start over",
           dir_.string(), done);
    for (const auto& entry : fs::directory_iterator(dir_, ec)) fs::remove_all(entry.path(), ec);
    if (log && done > 0)
      log(fmt::format("--force: discarded {}, an interrupted run's {} finished blocks", dir_.string(), done));
  }
  if (!resume) {
    write_manifest();
    unlock.keep = true;
    return;
  }
  continue_run(manifest);
  unlock.keep = true;
  if (log) log(fmt::format("resuming: {} of {} blocks were done in {}", completed(), layers_, dir_.string()));
}

void ResumeDir::continue_run(const fs::path& manifest) {
  Manifest m;
  try {
    m = read_manifest(manifest.string());
  } catch (const Error& e) {
    fail("--resume: {} has no readable manifest ({}); start over with --force instead of --resume", dir_.string(), e.what());
  }
  if (m.version != kManifestVersion)
    fail("--resume: {} was written by a woq with manifest version {} (this one reads version {}, which also "
         "fingerprints the input by ctime and inode); its blocks cannot be checked: start over with --force instead of --resume",
         manifest.string(), m.version, kManifestVersion);
  if (m.layers != layers_ || nlohmann::json::parse(fingerprint_.dump()) != m.fingerprint) {
    std::string what = m.layers != layers_ ? "the layer count" : "the run", detail;
    // The method first: another method's run lacks this one's options (a GPTQ fingerprint names no method).
    const auto method_of = [](const nlohmann::json& fp) {
      return fp.is_object() && fp.contains("method") ? fp["method"] : nlohmann::json("gptq");
    };
    const nlohmann::json ours = nlohmann::json::parse(fingerprint_.dump());
    // A setting's two values, when they are short to say (not the input's or the calibration's fingerprints).
    const auto values = [](const nlohmann::json& here, const nlohmann::json& there) {
      if (!here.is_primitive() || !(there.is_primitive() || there.is_null())) return std::string();
      return fmt::format(": {} here, {} in the stopped run", here.dump(), there.is_null() ? "unset" : there.dump());
    };
    if (m.layers == layers_ && method_of(ours) != method_of(m.fingerprint)) {
      what = "method";
      detail = values(method_of(ours), method_of(m.fingerprint));
    } else {
      for (const auto& [key, value] : fingerprint_.items())
        if (m.layers == layers_ && (!m.fingerprint.contains(key) || nlohmann::json::parse(value.dump()) != m.fingerprint[key])) {
          const nlohmann::json here = nlohmann::json::parse(value.dump());
          what = key;
          detail = values(here, m.fingerprint.contains(key) ? m.fingerprint[key] : nlohmann::json());
          break;
        }
    }
    fail("--resume: {} belongs to a different run ({} differs{}); start over with --force instead of --resume",
         dir_.string(), what, detail);
  }
  hashes_ = std::move(m.hashes);
  if (completed() > layers_) fail("--resume: {}'s manifest lists more blocks than the model has", dir_.string());
  for (std::int64_t l = 0; l < completed(); ++l) load_block(l);  // every hash checked before any work
}

ResumeDir::~ResumeDir() {
  if (lock_fd_ >= 0) close(lock_fd_);
}

void ResumeDir::write_manifest() const {
  nlohmann::ordered_json m = {{"version", kManifestVersion}, {"layers", layers_}, {"fingerprint", fingerprint_}};
  m["blocks"] = nlohmann::ordered_json::array();
  for (std::size_t l = 0; l < hashes_.size(); ++l)
    m["blocks"].push_back({{"file", block_file(static_cast<std::int64_t>(l))}, {"fnv1a64", hashes_[l]}});
  write_json_file((dir_ / "manifest.json").string(), m);
}

void ResumeDir::save_block(std::int64_t layer, const std::vector<QuantMatrix>& block) {
  if (layer != completed()) fail("internal: block {} saved after {} blocks", layer, completed());
  if (static_cast<std::int64_t>(block.size()) != block_matrices_)
    fail("internal: a block of {} matrices, not {}", block.size(), block_matrices_);
  std::string out(kMagic, sizeof kMagic);
  put_value<std::uint64_t>(out, block.size());
  for (const QuantMatrix& m : block) {
    put_value<std::int32_t>(out, static_cast<std::int32_t>(m.type));
    put_value<std::int32_t>(out, static_cast<std::int32_t>(m.int4_range));
    put_value<std::int32_t>(out, static_cast<std::int32_t>(m.activations));
    for (const std::int64_t v : {m.rows, m.cols, m.group_size, m.groups_per_row, m.row_bytes, m.interleave})
      put_value(out, v);
    put_vector(out, m.data);
    put_vector(out, m.scales);
    put_vector(out, m.zeros);
    put_vector(out, m.input_order);
  }
  write_text_file((dir_ / block_file(layer)).string(), out);
  hashes_.push_back(fnv1a64_hex(out.data(), out.size()));
  write_manifest();
}

std::vector<QuantMatrix> ResumeDir::load_block(std::int64_t layer) const {
  const std::string name = (dir_ / block_file(layer)).string();
  if (layer < 0 || layer >= completed()) fail("internal: block {} is not stored", layer);
  const std::string bytes = read_text_file(name, 1ull << 40);
  if (fnv1a64_hex(bytes.data(), bytes.size()) != hashes_[static_cast<std::size_t>(layer)])
    fail("--resume: {} does not match the hash in the manifest (damaged); start over with --force instead of --resume", name);
  Reader r{bytes, name};
  char magic[sizeof kMagic];
  r.get(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) fail("{}: not a woq block file", name);
  const auto count = r.value<std::uint64_t>();
  if (count != static_cast<std::uint64_t>(block_matrices_)) fail("{}: {} matrices, not {}", name, count, block_matrices_);
  std::vector<QuantMatrix> block(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < block.size(); ++i) {
    QuantMatrix& m = block[i];
    m.type = static_cast<LowBit>(r.value<std::int32_t>());
    m.int4_range = static_cast<Int4Range>(r.value<std::int32_t>());
    m.activations = static_cast<Activations>(r.value<std::int32_t>());
    for (std::int64_t* v : {&m.rows, &m.cols, &m.group_size, &m.groups_per_row, &m.row_bytes, &m.interleave})
      *v = r.value<std::int64_t>();
    m.data = r.vector<std::uint8_t>();
    m.scales = r.vector<std::uint16_t>();
    m.zeros = r.vector<std::uint8_t>();
    m.input_order = r.vector<std::int32_t>();
    check_layout(m, name, i);
  }
  if (r.at != bytes.size()) fail("{}: trailing bytes", name);
  return block;
}

void ResumeDir::remove() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace woq
