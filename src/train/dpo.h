// Direct preference optimisation (Rafailov et al. 2023), as TRL's DPOTrainer computes it, on
// sequence log-probabilities of the policy and of a frozen reference:
//   h = (pi_c - ref_c) - (pi_r - ref_r)          (chosen c, rejected r)
//   sigmoid:  L = -log sigmoid(beta h)            (the paper's loss; TRL's default)
//   ipo:      L = (h - 1 / (2 beta))^2            (Azar et al. 2023)
//   hinge:    L = max(0, 1 - beta h)              (SLiC)
// Rewards are beta (pi - ref); accuracy counts pairs whose chosen reward is the larger.
#pragma once

#include <string>

namespace loom {

enum class DpoLoss { Sigmoid, Ipo, Hinge };
DpoLoss dpo_loss_from_name(const std::string& name);
const char* dpo_loss_name(DpoLoss l);

struct DpoPair {
  double loss = 0;
  double d_chosen = 0, d_rejected = 0;  // dL / d pi_c and dL / d pi_r
  double reward_chosen = 0, reward_rejected = 0;
};

DpoPair dpo_pair(double pi_c, double pi_r, double ref_c, double ref_r, double beta, DpoLoss type);

}  // namespace loom
