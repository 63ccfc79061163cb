// The job a woq process belongs to: one process, or the ranks of an MPI launch (`mpirun -np R woq eval
// perplexity ...`), checked to run the same binary the same way on the same inputs.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/hash.h"
#include "core/memory.h"
#ifdef WOQ_HAVE_MPI
#include "dist/mpi_ranks.h"
#endif

namespace woq::cli {

namespace {

std::unique_ptr<Ranks> mpi;  // set by join_job in an MPI launch

// Feeds `path`'s size and content into `h`: all of a file up to 64 MiB, else its first and last 16 MiB and
// 1 MiB at every 64 MiB between (a model's copies differ somewhere a 7B's 13 GB need not all be read for).
void digest_file(Fnv1a64& h, const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("cannot read {}", path.string());
  const auto size = static_cast<std::int64_t>(std::filesystem::file_size(path));
  h.add(&size, sizeof size);
  std::vector<char> buf(1 << 20);
  const auto take = [&](std::int64_t at, std::int64_t n) {
    in.seekg(at);
    while (n > 0) {
      const auto k = std::min<std::int64_t>(n, static_cast<std::int64_t>(buf.size()));
      if (!in.read(buf.data(), k)) fail("cannot read {} at byte {}", path.string(), at);
      h.add(buf.data(), static_cast<std::size_t>(k));
      n -= k;
      at += k;
    }
  };
  constexpr std::int64_t kWhole = 64 << 20, kEnds = 16 << 20, kStride = 64 << 20;
  if (size <= kWhole) return take(0, size);
  take(0, kEnds);
  for (std::int64_t at = kStride; at + (1 << 20) < size - kEnds; at += kStride) take(at, 1 << 20);
  take(size - kEnds, kEnds);
}

// The files of a model directory woq reads: its top-level configuration, tokenizer and weight files, not
// hidden files (a downloader's metadata), READMEs or other formats' weights.
bool read_by_woq(const std::filesystem::path& file) {
  const std::string name = file.filename().string();
  if (name.empty() || name[0] == '.') return false;
  for (const char* ext : {".json", ".safetensors", ".model", ".gguf", ".txt", ".jinja"})
    if (name.ends_with(ext) && !name.starts_with("README")) return true;
  return false;
}

#ifdef WOQ_HAVE_MPI
// The commands that split their work across ranks: the evaluations by items, generate and serve by decoder blocks.
constexpr const char* kAcrossRanks[] = {"eval perplexity", "eval compare", "eval tasks", "eval recovery", "generate",
                                        "serve"};

bool runs_across_ranks(std::string_view command) {
  return std::find(std::begin(kAcrossRanks), std::end(kAcrossRanks), command) != std::end(kAcrossRanks);
}

// What must agree across ranks before any work, as named parts: the binary, the command line (so the same
// paths) and the kernels. The inputs (the model, the plan, the text, the task files) are compared by the
// commands, from what they read (require_same_inputs): a relative path names another file on another machine.
std::vector<std::pair<std::string, std::string>> job_digest(int argc, char** argv) {
  Fnv1a64 binary, args;
  digest_file(binary, "/proc/self/exe");
  for (int i = 1; i < argc; ++i) args.add(argv[i], std::char_traits<char>::length(argv[i]) + 1);
  // The kernels: the ISA woq dispatches to and the variables that choose kernels (WOQ_ISA, OPENBLAS_CORETYPE).
  Fnv1a64 kernels;
  kernels.add(isa_name(active_isa()));
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string_view v(*e); v.starts_with("WOQ_ISA=") || v.starts_with("OPENBLAS_CORETYPE=")) vars.emplace_back(v);
  std::sort(vars.begin(), vars.end());
  for (const auto& v : vars) kernels.add(v.c_str(), v.size() + 1);
  return {{"binary (the woq executable)", binary.hex()}, {"command line", args.hex()},
          {"kernels (the CPU's instruction set woq uses, WOQ_ISA, OPENBLAS_CORETYPE)", kernels.hex()}};
}
#endif

}  // namespace

Ranks& job() { return mpi ? *mpi : one_process(); }

void join_job([[maybe_unused]] int argc, [[maybe_unused]] char** argv, [[maybe_unused]] const std::string& command) {
  const int launched = launched_ranks();
  if (launched == 1) return;
#ifndef WOQ_HAVE_MPI
  fail("started as one of {} MPI ranks (the launcher's environment says so), but this woq was built without MPI "
       "(install libopenmpi-dev, configure and build again), or run it as one process", launched);
#else
  mpi = mpi_ranks();
  if (mpi->size() == 1) return;  // a launcher's variable, but a job of one (e.g. a child of an MPI rank)
  const bool leader = mpi->leader();
  // Each rank's command and digests, so that every rank reaches the same verdict and rank 0 states it.
  const auto mine = job_digest(argc, argv);
  std::string packed;
  for (const auto& [what, hex] : mine) packed += hex;
  const std::vector<std::string> all = mpi->all_gather(packed + command);
  const std::size_t digests = mine.size() * 16;
  for (std::size_t r = 0; r < all.size(); ++r) {
    const std::string other = all[r].substr(digests);
    if (!runs_across_ranks(other))
      fail("{}", leader ? fmt::format("rank {} of {} runs 'woq {}', which does not run across MPI ranks (these do: {}); "
                                      "run it as one process", r, all.size(), other, fmt::join(kAcrossRanks, ", "))
                        : "");
  }
  for (std::size_t r = 1; r < all.size(); ++r)
    for (std::size_t part = 0; part < mine.size(); ++part)
      if (all[r].compare(part * 16, 16, all[0], part * 16, 16) != 0)
        fail("{}", leader ? fmt::format("rank {} of {} differs from rank 0 in its {}: every rank must run the same woq "
                                        "the same way", r, all.size(), mine[part].first)
                          : "");
#endif
}

