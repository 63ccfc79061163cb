#include "core/ranks.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace woq {

namespace {

class OneProcess final : public Ranks {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::vector<std::string> all_gather(std::string_view mine) override { return {std::string(mine)}; }
  void send(int to, std::span<const std::byte>) override { fail("send to rank {} in a one-process job", to); }
  void receive(int from, std::span<std::byte>) override { fail("receive from rank {} in a one-process job", from); }
  void broadcast(int root, std::span<std::byte>) override {
    if (root != 0) fail("broadcast from rank {} in a one-process job", root);
  }
  [[noreturn]] void abort(int code) override { std::exit(code); }
};

}  // namespace

Ranks& one_process() {
  static OneProcess one;
  return one;
}

int launched_ranks() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(name);
    if (v == nullptr) continue;
    char* end = nullptr;
    const long n = std::strtol(v, &end, 10);
    if (end == v || *end != '\0' || n < 1 || n > 1 << 20) fail("environment variable {}='{}' is not a number of ranks", name, v);
    return static_cast<int>(n);
  }
  return 1;
}

std::pair<std::int64_t, std::int64_t> share(std::int64_t n, int rank, int size) {
  if (size < 1 || rank < 0 || rank >= size || n < 0) fail("share: rank {} of {} for {} items", rank, size, n);
  const std::int64_t base = n / size, extra = n % size;
  const std::int64_t first = rank * base + std::min<std::int64_t>(rank, extra);
  return {first, first + base + (rank < extra ? 1 : 0)};
}

std::vector<double> gather_doubles(Ranks& ranks, const std::vector<double>& mine) {
  const std::vector<std::string> parts =
      ranks.all_gather(std::string_view(reinterpret_cast<const char*>(mine.data()), mine.size() * sizeof(double)));
  std::vector<double> out;
  for (std::size_t r = 0; r < parts.size(); ++r) {
    if (parts[r].size() % sizeof(double) != 0) fail("rank {} sent {} bytes, not a whole number of doubles", r, parts[r].size());
    const std::size_t at = out.size();
    out.resize(at + parts[r].size() / sizeof(double));
    if (!parts[r].empty()) std::memcpy(out.data() + at, parts[r].data(), parts[r].size());
  }
  return out;
}

}  // namespace woq
