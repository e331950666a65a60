// The test binaries' main: GoogleTest's, after bounding libgomp's idle spinning as loom's own
// main does (core/omp_wait.h), so tests run side by side on few cores without their OpenMP
// teams spinning against each other.
#include <gtest/gtest.h>

#include "core/omp_wait.h"

int main(int argc, char** argv) {
  loom::bound_omp_spin(argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
