// How long an idle OpenMP thread spins before it sleeps. libgomp's default, 300,000 spins
// (about 10 ms on an EPYC core), suits a node the job has to itself; beside any other busy
// process (a laptop, a shared node, a second job) a spinning thread takes the CPU from the one
// its team waits for, and 2 threads ran a tiny training run 4x slower than 1. A program's
// main() bounds the spin (GOMP_SPINCOUNT) unless the user set OMP_WAIT_POLICY or
// GOMP_SPINCOUNT; libraries never re-execute a process on their own for it.
#pragma once

namespace loom {

// The spin count Loom gives libgomp (GOMP_SPINCOUNT) when the environment sets none.
inline constexpr const char* kOmpSpinCount = "1000";

// Called first in main(): when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set, sets
// GOMP_SPINCOUNT and executes the program again with the same arguments (libgomp reads its
// settings only when it loads, before main). Returns when nothing needs doing or the exec
// failed (then libgomp's default stays).
void bound_omp_spin(char** argv);

}  // namespace loom
