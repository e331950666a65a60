// Launchers of the vocabulary-slice kernels (vocab_slice.cu; semantics: kernels/backend.h,
// the tensor-parallel block). Asynchronous on `st`.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace loom::cuda {

void embedding_forward_slice(cudaStream_t st, float* out, const int32_t* ids, const float* table,
                             int N, int C, int v0, int V);
void embedding_backward_slice(cudaStream_t st, float* dtable, const float* dout, const int32_t* ids,
                              int N, int C, int v0, int V);
void cross_entropy_slice_max(cudaStream_t st, float* mx, const float* logits, int N, int V);
void cross_entropy_slice_sums(cudaStream_t st, float* se, float* tl, const float* logits,
                              const float* mx, const int32_t* targets, int N, int V, int v0);
void cross_entropy_slice_finish(cudaStream_t st, float* losses, float* dlogits, const float* logits,
                                const float* mx, const float* se, const float* tl,
                                const int32_t* targets, int N, int V, int v0, float dloss,
                                const float* weights);

}  // namespace loom::cuda
