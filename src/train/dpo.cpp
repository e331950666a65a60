#include "train/dpo.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom {

DpoLoss dpo_loss_from_name(const std::string& name) {
  if (name == "sigmoid") return DpoLoss::Sigmoid;
  if (name == "ipo") return DpoLoss::Ipo;
  if (name == "hinge") return DpoLoss::Hinge;
  if (name == "simpo") return DpoLoss::Simpo;
  if (name == "orpo") return DpoLoss::Orpo;
  if (name == "kto") return DpoLoss::Kto;
  fail("dpo.loss must be sigmoid, ipo, hinge, simpo, orpo or kto, got '", name, "'");
}

const char* dpo_loss_name(DpoLoss l) {
  switch (l) {
    case DpoLoss::Sigmoid:
      return "sigmoid";
    case DpoLoss::Ipo:
      return "ipo";
    case DpoLoss::Hinge:
      return "hinge";
    case DpoLoss::Simpo:
      return "simpo";
    case DpoLoss::Orpo:
      return "orpo";
    case DpoLoss::Kto:
      return "kto";
  }
  return "?";
}

bool uses_reference(DpoLoss l) {
  return l != DpoLoss::Simpo && l != DpoLoss::Orpo;
}

double nll_weight(const DpoOptions& o) {
  return o.loss == DpoLoss::Orpo ? 1.0 : o.loss == DpoLoss::Simpo ? o.cpo_alpha : 0.0;
}

namespace {

// -log sigmoid(z) = log(1 + exp(-z)), without overflow either way.
double softplus_neg(double z) {
  return z > 0 ? std::log1p(std::exp(-z)) : -z + std::log1p(std::exp(z));
}
double sigmoid(double z) {
  return z >= 0 ? 1 / (1 + std::exp(-z)) : std::exp(z) / (1 + std::exp(z));
}
// log(1 - e^a) for a < 0, branching at -ln 2 against cancellation.
double log1mexp(double a) {
  return a < -0.6931471805599453 ? std::log1p(-std::exp(a)) : std::log(-std::expm1(a));
}

}  // namespace

DpoPair dpo_pair(const PairLogps& x, const DpoOptions& o) {
  LOOM_CHECK(o.loss != DpoLoss::Kto, "dpo_pair: kto is unpaired (kto_term)");
  DpoPair p;
  const double beta = o.beta;
  const double nc = double(std::max<int64_t>(1, x.n_c)), nr = double(std::max<int64_t>(1, x.n_r));
  double dh = 0;          // dL / dh
  double sc = 1, sr = 1;  // dh / d pi_c and -dh / d pi_r
  switch (o.loss) {
    case DpoLoss::Sigmoid:
    case DpoLoss::Hinge: {
      const double h = (x.pi_c - x.ref_c) - (x.pi_r - x.ref_r);
      if (o.loss == DpoLoss::Sigmoid) {
        p.loss = softplus_neg(beta * h);
        dh = -beta / (1 + std::exp(beta * h));  // -beta sigmoid(-beta h)
      } else {
        const double m = 1 - beta * h;
        p.loss = m > 0 ? m : 0;
        dh = m > 0 ? -beta : 0;
      }
      p.reward_chosen = beta * (x.pi_c - x.ref_c);
      p.reward_rejected = beta * (x.pi_r - x.ref_r);
      break;
    }
    case DpoLoss::Ipo: {
      const double h = (x.pi_c - x.ref_c) / nc - (x.pi_r - x.ref_r) / nr;
      const double d = h - 1 / (2 * beta);
      p.loss = d * d;
      dh = 2 * d;
      sc = 1 / nc, sr = 1 / nr;
      p.reward_chosen = beta * (x.pi_c - x.ref_c);  // TRL logs the sums' rewards for IPO too
      p.reward_rejected = beta * (x.pi_r - x.ref_r);
      break;
    }
    case DpoLoss::Simpo: {
      const double h = x.pi_c / nc - x.pi_r / nr - o.simpo_gamma / beta;
      p.loss = softplus_neg(beta * h);
      dh = -beta * sigmoid(-beta * h);
      sc = 1 / nc, sr = 1 / nr;
      p.reward_chosen = beta * x.pi_c / nc;
      p.reward_rejected = beta * x.pi_r / nr;
      break;
    }
    case DpoLoss::Orpo: {
      // A mean log-prob of exactly 0 (probability 1) has infinite odds; keep it just below.
      const double ac = std::min(x.pi_c / nc, -1e-12), ar = std::min(x.pi_r / nr, -1e-12);
      const double h = (ac - log1mexp(ac)) - (ar - log1mexp(ar));
      p.loss = beta * softplus_neg(h);
      dh = -beta * sigmoid(-h);
      // d/da (a - log(1 - e^a)) = 1 / (1 - e^a), then da / d pi = 1 / n.
      sc = 1 / (-std::expm1(ac)) / nc, sr = 1 / (-std::expm1(ar)) / nr;
      p.reward_chosen = beta * ac;
      p.reward_rejected = beta * ar;
      break;
    }
    case DpoLoss::Kto:
      break;
  }
  p.d_chosen = dh * sc;
  p.d_rejected = -dh * sr;
  return p;
}

KtoTerm kto_term(double pi, double ref, double kl, bool desirable, const DpoOptions& o) {
  KtoTerm t;
  const double r = pi - ref, beta = o.beta;
  const double z = desirable ? beta * (r - kl) : beta * (kl - r);
  const double w = desirable ? o.desirable_weight : o.undesirable_weight;
  const double s = sigmoid(z);
  t.loss = w * (1 - s);
  // d(1 - sigmoid(z)) / dz = -s (1 - s); dz / dpi = +beta (desirable) or -beta.
  t.d_pi = -w * s * (1 - s) * (desirable ? beta : -beta);
  t.reward = beta * r;
  return t;
}

}  // namespace loom