std::string path_digest(const std::string& path) {
  const std::filesystem::path root(path);
  std::error_code ec;
  std::vector<std::filesystem::path> files;
  if (std::filesystem::is_directory(root, ec)) {
    for (const auto& e : std::filesystem::directory_iterator(root, ec))
      if (e.is_regular_file() && read_by_woq(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
  } else {
    files.push_back(root);
  }
  std::string out;  // a line per file: "NAME HEX"
  for (const auto& f : files) {
    Fnv1a64 h;
    digest_file(h, f);
    out += fmt::format("{} {}\n", f.filename().string(), h.hex());
  }
  return out;
}

void require_same_inputs(Ranks& ranks, const std::string& what, const std::string& digest) {
  if (ranks.size() == 1) return;
  const std::vector<std::string> all = ranks.all_gather(digest);
  for (std::size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    // path_digest's lines "NAME HEX": name the first file that differs.
    std::string file;
    for (std::size_t a = 0, b = 0;;) {
      const std::size_t ea = all[0].find('\n', a), eb = all[r].find('\n', b);
      if (ea == std::string::npos || eb == std::string::npos) break;
      const std::string la = all[0].substr(a, ea - a), lb = all[r].substr(b, eb - b);
      if (la != lb) {
        const std::string na = la.substr(0, la.rfind(' ')), nb = lb.substr(0, lb.rfind(' '));
        file = na == nb ? fmt::format(" (file {})", na) : fmt::format(" (files {} and {})", na, nb);
        break;
      }
      a = ea + 1;
      b = eb + 1;
    }
    fail("{}", ranks.leader() ? fmt::format("rank {} of {} differs from rank 0 in the {}{} it read: every rank must read "
                                            "the same files", r, all.size(), what, file)
                              : "");
  }
}

void require_same_model(Ranks& ranks, const std::string& model, const ModelFlags& flags) {
  if (ranks.size() == 1) return;
  require_same_inputs(ranks, "model (-m)", path_digest(model));
  std::error_code ec;
  if (!flags.plan.empty() && std::filesystem::is_regular_file(flags.plan, ec))
    require_same_inputs(ranks, "plan (--plan)", path_digest(flags.plan));
}

void pipeline_share(Ranks& ranks, const ModelConfig& config, const std::string& model_dir, const ModelFlags& flags,
                    LoadOptions& options) {
  if (ranks.size() == 1) return;
  require_same_model(ranks, model_dir, flags);
  if (ranks.size() > config.num_hidden_layers)
    fail("{}", ranks.leader() ? fmt::format("{} ranks for a model of {} decoder blocks: at most one rank per block",
                                            ranks.size(), config.num_hidden_layers)
                              : "");  // every rank fails alike: rank 0 says it
  std::tie(options.first_block, options.last_block) = share(config.num_hidden_layers, ranks.rank(), ranks.size());
}

std::string pipeline_memory(Ranks& ranks, const ModelConfig& config) {
  if (ranks.size() == 1) return {};
  const std::vector<double> rss = gather_doubles(ranks, {static_cast<double>(peak_rss_bytes())});
  std::string parts;
  for (int q = 0; q < ranks.size(); ++q) {
    const auto [b0, b1] = share(config.num_hidden_layers, q, ranks.size());
    parts += fmt::format("{}rank {} blocks [{}, {}) {:.2f} GiB", q > 0 ? ", " : "", q, b0, b1,
                         rss[static_cast<std::size_t>(q)] / static_cast<double>(1ull << 30));
  }
  return fmt::format("woq: pipeline over {} ranks, peak RSS: {}\n", ranks.size(), parts);
}

int end_job(const std::string& what) {
  std::fflush(stdout);
  Ranks& ranks = job();
  if (ranks.size() == 1) {
    fmt::print(stderr, "woq: error: {}\n", what);
    return 1;
  }
  // Rank 0 reports at once. Another rank waits a moment first: when every rank fails alike (a prompt too long),
  // rank 0's MPI_Abort ends it before it repeats the message; when it fails alone, it still says why.
  if (!ranks.leader()) std::this_thread::sleep_for(std::chrono::seconds(what.empty() ? 10 : 1));
  if (!what.empty()) {
    fmt::print(stderr, "woq: error (rank {} of {}): {}\n", ranks.rank(), ranks.size(), what);
    std::fflush(stderr);
  }
  ranks.abort(1);
  std::_Exit(1);  // not reached: abort does not return (the compiler cannot see it through the virtual call)
}

}  // namespace woq::cli
