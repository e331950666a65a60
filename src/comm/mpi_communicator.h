// Internal to src/comm: the MPI implementation behind Communicator (built when MPI is found).
#pragma once

#include <memory>

#include "comm/communicator.h"

namespace loom::comm::detail {

bool mpi_initialized();
// Initialises MPI (once) and returns MPI_COMM_WORLD as a Communicator.
std::unique_ptr<Communicator> make_mpi_world();
[[noreturn]] void mpi_abort(int code);
void mpi_finalize();

}  // namespace loom::comm::detail
