#include "parallel/schedule/pipeline_schedule.h"

#include <algorithm>
#include <cstdint>
#include <tuple>

#include "core/error.h"

namespace loom::pp {

const char* schedule_kind_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return "gpipe";
    case ScheduleKind::OneFOneB:
      return "1f1b";
    case ScheduleKind::Interleaved:
      return "interleaved";
  }
  return "?";
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::GPipe;
  if (name == "1f1b") return ScheduleKind::OneFOneB;
  if (name == "interleaved") return ScheduleKind::Interleaved;
  fail("unknown pipeline schedule '", name, "': use gpipe, 1f1b or interleaved");
}

const char* op_name(Op op) {
  switch (op) {
    case Op::Forward:
      return "Forward";
    case Op::Backward:
      return "Backward";
    case Op::SendAct:
      return "SendAct";
    case Op::RecvAct:
      return "RecvAct";
    case Op::SendGrad:
      return "SendGrad";
    case Op::RecvGrad:
      return "RecvGrad";
  }
  return "?";
}

namespace {

void check_sizes(int p, int m, int v) {
  LOOM_CHECK(p >= 1, "pipeline size p=", p, " must be at least 1");
  LOOM_CHECK(m >= 1, "micro-batch count m=", m, " must be at least 1");
  LOOM_CHECK(v >= 1, "virtual stages per rank v=", v, " must be at least 1");
}

Schedule empty_schedule(ScheduleKind kind, int p, int m, int v) {
  Schedule s;
  s.kind = kind;
  s.p = p;
  s.m = m;
  s.v = v;
  s.ranks.resize(p);
  return s;
}

Action fwd(int mb, int chunk) {
  return Action{Op::Forward, mb, chunk};
}
Action bwd(int mb, int chunk) {
  return Action{Op::Backward, mb, chunk};
}

}  // namespace

Schedule make_gpipe(int p, int m) {
  check_sizes(p, m, 1);
  Schedule s = empty_schedule(ScheduleKind::GPipe, p, m, 1);
  for (int r = 0; r < p; ++r) {
    for (int i = 0; i < m; ++i) s.ranks[r].push_back(fwd(i, 0));
    for (int i = 0; i < m; ++i) s.ranks[r].push_back(bwd(i, 0));
  }
  add_communication(s);
  return s;
}

Schedule make_1f1b(int p, int m) {
  check_sizes(p, m, 1);
  Schedule s = empty_schedule(ScheduleKind::OneFOneB, p, m, 1);
  for (int r = 0; r < p; ++r) {
    const int warmup = std::min(p - 1 - r, m);
    auto& list = s.ranks[r];
    for (int i = 0; i < warmup; ++i) list.push_back(fwd(i, 0));
    for (int i = 0; i < m - warmup; ++i) {
      list.push_back(fwd(warmup + i, 0));
      list.push_back(bwd(i, 0));
    }
    for (int i = m - warmup; i < m; ++i) list.push_back(bwd(i, 0));
  }
  add_communication(s);
  return s;
}

Schedule make_interleaved(int p, int m, int v) {
  check_sizes(p, m, v);
  LOOM_CHECK(m % p == 0, "the interleaved pipeline schedule needs the micro-batch count to be a ",
             "multiple of the pipeline size: m=", m, " is not divisible by p=", p,
             "; use m=", (m / p) * p > 0 ? cat((m / p) * p, " or ") : std::string(),
             (m / p + 1) * p, ", or the 1f1b schedule");
  if (v == 1) {
    Schedule s = make_1f1b(p, m);
    s.kind = ScheduleKind::Interleaved;
    return s;
  }
  Schedule s = empty_schedule(ScheduleKind::Interleaved, p, m, v);
  const int total = m * v;  // virtual micro-batches: (micro-batch, chunk) pairs
  const int group = p * v;
  // Virtual micro-batch k: chunks advance every p micro-batches, so each rank feeds p
  // micro-batches through a chunk before moving to the next (backwards walk the chunks in
  // reverse: the last chunk's backward comes first).
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % group) / p;
    return forward ? c : v - 1 - c;
  };
  auto microbatch_of = [&](int k) { return (k / group) * p + k % p; };
  for (int r = 0; r < p; ++r) {
    int warmup = total;  // m == p: all forwards first (Megatron does the same)
    if (m != p) warmup = std::min(2 * (p - 1 - r) + (v - 1) * p, total);
    auto& list = s.ranks[r];
    for (int k = 0; k < warmup; ++k) list.push_back(fwd(microbatch_of(k), chunk_of(k, true)));
    for (int k = 0; k < total - warmup; ++k) {
      const int kf = k + warmup;
      list.push_back(fwd(microbatch_of(kf), chunk_of(kf, true)));
      list.push_back(bwd(microbatch_of(k), chunk_of(k, false)));
    }
    for (int k = total - warmup; k < total; ++k)
      list.push_back(bwd(microbatch_of(k), chunk_of(k, false)));
  }
  add_communication(s);
  return s;
}

Schedule make_schedule(ScheduleKind kind, int p, int m, int v) {
  if (kind != ScheduleKind::Interleaved)
    LOOM_CHECK(v == 1, "virtual stages (v=", v, ") need the interleaved schedule, not ",
               schedule_kind_name(kind));
  switch (kind) {
    case ScheduleKind::GPipe:
      return make_gpipe(p, m);
    case ScheduleKind::OneFOneB:
      return make_1f1b(p, m);
    case ScheduleKind::Interleaved:
      return make_interleaved(p, m, v);
  }
  fail("unknown schedule kind");
}

