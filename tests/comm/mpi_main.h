// main() for test binaries that run as N MPI ranks: initialises the world communicator before
// the tests and finalises MPI after them. Every rank runs every test; a test that fails on one
// rank fails the job (mpirun returns the worst exit code).
#pragma once

#include <gtest/gtest.h>

#include "comm/communicator.h"

#define LOOM_MPI_TEST_MAIN()                                                                  \
  int main(int argc, char** argv) {                                                           \
    testing::InitGoogleTest(&argc, argv);                                                     \
    loom::comm::Communicator& w = loom::comm::world();                                        \
    if (w.rank() != 0) {                                                                      \
      auto& listeners = testing::UnitTest::GetInstance()->listeners();                        \
      delete listeners.Release(listeners.default_result_printer());                           \
    }                                                                                         \
    int rc = RUN_ALL_TESTS();                                                                 \
    int64_t worst = w.all_reduce_scalar(static_cast<int64_t>(rc), loom::comm::ReduceOp::Max); \
    loom::comm::finalize();                                                                   \
    return static_cast<int>(worst);                                                           \
  }
