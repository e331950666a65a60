#include "kernels/cpu/omp_wait.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace loom::cpu {
namespace {

// libgomp reads its settings when it loads, before any code of ours runs: the process sets
// GOMP_SPINCOUNT and executes itself again, once, when neither it nor OMP_WAIT_POLICY is set.
// (The BLAS door's re-execution, blas_openblas.cpp, carries it over when it runs first.)
bool bound_omp_spin() {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr)
    return true;
  std::ifstream f("/proc/self/cmdline", std::ios::binary);
  const std::string cmdline((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<char*> argv;
  for (size_t i = 0; i < cmdline.size(); i += std::strlen(cmdline.c_str() + i) + 1)
    argv.push_back(const_cast<char*>(cmdline.c_str() + i));
  if (argv.empty()) return false;
  argv.push_back(nullptr);
  setenv("GOMP_SPINCOUNT", kOmpSpinCount, 1);
  execv("/proc/self/exe", argv.data());
  unsetenv("GOMP_SPINCOUNT");  // exec failed: carry on with libgomp's default
  return false;
}

// Runs before main() in every program that sets Loom's thread count (set_num_threads).
const bool kBounded = bound_omp_spin();

}  // namespace

bool omp_wait_bounded() {
  return kBounded;
}

}  // namespace loom::cpu
