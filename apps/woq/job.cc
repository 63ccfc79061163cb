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

// The commands that split their work across ranks.
constexpr const char* kDataParallel[] = {"eval perplexity", "eval tasks"};

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

// What must agree across ranks, as named parts: the binary, the arguments, the files and directories (their
// regular files, sorted by name) the arguments name as inputs, and the kernels.
std::vector<std::pair<std::string, std::string>> job_digest(int argc, char** argv) {
  Fnv1a64 binary, args, inputs;
  digest_file(binary, "/proc/self/exe");
  // What follows these is written, not read: it may exist on some machines only.
  const auto is_output_flag = [](std::string_view flag) {
    for (const char* out : {"--json", "--log-samples", "--markdown", "-o", "--output", "--save-ref"})
      if (flag == out) return true;
    return false;
  };
  for (int i = 1; i < argc; ++i) {
    args.add(argv[i], std::char_traits<char>::length(argv[i]) + 1);
    if (is_output_flag(argv[i - 1])) continue;
    std::error_code ec;
    const std::filesystem::path p(argv[i]);
    if (std::filesystem::is_regular_file(p, ec)) {
      digest_file(inputs, p);
    } else if (std::filesystem::is_directory(p, ec)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p, ec))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const auto& f : files) {
        inputs.add(f.filename().string());
        digest_file(inputs, f);
      }
    }
  }
  // The kernels: the ISA woq dispatches to and the variables that choose kernels (WOQ_ISA, OPENBLAS_CORETYPE).
  Fnv1a64 kernels;
  kernels.add(isa_name(active_isa()));
  std::vector<std::string> vars;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string_view v(*e); v.starts_with("WOQ_ISA=") || v.starts_with("OPENBLAS_CORETYPE=")) vars.emplace_back(v);
  std::sort(vars.begin(), vars.end());
  for (const auto& v : vars) kernels.add(v.c_str(), v.size() + 1);
  return {{"binary (the woq executable)", binary.hex()}, {"command line", args.hex()},
          {"input files (the model, the text)", inputs.hex()},
          {"kernels (the CPU's instruction set woq uses, WOQ_ISA, OPENBLAS_CORETYPE)", kernels.hex()}};
}

}  // namespace

Ranks& job() { return mpi ? *mpi : one_process(); }

void join_job(int argc, char** argv, const std::string& command) {
  const int launched = launched_ranks();
  if (launched == 1) return;
#ifndef WOQ_HAVE_MPI
  fail("started as one of {} MPI ranks, but this woq was built without MPI (install libopenmpi-dev, configure and "
       "build again), or run it as one process", launched);
#else
  mpi = mpi_ranks();
  const bool leader = mpi->leader();
  if (std::find(std::begin(kDataParallel), std::end(kDataParallel), command) == std::end(kDataParallel))
    fail("{}", leader ? fmt::format("'woq {}' does not run across MPI ranks (these do: eval perplexity, eval tasks); run it as one "
                                    "process", command)
                      : "");
  const auto mine = job_digest(argc, argv);
  std::string packed;
  for (const auto& [what, hex] : mine) packed += hex;
  const std::vector<std::string> all = mpi->all_gather(packed);
  for (std::size_t r = 1; r < all.size(); ++r)
    for (std::size_t part = 0; part < mine.size(); ++part)
      if (all[r].compare(part * 16, 16, all[0], part * 16, 16) != 0)
        fail("{}", leader ? fmt::format("rank {} of {} runs with another {} than rank 0: every rank must run the same "
                                        "woq on the same files", r, all.size(), mine[part].first)
                          : "");
#endif
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
