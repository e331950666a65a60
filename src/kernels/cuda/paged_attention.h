// Launchers of the paged-KV-cache kernels (paged_attention.cu; semantics: Backend::paged_kv_write
// and Backend::paged_attention in kernels/backend.h, layouts in kernels/paged_kv.h).
// Asynchronous on `st`; a block index outside the pool, or a block table too short for its
// chunk, is recorded in `err` (the backend's sync throws it).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"
#include "kernels/paged_kv.h"

namespace loom::cuda {

// Largest head dimension the attention kernel holds in registers (8 dims per lane).
constexpr int kPagedMaxHeadDim = 256;

void paged_kv_write(cudaStream_t st, const PagedKvBuffers& cache, const float* k_new,
                    const float* v_new, int ld, const int32_t* chunks, int nchunks, int rows,
                    DeviceError* err);
void paged_attention(cudaStream_t st, float* out, const float* q, int ldq,
                     const PagedKvBuffers& cache, const int32_t* chunks, int nchunks, int rows,
                     int Hq, float scale, DeviceError* err);

}  // namespace loom::cuda
