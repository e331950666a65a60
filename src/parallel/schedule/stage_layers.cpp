#include "parallel/schedule/stage_layers.h"

#include "core/error.h"

namespace loom::pp {

int StageLayout::stage_of_layer(int layer) const {
  for (size_t s = 0; s < stages.size(); ++s)
    if (layer >= stages[s].begin && layer < stages[s].end) return static_cast<int>(s);
  fail("layer ", layer, " is outside the model's ", n_layers, " layers");
}

namespace {

// "20 or 25": the nearest multiples of d around n (only the upper one when the lower is 0).
std::string nearest_multiples(int n, int d) {
  const int lo = n / d * d, hi = lo + d;
  return lo > 0 ? cat(lo, " or ", hi) : cat(hi);
}

}  // namespace

StageLayout assign_layers(int n_layers, int p, int v, int first, int last) {
  LOOM_CHECK(p >= 1 && v >= 1, "pipeline size p=", p, " and virtual stages v=", v,
             " must be at least 1");
  LOOM_CHECK(n_layers >= 1, "the model needs at least one layer (n_layers=", n_layers, ")");
  const int S = p * v;
  StageLayout out;
  out.p = p;
  out.v = v;
  out.n_layers = n_layers;
  const std::string stages = cat(S, " stages (p=", p, " x v=", v, ")");
  if (S == 1) {
    LOOM_CHECK((first < 0 || first == n_layers) && (last < 0 || last == n_layers),
               "with one pipeline stage the first/last stage sizes (", first, ", ", last,
               ") must be unset or equal the layer count ", n_layers);
    out.stages.push_back(LayerRange{0, n_layers});
    return out;
  }
  if (first < 0 && last < 0) {
    LOOM_CHECK(n_layers % S == 0, n_layers, " layers do not split evenly into ", stages,
               "; use a layer count divisible by ", S, " (", nearest_multiples(n_layers, S),
               ") or set the first/last stage sizes");
    for (int s = 0; s < S; ++s)
      out.stages.push_back(LayerRange{s * (n_layers / S), (s + 1) * (n_layers / S)});
    return out;
  }
  // One of first/last set: the other takes the even share of what the set one leaves.
  const int middle_stages = S - 2;
  const int set_sum = (first >= 0 ? first : 0) + (last >= 0 ? last : 0);
  const int unset = (first < 0) + (last < 0);
  const int rest = n_layers - set_sum;
  const int share_stages = middle_stages + unset;
  LOOM_CHECK(first != 0 && last != 0, "a pipeline stage needs at least one layer (first=", first,
             ", last=", last, ")");
  LOOM_CHECK(rest >= share_stages && (share_stages == 0 ? rest == 0 : rest % share_stages == 0),
             "with first stage ", first < 0 ? std::string("unset") : cat(first, " layers"),
             " and last stage ", last < 0 ? std::string("unset") : cat(last, " layers"),
             ", the other ", n_layers - set_sum, " of ", n_layers,
             " layers do not split evenly into the remaining ", share_stages, " of ", stages,
             share_stages > 0 ? cat("; they need a multiple of ", share_stages, " layers")
                              : std::string("; first + last must equal the layer count"));
  const int each = share_stages > 0 ? rest / share_stages : 0;
  int begin = 0;
  for (int s = 0; s < S; ++s) {
    int n = each;
    if (s == 0 && first >= 0) n = first;
    if (s == S - 1 && last >= 0) n = last;
    out.stages.push_back(LayerRange{begin, begin + n});
    begin += n;
  }
  return out;
}

}  // namespace loom::pp