namespace {

// One event of the global timeline used to order communication.
struct Event {
  int64_t time;
  int kind;  // 0 = message (before computes starting at the same time), 1 = compute
  int rank;  // compute: its rank; message: the sender
  int peer;  // message: the receiver
  int is_grad;
  int microbatch;
  int stage;  // message: the consuming stage; compute: its stage
  Action action;
  auto key() const { return std::tie(time, kind, rank, peer, is_grad, microbatch, stage); }
};

}  // namespace

void add_communication(Schedule& sch) {
  const int p = sch.p, m = sch.m, S = sch.num_stages();
  LOOM_CHECK(static_cast<int>(sch.ranks.size()) == p, "schedule has ", sch.ranks.size(),
             " rank lists for p=", p);
  // Keep only the compute actions, and check each (micro-batch, stage) runs forward and
  // backward exactly once, on its own rank.
  std::vector<std::vector<Action>> compute(p);
  std::vector<int> seen(static_cast<size_t>(2) * m * S, 0);
  auto idx = [&](int mb, int stage) { return static_cast<size_t>(mb) * S + stage; };
  for (int r = 0; r < p; ++r)
    for (const Action& a : sch.ranks[r]) {
      if (!a.is_compute()) continue;
      LOOM_CHECK(a.microbatch >= 0 && a.microbatch < m && a.chunk >= 0 && a.chunk < sch.v, "rank ",
                 r, ": ", op_name(a.op), " of micro-batch ", a.microbatch, " chunk ", a.chunk,
                 " is out of range (m=", m, ", v=", sch.v, ")");
      int& count =
          seen[idx(a.microbatch, sch.stage_of(r, a.chunk)) * 2 + (a.op == Op::Backward ? 1 : 0)];
      LOOM_CHECK(++count == 1, "rank ", r, " runs ", op_name(a.op), " of micro-batch ",
                 a.microbatch, " chunk ", a.chunk, " twice");
      compute[r].push_back(a);
    }
  for (size_t i = 0; i < seen.size(); ++i)
    LOOM_CHECK(seen[i] == 1, "no rank runs ", i % 2 ? "backward" : "forward", " of micro-batch ",
               i / 2 / S, " stage ", i / 2 % S);

  // Unit-cost timeline (forward 1, backward 2 per chunk): a rank starts its next compute when
  // it is free and the compute's input exists. Times do not depend on the visiting order.
  constexpr int64_t kUnset = -1;
  std::vector<int64_t> f_end(static_cast<size_t>(m) * S, kUnset), b_end(f_end);
  std::vector<size_t> pc(p, 0);
  std::vector<int64_t> free_at(p, 0);
  std::vector<Event> events;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      while (pc[r] < compute[r].size()) {
        const Action& a = compute[r][pc[r]];
        const int s = sch.stage_of(r, a.chunk);
        int64_t ready;
        if (a.op == Op::Forward) {
          ready = s == 0 ? 0 : f_end[idx(a.microbatch, s - 1)];
        } else {
          const int64_t own = f_end[idx(a.microbatch, s)];
          ready = s == S - 1 ? own : b_end[idx(a.microbatch, s + 1)];
          if (own == kUnset) ready = kUnset;
        }
        if (ready == kUnset) break;
        const int64_t start = std::max(free_at[r], ready);
        free_at[r] = start + (a.op == Op::Forward ? 1 : 2);
        (a.op == Op::Forward ? f_end : b_end)[idx(a.microbatch, s)] = free_at[r];
        events.push_back(Event{start, 1, r, -1, 0, a.microbatch, s, a});
        ++pc[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < p; ++r)
    if (pc[r] < compute[r].size()) {
      const Action& a = compute[r][pc[r]];
      fail("pipeline schedule cannot complete: rank ", r, " waits forever at ", op_name(a.op),
           " of micro-batch ", a.microbatch, " chunk ", a.chunk,
           " (its input is produced after it in some rank's order)");
    }

  // Cross-rank messages, stamped with the time their producer finishes.
  for (int mb = 0; mb < m; ++mb)
    for (int s = 0; s < S; ++s) {
      if (s + 1 < S && sch.rank_of_stage(s) != sch.rank_of_stage(s + 1))
        events.push_back(Event{f_end[idx(mb, s)],
                               0,
                               sch.rank_of_stage(s),
                               sch.rank_of_stage(s + 1),
                               0,
                               mb,
                               s + 1,
                               {}});
      if (s > 0 && sch.rank_of_stage(s) != sch.rank_of_stage(s - 1))
        events.push_back(Event{b_end[idx(mb, s)],
                               0,
                               sch.rank_of_stage(s),
                               sch.rank_of_stage(s - 1),
                               1,
                               mb,
                               s - 1,
                               {}});
    }
  std::sort(events.begin(), events.end(),
            [](const Event& a, const Event& b) { return a.key() < b.key(); });

  // Project the global order onto each rank.
  for (auto& list : sch.ranks) list.clear();
  for (const Event& e : events) {
    if (e.kind == 1) {
      sch.ranks[e.rank].push_back(e.action);
      continue;
    }
    const int producer = e.is_grad ? e.stage + 1 : e.stage - 1;
    sch.ranks[e.rank].push_back(Action{e.is_grad ? Op::SendGrad : Op::SendAct, e.microbatch,
                                       sch.chunk_of_stage(producer), e.peer});
    sch.ranks[e.peer].push_back(Action{e.is_grad ? Op::RecvGrad : Op::RecvAct, e.microbatch,
                                       sch.chunk_of_stage(e.stage), e.rank});
  }
}

}  // namespace loom::pp
