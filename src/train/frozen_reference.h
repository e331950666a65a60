// DPO's frozen reference (TrainSetup::reference): the policy's starting weights in the policy's
// layout, never stepped.
#pragma once

#include "ckpt/checkpoint.h"
#include "train/train_setup.h"

namespace loom {

// The reference holding the policy's weights now (`from` null), or `from`'s weights.
void make_reference(TrainSetup& s, const ckpt::Checkpoint* from);
// After the run's start point is settled: a weights-only train.init_from's weights become the
// reference (see frozen_reference.cpp).
void reference_from_init_weights(TrainSetup& s, bool resumed);

}  // namespace loom
