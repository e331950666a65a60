// The vocabulary split over the tensor-parallel group (Megatron): each rank holds rows
// [rank * V / tp, (rank + 1) * V / tp) of the embedding and of the output head. The lookup is
// each rank's slice (zero rows for the others' tokens) summed over the group; the
// cross-entropy never gathers logits: row maxima, sums of exponentials and target logits are
// all-reduced (3 numbers per row) and each rank turns its slice of logits into its slice of the
// gradient. Both run as Backend ops (the vocabulary-slice block of kernels/backend.h) between
// the collectives: no host loop, the same on a device.
#pragma once

#include <memory>

#include "model/decoder.h"
#include "model/parallel_ops.h"

namespace loom::parallel {

// VocabOps for `tp` (its comm set), over a vocabulary of `vocab` (divisible by tp.size);
// `edges` carries the token split of SP (reduce-scatter after the lookup).
std::unique_ptr<VocabOps> make_vocab_parallel(const TensorParallel& tp, TensorParallelOps& edges,
                                              int vocab, Backend& be);

}  // namespace loom::parallel
