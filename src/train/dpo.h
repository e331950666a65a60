// Preference-training losses on sequence log-probabilities (sums over a reply's tokens) of the
// policy pi and of a frozen reference ref, as TRL computes them (names and defaults of TRL's
// DPOConfig, CPOConfig, ORPOConfig and KTOConfig). For a pair (chosen c, rejected r) with reply
// token counts n_c, n_r:
//   sigmoid:  h = (pi_c - ref_c) - (pi_r - ref_r);  L = -log sigmoid(beta h)     (DPO; TRL's
//   default) hinge:    L = max(0, 1 - beta h)                                             (SLiC)
//   ipo:      h = (pi_c - ref_c) / n_c - (pi_r - ref_r) / n_r;  L = (h - 1 / (2 beta))^2
//             (Azar et al. 2023, length-normalised as TRL and the paper's experiments)
//   simpo:    h = pi_c / n_c - pi_r / n_r - gamma / beta;  L = -log sigmoid(beta h)
//             (Meng et al. 2024, no reference; gamma = simpo_gamma) plus cpo_alpha x the NLL of
//             the chosen replies (TRL's CPOTrainer; cpo_alpha = 0 is SimPO alone)
//   orpo:     a = pi / n (mean log-prob per token);
//             o = (a_c - log(1 - e^a_c)) - (a_r - log(1 - e^a_r));  L = -beta log sigmoid(o)
//             plus the NLL of the chosen replies (Hong et al. 2024; beta is the paper's lambda)
// The NLL term of simpo and orpo is, as TRL's cross-entropy, the mean over a micro-batch's
// chosen reply tokens (the recipe adds it to the token weights; dpo_pair covers the pair term).
// Rewards are beta (pi - ref) for sigmoid, hinge and ipo (TRL logs the sums' for IPO too),
// beta pi / n for simpo and orpo; accuracy counts pairs whose chosen reward is the larger.
// KTO (Ethayarajh et al. 2024), unpaired: an example y of a prompt x is desirable or not; with
// z_0 = max(0, mean over the micro-batch of pi(y'|x) - ref(y'|x)), y' another example's reply
// (TRL's KL estimate from mismatched pairs, no gradient),
//   desirable:    L = desirable_weight   (1 - sigmoid(beta ((pi - ref) - z_0)))
//   undesirable:  L = undesirable_weight (1 - sigmoid(beta (z_0 - (pi - ref))))
// averaged over examples; rewards beta (pi - ref).
#pragma once

#include <cstdint>
#include <string>

namespace loom {

enum class DpoLoss { Sigmoid, Ipo, Hinge, Simpo, Orpo, Kto };
DpoLoss dpo_loss_from_name(const std::string& name);
const char* dpo_loss_name(DpoLoss l);

struct DpoOptions {
  double beta = 0.1;                // dpo.beta
  DpoLoss loss = DpoLoss::Sigmoid;  // dpo.loss
  double simpo_gamma = 0.5;         // dpo.simpo_gamma (simpo)
  double cpo_alpha = 1.0;           // dpo.cpo_alpha (simpo: the chosen NLL's weight)
  double desirable_weight = 1.0;    // dpo.desirable_weight (kto)
  double undesirable_weight = 1.0;  // dpo.undesirable_weight (kto)
};

// Whether the loss reads a reference model (simpo and orpo do not).
bool uses_reference(DpoLoss l);
// The weight of the chosen replies' NLL in the loss: orpo 1, simpo cpo_alpha, else 0.
double nll_weight(const DpoOptions& o);

struct PairLogps {
  double pi_c = 0, pi_r = 0, ref_c = 0, ref_r = 0;  // summed over the reply's tokens
  int64_t n_c = 1, n_r = 1;                         // reply tokens (counted from 1)
};

struct DpoPair {
  double loss = 0;
  double d_chosen = 0, d_rejected = 0;  // dL / d pi_c and dL / d pi_r (the sums)
  double reward_chosen = 0, reward_rejected = 0;
};

// The pair term of a paired loss (not kto).
DpoPair dpo_pair(const PairLogps& x, const DpoOptions& o);

struct KtoTerm {
  double loss = 0, d_pi = 0, reward = 0;  // d_pi = dL / d pi (the sum)
};
// One KTO example; `kl` is z_0 (already clamped at 0).
KtoTerm kto_term(double pi, double ref, double kl, bool desirable, const DpoOptions& o);

}  // namespace loom
