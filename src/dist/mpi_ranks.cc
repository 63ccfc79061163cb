#include "dist/mpi_ranks.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <thread>

#include "core/error.h"

namespace woq {

namespace {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw TransportError(fmt::format("{} failed: {}", call, text));
}

// An MPI count: at most 2 GiB - 1 bytes per message.
int count(std::size_t bytes) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    fail("a message of {} bytes, more than MPI's 2 GiB per call", bytes);
  return static_cast<int>(bytes);
}

constexpr int kTag = 7;           // woq's point-to-point messages
constexpr int kBroadcastTag = 8;  // broadcast(): a message from the root to each other rank

using Clock = std::chrono::steady_clock;

// Between polls of MPI: nothing for the first 200 ms, then sleeps from 50 us doubling up to 1 ms. A pipeline's
// stage waits about one stage's compute for its states, tens of ms a token: polling without sleeps keeps a 2-rank
// decode at one process's speed (a 20 ms window cost 8 % of it here, the wake-ups coming late). Open MPI's
// blocking calls poll at 100 % of a core for as long as they wait: an idle `woq serve` rank would burn a core for
// nothing (and take it from a rank that works, where ranks share a machine).
class Backoff {
 public:
  void pause() {
    if (Clock::now() - start_ < std::chrono::milliseconds(200)) return;
    std::this_thread::sleep_for(nap_);
    nap_ = std::min(nap_ * 2, std::chrono::microseconds(1000));
  }

 private:
  Clock::time_point start_ = Clock::now();
  std::chrono::microseconds nap_{50};
};

// Receives the next message of `tag` from rank `from` into `bytes`, which it must fill exactly: waits for it to
// arrive (MPI_Improbe, with Backoff), then takes it at once (MPI_Mrecv: the sender is sending).
void receive_exact(int rank, int from, int tag, std::span<std::byte> bytes) {
  MPI_Status status;
  MPI_Message message;
  for (Backoff backoff;; backoff.pause()) {
    int arrived = 0;
    check(MPI_Improbe(from, tag, MPI_COMM_WORLD, &arrived, &message, &status), "MPI_Improbe");
    if (arrived != 0) break;
  }
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  if (static_cast<std::size_t>(got) != bytes.size())
    throw TransportError(fmt::format("rank {} sent {} bytes where rank {} expected {}", from, got, rank, bytes.size()));
  check(MPI_Mrecv(bytes.data(), got, MPI_BYTE, &message, &status), "MPI_Mrecv");
}

class MpiRanks final : public Ranks {
 public:
  MpiRanks() {
    int provided = 0;
    // Serialized: woq serve's engine thread makes a pipeline's calls, the main thread the others (never at once).
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "MPI_Init_thread");
    if (provided < MPI_THREAD_SERIALIZED) fail("this MPI library does not allow calls from more than one thread (MPI_THREAD_SERIALIZED)");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  }
  ~MpiRanks() override { MPI_Finalize(); }
  MpiRanks(const MpiRanks&) = delete;
  MpiRanks& operator=(const MpiRanks&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::vector<std::string> all_gather(std::string_view mine) override {
    // MPI counts are ints: a rank's part is at most 2 GiB - 1 and the sum must fit too.
    if (mine.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
      fail("rank {} has {} bytes to gather, more than MPI's 2 GiB per call", rank_, mine.size());
    const long long n = static_cast<long long>(mine.size());
    std::vector<long long> sizes(static_cast<std::size_t>(size_));
    check(MPI_Allgather(&n, 1, MPI_LONG_LONG, sizes.data(), 1, MPI_LONG_LONG, MPI_COMM_WORLD), "MPI_Allgather");
    std::vector<int> counts(sizes.size()), displs(sizes.size());
    long long total = 0;
    for (std::size_t r = 0; r < sizes.size(); ++r) {
      if (sizes[r] < 0 || total + sizes[r] > std::numeric_limits<int>::max())
        fail("the ranks have {} bytes to gather in all, more than MPI's 2 GiB per call", total + sizes[r]);
      counts[r] = static_cast<int>(sizes[r]);
      displs[r] = static_cast<int>(total);
      total += sizes[r];
    }
    std::string all(static_cast<std::size_t>(total), '\0');
    check(MPI_Allgatherv(mine.data(), static_cast<int>(n), MPI_BYTE, all.data(), counts.data(), displs.data(), MPI_BYTE,
                         MPI_COMM_WORLD),
          "MPI_Allgatherv");
    std::vector<std::string> out;
    for (std::size_t r = 0; r < sizes.size(); ++r)
      out.push_back(all.substr(static_cast<std::size_t>(displs[r]), static_cast<std::size_t>(counts[r])));
    return out;
  }

  void send(int to, std::span<const std::byte> bytes) override {
    // Blocking: the receiver is waiting for it, or soon will be (a pipeline's next stage).
    check(MPI_Send(bytes.data(), count(bytes.size()), MPI_BYTE, to, kTag, MPI_COMM_WORLD), "MPI_Send");
  }

  void receive(int from, std::span<std::byte> bytes) override { receive_exact(rank_, from, kTag, bytes); }

  void broadcast(int root, std::span<std::byte> bytes) override {
    // As messages from the root (not MPI_Bcast, which polls at 100 % of a core while it waits).
    if (rank_ != root) return receive_exact(rank_, root, kBroadcastTag, bytes);
    for (int r = 0; r < size_; ++r)
      if (r != root)
        check(MPI_Send(bytes.data(), count(bytes.size()), MPI_BYTE, r, kBroadcastTag, MPI_COMM_WORLD), "MPI_Send");
  }

  [[noreturn]] void abort(int code) override {
    std::fflush(nullptr);
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; should it, end this rank anyway
  }

 private:
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Ranks> mpi_ranks() { return std::make_unique<MpiRanks>(); }

}  // namespace woq
