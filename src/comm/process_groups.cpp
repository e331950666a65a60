#include "comm/process_groups.h"

#include <algorithm>
#include <sstream>

#include "core/config.h"
#include "core/config_int32.h"
#include "core/error.h"

namespace loom::comm {

ParallelDims ParallelDims::from(const Config& cfg) {
  ParallelDims d;
  d.tp = get_int32(cfg, "parallel.tp", d.tp);
  d.cp = get_int32(cfg, "parallel.cp", d.cp);
  d.ep = get_int32(cfg, "parallel.ep", d.ep);
  d.dp = get_int32(cfg, "parallel.dp", d.dp);
  d.pp = get_int32(cfg, "parallel.pp", d.pp);
  return d;
}

RankGenerator::RankGenerator(int world, ParallelDims d) : dims_(d), world_(world) {
  LOOM_CHECK(world > 0, "world size must be positive, got ", world);
  LOOM_CHECK(d.tp > 0, "parallel.tp must be positive, got ", d.tp);
  LOOM_CHECK(d.cp > 0, "parallel.cp must be positive, got ", d.cp);
  LOOM_CHECK(d.pp > 0, "parallel.pp must be positive, got ", d.pp);
  LOOM_CHECK(d.ep > 0, "parallel.ep must be positive, got ", d.ep);
  LOOM_CHECK(d.dp >= 0, "parallel.dp must be >= 0 (0: derived from the world size), got ", d.dp);
  int model = d.tp * d.cp * d.pp;
  if (d.dp == 0) {
    LOOM_CHECK(world % model == 0, "the world size ", world,
               " is not divisible by tp*cp*pp = ", d.tp, "*", d.cp, "*", d.pp, " = ", model);
    dims_.dp = world / model;
  }
  LOOM_CHECK(world == model * dims_.dp, "the world size ", world,
             " does not equal tp*cp*dp*pp = ", d.tp, "*", d.cp, "*", dims_.dp, "*", d.pp, " = ",
             model * dims_.dp);
  LOOM_CHECK(dims_.dp % d.ep == 0, "parallel.ep (", d.ep, ") must divide the data-parallel size (",
             dims_.dp, ")");
}

RankCoords RankGenerator::coords(int rank) const {
  LOOM_CHECK(rank >= 0 && rank < world_, "rank ", rank, " outside a world of ", world_);
  RankCoords c;
  int r = rank;
  c.tp = r % dims_.tp;
  r /= dims_.tp;
  c.cp = r % dims_.cp;
  r /= dims_.cp;
  c.dp = r % dims_.dp;  // = ep + EP * edp
  c.ep = c.dp % dims_.ep;
  r /= dims_.dp;
  c.pp = r;
  return c;
}

int RankGenerator::rank_of(const RankCoords& c) const {
  return c.tp + dims_.tp * (c.cp + dims_.cp * (c.dp + dims_.dp * c.pp));
}

namespace {
// The five-dimensional view: [tp, cp, ep, edp, pp], fastest first.
struct Dims5 {
  int size[5];
  int coord[5];
};
}  // namespace

std::vector<std::vector<int>> RankGenerator::groups(const std::string& kind) const {
  static const char* names[5] = {"tp", "cp", "ep", "edp", "pp"};
  bool vary[5] = {false, false, false, false, false};
  std::stringstream ss(kind);
  std::string part;
  while (std::getline(ss, part, '-')) {
    if (part == "dp") {  // data parallel = expert parallel x expert-data parallel
      vary[2] = vary[3] = true;
      continue;
    }
    auto it = std::find(std::begin(names), std::end(names), part);
    LOOM_CHECK(it != std::end(names), "unknown process group kind '", kind,
               "' (dimensions: tp, cp, ep, edp, dp, pp)");
    vary[it - std::begin(names)] = true;
  }
  int size[5] = {dims_.tp, dims_.cp, dims_.ep, dims_.dp / dims_.ep, dims_.pp};
  // Group index: the fixed coordinates in mixed radix; position: the varying ones.
  std::vector<std::vector<int>> out;
  int group_size = 1;
  for (int i = 0; i < 5; ++i)
    if (vary[i]) group_size *= size[i];
  out.assign(world_ / group_size, std::vector<int>(group_size));
  for (int r = 0; r < world_; ++r) {
    int c[5], x = r;
    for (int i = 0; i < 5; ++i) {
      c[i] = x % size[i];
      x /= size[i];
    }
    int g = 0, pos = 0, gm = 1, pm = 1;
    for (int i = 0; i < 5; ++i) {
      if (vary[i]) {
        pos += c[i] * pm;
        pm *= size[i];
      } else {
        g += c[i] * gm;
        gm *= size[i];
      }
    }
    out[g][pos] = r;
  }
  return out;
}

std::vector<int> RankGenerator::group_of(const std::string& kind, int rank, int* index) const {
  auto all = groups(kind);
  for (size_t g = 0; g < all.size(); ++g)
    if (std::find(all[g].begin(), all[g].end(), rank) != all[g].end()) {
      if (index) *index = static_cast<int>(g);
      return all[g];
    }
  fail("rank ", rank, " is in no '", kind, "' group");
}

ProcessGroups::ProcessGroups(Communicator& world, ParallelDims dims)
    : world_(world), gen_(world.size(), dims), coords_(gen_.coords(world.rank())) {
  auto make = [&](const std::string& kind) {
    int index = 0;
    auto members = gen_.group_of(kind, world_.rank(), &index);
    int pos = static_cast<int>(std::find(members.begin(), members.end(), world_.rank()) -
                               members.begin());
    return world_.split(index, pos, kind);
  };
  tp_ = make("tp");
  cp_ = make("cp");
  dp_ = make("dp");
  pp_ = make("pp");
  ep_ = make("ep");
  edp_ = make("edp");
  tp_dp_ = make("tp-dp");
  dp_cp_ = make("dp-cp");
  tp_dp_cp_ = make("tp-dp-cp");
}

std::string ProcessGroups::describe() const {
  const auto& d = gen_.dims();
  return cat("world ", gen_.world(), " = tp ", d.tp, " x cp ", d.cp, " x dp ", d.dp, " x pp ", d.pp,
             " (ep ", d.ep, "); rank ", world_.rank(), " at tp ", coords_.tp, ", cp ", coords_.cp,
             ", dp ", coords_.dp, ", pp ", coords_.pp);
}

}  // namespace loom::comm
