// DPO's frozen reference (TrainSetup::reference): the policy's starting weights in the policy's
// layout, never stepped.
#pragma once

#include "ckpt/checkpoint.h"
#include "parallel/data_parallel.h"
#include "train/train_setup.h"

namespace loom {

// The reference holding the policy's weights now (`from` null), or `from`'s weights.
void make_reference(TrainSetup& s, const ckpt::Checkpoint* from);
// After the run's start point is settled: a weights-only train.init_from's weights become the
// reference (see frozen_reference.cpp).
void reference_from_init_weights(TrainSetup& s, bool resumed);

// A frozen copy of `policy` as `dp` (its optimizer) holds it now, for a learner that builds its
// engine without a TrainSetup (GRPO): the policy's config, backend, compute type and tensor-
// and expert-parallel layout (its shard of the weights). Under ZeRO-3 (dp.zero() == 3, no
// expert parallelism) only this rank's shard of the blocks, from dp's master rounded to the
// compute type, gathered block by block over `dp_comm` (dp's group) like DPO's reference.
FrozenReference frozen_copy_of(Decoder& policy, parallel::DataParallel& dp,
                               comm::Communicator& dp_comm);

}  // namespace loom
