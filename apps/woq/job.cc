// The job a woq process belongs to: one process, or the ranks of an MPI launch (`mpirun -np R woq eval
// perplexity ...`), checked to run the same binary on the same inputs.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/core.h>

#include "commands.h"
#include "core/cpu.h"
#include "core/error.h"
#include "core/hash.h"
#ifdef WOQ_HAVE_MPI
#include "dist/mpi_ranks.h"
#endif

namespace woq::cli {

namespace {

std::unique_ptr<Ranks> mpi;  // set by join_job in an MPI launch

// The commands that split their work across ranks: the evaluations by items, generate by decoder blocks.
constexpr const char* kAcrossRanks[] = {"eval perplexity", "eval tasks", "generate"};

// Feeds `path`'s size and content into `h`: all of a file up to 64 MiB, else its first and last 16 MiB and
// 1 MiB at every 1 GiB between (a model's copies differ somewhere a 7B's 13 GB need not be read for).
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
  constexpr std::int64_t kWhole = 64 << 20, kEnds = 16 << 20, kGiB = std::int64_t{1} << 30;
  if (size <= kWhole) return take(0, size);
  take(0, kEnds);
  for (std::int64_t at = kGiB; at + (1 << 20) < size - kEnds; at += kGiB) take(at, 1 << 20);
  take(size - kEnds, kEnds);
}

// What must agree across ranks before any work, as named parts: the binary, the command line and the kernels.
// The inputs (the model, the text, the task files) are compared by the commands, from what they read
// (require_same_inputs): a relative path or a --flag=value names files no digest of argv can see.
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

bool runs_across_ranks(std::string_view command) {
  return std::find(std::begin(kAcrossRanks), std::end(kAcrossRanks), command) != std::end(kAcrossRanks);
}

}  // namespace

Ranks& job() { return mpi ? *mpi : one_process(); }

void join_job(int argc, char** argv, const std::string& command) {
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
      fail("{}", leader ? fmt::format("rank {} of {} runs 'woq {}', which does not run across MPI ranks (these do: eval "
                                      "perplexity, eval tasks, generate); run it as one process", r, all.size(), other)
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
  Fnv1a64 h;
  const std::filesystem::path root(path);
  std::error_code ec;
  if (std::filesystem::is_directory(root, ec)) {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root, ec))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      h.add(f.lexically_relative(root).string());
      digest_file(h, f);
    }
  } else {
    digest_file(h, root);
  }
  return h.hex();
}

void require_same_inputs(Ranks& ranks, const std::string& what, const std::string& digest) {
  if (ranks.size() == 1) return;
  const std::vector<std::string> all = ranks.all_gather(digest);
  for (std::size_t r = 1; r < all.size(); ++r)
    if (all[r] != all[0])
      fail("{}", ranks.leader() ? fmt::format("rank {} of {} differs from rank 0 in the {} it read: every rank must read "
                                              "the same files", r, all.size(), what)
                                : "");
}

int end_job(const std::string& what) {
  std::fflush(stdout);
  Ranks& ranks = job();
  if (ranks.size() == 1) {
    fmt::print(stderr, "woq: error: {}\n", what);
    return 1;
  }
  if (what.empty()) {
    // Every rank failed alike and rank 0 reports it: leave it the time to, before its MPI_Abort ends us.
    std::this_thread::sleep_for(std::chrono::seconds(10));
  } else {
    fmt::print(stderr, "woq: error (rank {} of {}): {}\n", ranks.rank(), ranks.size(), what);
    std::fflush(stderr);
  }
  ranks.abort(1);
  std::_Exit(1);  // not reached: abort does not return (the compiler cannot see it through the virtual call)
}

}  // namespace woq::cli
