#include "train/dpo.h"

#include <cmath>

#include "core/error.h"

namespace loom {

DpoLoss dpo_loss_from_name(const std::string& name) {
  if (name == "sigmoid") return DpoLoss::Sigmoid;
  if (name == "ipo") return DpoLoss::Ipo;
  if (name == "hinge") return DpoLoss::Hinge;
  fail("dpo.loss must be sigmoid, ipo or hinge, got '", name, "'");
}

const char* dpo_loss_name(DpoLoss l) {
  return l == DpoLoss::Sigmoid ? "sigmoid" : l == DpoLoss::Ipo ? "ipo" : "hinge";
}

DpoPair dpo_pair(double pi_c, double pi_r, double ref_c, double ref_r, double beta, DpoLoss type) {
  DpoPair p;
  const double h = (pi_c - ref_c) - (pi_r - ref_r);
  double dh = 0;  // dL / dh
  switch (type) {
    case DpoLoss::Sigmoid: {
      const double z = beta * h;
      // -log sigmoid(z) = log(1 + exp(-z)), computed without overflow either way.
      p.loss = z > 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z));
      dh = -beta / (1 + std::exp(z));  // -beta sigmoid(-z)
      break;
    }
    case DpoLoss::Ipo: {
      const double d = h - 1 / (2 * beta);
      p.loss = d * d;
      dh = 2 * d;
      break;
    }
    case DpoLoss::Hinge: {
      const double m = 1 - beta * h;
      p.loss = m > 0 ? m : 0;
      dh = m > 0 ? -beta : 0;
      break;
    }
  }
  p.d_chosen = dh;
  p.d_rejected = -dh;
  p.reward_chosen = beta * (pi_c - ref_c);
  p.reward_rejected = beta * (pi_r - ref_r);
  return p;
}

}  // namespace loom
