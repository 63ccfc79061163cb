#include "quantize/resume.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/error.h"
#include "io/json_file.h"

namespace woq {

namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'W', 'O', 'Q', 'B', 'L', 'K', '0', '1'};
constexpr int kManifestVersion = 1;

void put(std::string& out, const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); }
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

}  // namespace

std::string fnv1a64_hex(const void* bytes, std::size_t size) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = static_cast<const unsigned char*>(bytes);
  for (std::size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

ResumeDir::ResumeDir(const fs::path& out, nlohmann::ordered_json fingerprint, std::int64_t layers, bool resume,
                     bool discard, const std::function<void(const std::string&)>& log)
    : dir_(out.parent_path() / fmt::format(".{}.partial", out.filename().string())),
      fingerprint_(std::move(fingerprint)),
      layers_(layers) {
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
  const fs::path manifest = dir_ / "manifest.json";
  if (exists && !resume) {
    std::int64_t done = 0;
    try {
      done = static_cast<std::int64_t>(read_json_file(manifest.string()).at("blocks").size());
    } catch (const std::exception&) {
    }
    if (done > 0 && !discard) {
      close(lock_fd_);
      lock_fd_ = -1;
      fail("{} holds an interrupted run's {} finished blocks: pass --resume to continue that run, or --force to "
           "discard them and start over",
           dir_.string(), done);
    }
    for (const auto& entry : fs::directory_iterator(dir_, ec)) fs::remove_all(entry.path(), ec);
    if (log && done > 0)
      log(fmt::format("--force: discarded {}, an interrupted run's {} finished blocks", dir_.string(), done));
  }
  if (!resume) {
    write_manifest();
    return;
  }
  nlohmann::json m;
  try {
    m = read_json_file(manifest.string());
  } catch (const Error& e) {
    fail("--resume: {} has no readable manifest ({}); start over without --resume", dir_.string(), e.what());
  }
  const auto& fp = m.contains("fingerprint") ? m["fingerprint"] : nlohmann::json();
  if (m.value("version", 0) != kManifestVersion || m.value("layers", std::int64_t{-1}) != layers_ ||
      nlohmann::json::parse(fingerprint_.dump()) != fp) {
    std::string what = "the run";
    if (fp.is_object())
      for (const auto& [key, value] : fingerprint_.items())
        if (!fp.contains(key) || nlohmann::json::parse(value.dump()) != fp[key]) {
          what = key;
          break;
        }
    fail("--resume: {} belongs to a different run ({} differs); start over without --resume", dir_.string(), what);
  }
  for (const auto& b : m.at("blocks")) hashes_.push_back(b.at("fnv1a64").get<std::string>());
  if (completed() > layers_) fail("--resume: {}'s manifest lists more blocks than the model has", dir_.string());
  for (std::int64_t l = 0; l < completed(); ++l) load_block(l);  // every hash checked before any work
  if (log) log(fmt::format("resuming: {} of {} blocks were done in {}", completed(), layers_, dir_.string()));
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
    fail("--resume: {} does not match the hash in the manifest (damaged); start over without --resume", name);
  Reader r{bytes, name};
  char magic[sizeof kMagic];
  r.get(magic, sizeof magic);
  if (std::memcmp(magic, kMagic, sizeof kMagic) != 0) fail("{}: not a woq block file", name);
  std::vector<QuantMatrix> block(static_cast<std::size_t>(r.value<std::uint64_t>()));
  if (block.size() != 7) fail("{}: {} matrices, not 7", name, block.size());
  for (QuantMatrix& m : block) {
    m.type = static_cast<LowBit>(r.value<std::int32_t>());
    m.int4_range = static_cast<Int4Range>(r.value<std::int32_t>());
    m.activations = static_cast<Activations>(r.value<std::int32_t>());
    for (std::int64_t* v : {&m.rows, &m.cols, &m.group_size, &m.groups_per_row, &m.row_bytes, &m.interleave})
      *v = r.value<std::int64_t>();
    m.data = r.vector<std::uint8_t>();
    m.scales = r.vector<std::uint16_t>();
    m.zeros = r.vector<std::uint8_t>();
    m.input_order = r.vector<std::int32_t>();
  }
  if (r.at != bytes.size()) fail("{}: trailing bytes", name);
  return block;
}

void ResumeDir::remove() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

}  // namespace woq
