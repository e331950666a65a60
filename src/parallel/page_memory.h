// Memory that ZeRO releases between uses, returned to the kernel page by page, and the resident
// bytes of a buffer, which the ZeRO memory tests and DataParallel::memory_use() measure.
#pragma once

#include <cstdint>

#include "kernels/backend.h"

namespace loom::parallel {

// Zeroes [p, p+n) and returns its whole pages to the kernel (madvise), so memory that is not
// needed between uses stops counting against the process.
void release_memory(float* p, int64_t n);
// The same for a buffer of `be`: on a backend whose memory the host cannot touch (a GPU) the
// range is zero-filled with a Backend op and stays allocated (the engine only needs it zero).
void release_memory(Backend& be, float* p, int64_t n);
// Resident bytes of [p, p+bytes), measured with mincore().
int64_t resident_bytes(const void* p, int64_t bytes);

}  // namespace loom::parallel
