// Error checks for CUDA runtime, cuBLASLt and kernel launches: every failure becomes a
// loom::Error naming the call, the file and line, and the library's own message.
#pragma once

#include <cuda_runtime_api.h>

#include "core/error.h"

namespace loom::cuda {

[[noreturn]] inline void throw_cuda(cudaError_t e, const char* what, const char* file, int line) {
  fail("CUDA error in ", what, " (", file, ":", line, "): ", cudaGetErrorName(e), ": ",
       cudaGetErrorString(e));
}

}  // namespace loom::cuda

#define LOOM_CUDA_CHECK(call)                                                                     \
  do {                                                                                            \
    const cudaError_t loom_err_ = (call);                                                         \
    if (loom_err_ != cudaSuccess) ::loom::cuda::throw_cuda(loom_err_, #call, __FILE__, __LINE__); \
  } while (0)

// After a kernel launch: configuration errors (bad grid, too much shared memory) surface here;
// faults inside the kernel surface at the next synchronising call.
#define LOOM_CUDA_LAUNCHED(name)                                                  \
  do {                                                                            \
    const cudaError_t loom_err_ = cudaGetLastError();                             \
    if (loom_err_ != cudaSuccess)                                                 \
      ::loom::cuda::throw_cuda(loom_err_, "launch of " name, __FILE__, __LINE__); \
  } while (0)
