// The processes of one job: the seam through which woq's data-parallel commands split their work and gather
// their results (ranks in MPI's sense). One process is the default; the ranks of an `mpirun` job come from
// dist/mpi_ranks.h, which the build has when it finds MPI.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/error.h"

namespace woq {

/// A failure of the ranks' transport (MPI reported an error, a message of the wrong size came): the ranks may no
/// longer agree on where they are, so the job cannot go on, unlike a refusal that every rank makes alike.
class TransportError : public Error {
 public:
  using Error::Error;
};

/// The processes of one job, numbered 0..size()-1. Collective calls must be made by every rank, in the same
/// order; a rank that fails between them calls abort(), or the others would wait for it forever. Calls may come
/// from any thread, one at a time.
class Ranks {
 public:
  virtual ~Ranks() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Every rank's bytes, in rank order, on every rank. Collective. Throws TransportError when the transport fails.
  virtual std::vector<std::string> all_gather(std::string_view mine) = 0;
  /// Sends `bytes` to rank `to`, which receive()s them; blocks until they are sent.
  virtual void send(int to, std::span<const std::byte> bytes) = 0;
  /// Receives exactly `bytes.size()` bytes that rank `from` send()s. Throws TransportError when another size comes
  /// or the transport fails (as send() and broadcast() do).
  virtual void receive(int from, std::span<std::byte> bytes) = 0;
  /// `bytes` of rank `root` into `bytes` on every rank (each passes the same size). Collective.
  virtual void broadcast(int root, std::span<std::byte> bytes) = 0;
  /// Ends the whole job with `code` (every rank), after this rank has said why. Does not return.
  [[noreturn]] virtual void abort(int code) = 0;
  /// Rank 0: the one that prints reports and writes files.
  bool leader() const { return rank() == 0; }
};

/// The one-process job (rank 0 of 1).
Ranks& one_process();

/// The ranks a launcher started this process among: OMPI_COMM_WORLD_SIZE (Open MPI), PMI_SIZE (MPICH, Intel
/// MPI) or PMIX_SIZE; 1 when none is set. Throws woq::Error on a value that is not a positive integer.
int launched_ranks();

/// Items [first, second) of `n` that `rank` of `size` takes: contiguous, in rank order, shares differing by at
/// most one (the lower ranks take the larger).
std::pair<std::int64_t, std::int64_t> share(std::int64_t n, int rank, int size);

/// Every rank's doubles concatenated in rank order (all_gather of their bytes). Collective. Throws woq::Error
/// when a rank's part is not a whole number of doubles, or as all_gather does.
std::vector<double> gather_doubles(Ranks& ranks, const std::vector<double>& mine);

}  // namespace woq
