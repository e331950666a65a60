// The human-readable form of a schedule: a timeline table from a unit-cost simulation.
#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "parallel/schedule/pipeline_schedule.h"
#include "parallel/schedule/schedule_sim.h"

namespace loom::pp {

namespace {

std::string label(const Schedule& s, const Action& a) {
  std::string l = cat(a.op == Op::Forward ? "F" : "B", a.microbatch);
  if (s.v > 1) l += cat(".", a.chunk);
  return l;
}

}  // namespace

std::string format_schedule(const Schedule& s, bool show_comm) {
  std::string out = cat(schedule_kind_name(s.kind), " schedule: p=", s.p, " m=", s.m, " v=", s.v,
                        " (one column per tick; a chunk's forward takes 1 tick, its backward 2)\n");
  // Per-chunk costs 1 and 2 ticks: stage costs v and 2v.
  const SimResult sim = simulate(s, CostModel{1.0 * s.v, 2.0 * s.v, 0.0});
  if (!sim.completed()) {
    out += cat("(the schedule does not complete: ", sim.message, ")\n");
  } else {
    const int ticks = static_cast<int>(std::lround(sim.makespan));
    std::vector<std::vector<std::string>> grid(s.p, std::vector<std::string>(ticks, "."));
    size_t width = 1;
    for (int r = 0; r < s.p; ++r)
      for (size_t i = 0; i < s.ranks[r].size(); ++i) {
        const Action& a = s.ranks[r][i];
        if (!a.is_compute()) continue;
        const int t0 = static_cast<int>(std::lround(sim.start[r][i]));
        const int len = a.op == Op::Forward ? 1 : 2;
        for (int t = t0; t < t0 + len && t < ticks; ++t) grid[r][t] = label(s, a);
        width = std::max(width, label(s, a).size());
      }
    for (int r = 0; r < s.p; ++r) {
      std::string row = cat("rank ", r, " |");
      for (const std::string& cell : grid[r])
        row += cat(" ", cell, std::string(width - cell.size(), ' '));
      while (!row.empty() && row.back() == ' ') row.pop_back();
      out += cat(row, "\n");
    }
    out += cat("bubble ", sim.bubble, " of the ideal time; peak in flight per rank:");
    for (int x : sim.peak_in_flight) out += cat(" ", x);
    out += "\n";
  }
  if (show_comm) {
    for (int r = 0; r < s.p; ++r) {
      out += cat("rank ", r, ":");
      for (const Action& a : s.ranks[r]) {
        switch (a.op) {
          case Op::Forward:
          case Op::Backward:
            out += cat(" ", label(s, a));
            break;
          case Op::SendAct:
            out += cat(" sa", a.microbatch, ">", a.peer);
            break;
          case Op::SendGrad:
            out += cat(" sg", a.microbatch, ">", a.peer);
            break;
          case Op::RecvAct:
            out += cat(" ra", a.microbatch, "<", a.peer);
            break;
          case Op::RecvGrad:
            out += cat(" rg", a.microbatch, "<", a.peer);
            break;
        }
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace loom::pp
