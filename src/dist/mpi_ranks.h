// The ranks of an MPI job (Open MPI, MPICH: the MPI standard's C API), behind core/ranks.h's seam. Built when
// CMake finds MPI (Debian: libopenmpi-dev); `woq` then runs data-parallel under `mpirun -np R`.
#pragma once

#include <memory>

#include "core/ranks.h"

namespace woq {

/// MPI_Init_thread (funneled: only the thread that made it calls MPI) on construction, MPI_Finalize on
/// destruction; all_gather is MPI_Allgather of the sizes then MPI_Allgatherv of the bytes on MPI_COMM_WORLD;
/// abort is MPI_Abort. Errors of MPI calls return (MPI_ERRORS_RETURN) and become woq::Error naming the call.
/// One per process.
std::unique_ptr<Ranks> mpi_ranks();

}  // namespace woq
