// How long an idle OpenMP thread spins before it sleeps. libgomp's default, 300,000 spins
// (about 10 ms on an EPYC core), suits a node the job has to itself; beside any other busy
// process (a laptop, a shared node, a second job) a spinning thread takes the CPU from the one
// its team waits for, and 2 threads ran a tiny training run 4x slower than 1. Loom bounds the
// spin (GOMP_SPINCOUNT, see omp_wait.cpp) unless the user set OMP_WAIT_POLICY or
// GOMP_SPINCOUNT.
#pragma once

namespace loom::cpu {

// The spin count Loom gives libgomp (GOMP_SPINCOUNT) when the environment sets none.
inline constexpr const char* kOmpSpinCount = "1000";

// True when this process runs with the bounded spin (or the user's own setting).
bool omp_wait_bounded();

}  // namespace loom::cpu
