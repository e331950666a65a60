// Tensor/sequence parallelism applied from outside: the layout a Decoder is built with, the
// communication at the edges of its linear layers and of its vocabulary (TensorParallelOps and
// VocabOps of model/parallel_ops.h, implemented here and in vocab_parallel.cpp), and the
// bookkeeping that follows from it (which parameters are replicated across the TP group).
#pragma once

#include <vector>

#include "comm/process_groups.h"
#include "model/decoder.h"

namespace loom::parallel {

// The Decoder layout for this rank of `groups` (its TP group), with or without SP, and the
// communication that goes with it.
TensorParallel tensor_parallel_layout(comm::ProcessGroups& groups, bool sequence_parallel);
// `tp` (size, rank, sequence_parallel and comm set by hand) with the communication filled in.
TensorParallel with_tensor_parallel_ops(TensorParallel tp);

// The Decoder's expert-parallel layout for this rank of `groups` (its EP group), with the
// experts' MLPs split over `etp` ranks of the TP group (consecutive TP ranks; etp = tp uses the
// TP communicator, 1 < etp < tp splits one off: collective over the TP group). Throws naming
// the values when etp does not divide parallel.tp.
ExpertParallel expert_parallel_layout(comm::ProcessGroups& groups, int etp = 1);

// Per-parameter weights for the global gradient norm so that every element of the model
// counts exactly once over the TP group: sharded parameters count on every rank (each holds a
// different piece), replicated ones (norms, row-parallel biases, position table) only on TP
// rank 0. Expert weights are replicated over TP unless split by expert tensor parallelism:
// they count on the first `etp` TP ranks (one whole copy). Combine with
// DataParallel::grad_sq_local, all-reduced over tp x dp.
std::vector<double> grad_norm_weights(const ParamSet& params, int tp_rank, int etp = 1);

}  // namespace loom::parallel
