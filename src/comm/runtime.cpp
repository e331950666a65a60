// The world communicator and job-level control (abort, finalize), with or without MPI.
#include <cstdio>
#include <cstdlib>

#include "comm/communicator.h"
#include "core/error.h"
#ifdef LOOM_HAVE_MPI
#include "comm/mpi_communicator.h"
#endif

namespace loom::comm {

static const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// Launcher-provided world size: OpenMPI's mpirun, PMIx/PMI (srun --mpi=pmix, MPICH) or Slurm.
static int launcher_world_size() {
  for (const char* k : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "SLURM_NTASKS"})
    if (const char* v = env(k)) return std::atoi(v);
  return env("PMIX_RANK") ? 2 : 0;  // PMIx without a size variable: ask MPI
}

bool launched_distributed() {
  return launcher_world_size() > 1;
}

static std::unique_ptr<Communicator>& world_slot() {
  static std::unique_ptr<Communicator> w;
  return w;
}

Communicator& world() {
  auto& w = world_slot();
  if (!w) {
#ifdef LOOM_HAVE_MPI
    if (launcher_world_size() > 0) {
      w = detail::make_mpi_world();
      // A clean exit finalises MPI; failures end the job through abort_job() instead, so this
      // never waits for ranks that are stuck in a collective.
      std::atexit([] { detail::mpi_finalize(); });
    }
#else
    LOOM_CHECK(launcher_world_size() <= 1,
               "this process was started as one of several ranks, but Loom was built without MPI "
               "(install libopenmpi-dev and rebuild)");
#endif
    if (!w) w = make_self_communicator("world");
  }
  return *w;
}

void abort_job(const std::string& message, int code) {
  int r = world_slot() ? world_slot()->rank() : 0;
  std::fprintf(stderr, "loom: rank %d failed: %s\n", r, message.c_str());
  std::fflush(stderr);
  std::fflush(stdout);
#ifdef LOOM_HAVE_MPI
  detail::mpi_abort(code);
#else
  std::_Exit(code);
#endif
}

void finalize() {
#ifdef LOOM_HAVE_MPI
  world_slot().reset();
  detail::mpi_finalize();
#endif
}

}  // namespace loom::comm
