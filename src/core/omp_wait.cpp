#include "core/omp_wait.h"

#include <unistd.h>

#include <cstdlib>

namespace loom {

void bound_omp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) return;
  if (argv == nullptr || argv[0] == nullptr) return;
  setenv("GOMP_SPINCOUNT", kOmpSpinCount, 1);
  execv("/proc/self/exe", argv);
  unsetenv("GOMP_SPINCOUNT");  // exec failed: carry on with libgomp's default
}

}  // namespace loom
