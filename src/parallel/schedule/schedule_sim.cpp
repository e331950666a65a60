#include "parallel/schedule/schedule_sim.h"

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "core/error.h"

namespace loom::pp {

std::string describe_action(int rank, int index, const Action& a) {
  std::string s = cat("rank ", rank, " action ", index, " (", op_name(a.op), " mb ", a.microbatch,
                      " chunk ", a.chunk);
  if (a.op == Op::SendAct || a.op == Op::SendGrad) s += cat(" to ", a.peer);
  if (a.op == Op::RecvAct || a.op == Op::RecvGrad) s += cat(" from ", a.peer);
  s += ")";
  return s;
}

int SimResult::max_in_flight() const {
  return peak_in_flight.empty() ? 0
                                : *std::max_element(peak_in_flight.begin(), peak_in_flight.end());
}

namespace {

struct Message {
  int microbatch;
  int stage;  // the consuming stage
  double time;
};

// Thrown inside the simulation for an invalid schedule; turned into Status::Invalid.
struct Invalid {
  std::string message;
};

class Simulator {
 public:
  Simulator(const Schedule& s, const CostModel& cost, SendMode mode)
      : s_(s), cost_(cost), mode_(mode), S_(s.num_stages()) {
    const size_t cells = static_cast<size_t>(s.m) * S_;
    f_done_.assign(cells, 0);
    b_done_.assign(cells, 0);
    act_in_.assign(cells, 0);
    grad_in_.assign(cells, 0);
    pc_.assign(s.p, 0);
    time_.assign(s.p, 0.0);
    in_flight_.assign(s.p, 0);
    r_.busy.assign(s.p, 0.0);
    r_.peak_in_flight.assign(s.p, 0);
    r_.start.resize(s.p);
    for (int r = 0; r < s.p; ++r) r_.start[r].assign(s.ranks[r].size(), 0.0);
  }

  SimResult run() {
    try {
      LOOM_CHECK(static_cast<int>(s_.ranks.size()) == s_.p, "schedule has ", s_.ranks.size(),
                 " rank lists for p=", s_.p);
      for (bool progress = true; progress;) {
        progress = false;
        for (int r = 0; r < s_.p; ++r)
          while (!finished(r) && step(r)) progress = true;
      }
      if (!all_finished()) return deadlock();
      finish();
    } catch (const Invalid& e) {
      r_.status = SimResult::Status::Invalid;
      r_.message = e.message;
    } catch (const Error& e) {
      r_.status = SimResult::Status::Invalid;
      r_.message = e.what();
    }
    return r_;
  }

 private:
  size_t cell(int mb, int stage) const { return static_cast<size_t>(mb) * S_ + stage; }
  bool finished(int r) const { return pc_[r] >= s_.ranks[r].size(); }
  bool all_finished() const {
    for (int r = 0; r < s_.p; ++r)
      if (!finished(r)) return false;
    return true;
  }
  const Action& current(int r) const { return s_.ranks[r][pc_[r]]; }
  std::string here(int r) const { return describe_action(r, static_cast<int>(pc_[r]), current(r)); }

  [[noreturn]] void invalid(int r, const std::string& why) const {
    throw Invalid{cat("invalid schedule: ", here(r), ": ", why)};
  }

  void complete(int r, double start, double duration) {
    r_.start[r][pc_[r]] = start;
    time_[r] = start + duration;
    ++pc_[r];
  }

  // Checks a send/receive's peer and stage range; returns the stage on the other side.
  int peer_stage(int r, const Action& a) const {
    const int s = s_.stage_of(r, a.chunk);
    const bool to_next = a.op == Op::SendAct || a.op == Op::RecvGrad;
    const int other = to_next ? s + 1 : s - 1;
    if (a.microbatch < 0 || a.microbatch >= s_.m || a.chunk < 0 || a.chunk >= s_.v)
      invalid(r, "micro-batch or chunk out of range");
    if (other < 0 || other >= S_) invalid(r, cat("stage ", s, " has no neighbour there"));
    if (s_.rank_of_stage(other) != a.peer || a.peer == r)
      invalid(r, cat("the neighbouring stage ", other, " lives on rank ", s_.rank_of_stage(other),
                     ", not on peer ", a.peer));
    return other;
  }

  // One action of rank r; false when it blocks.
  bool step(int r) {
    const Action& a = current(r);
    switch (a.op) {
      case Op::Forward:
      case Op::Backward:
        compute(r, a);
        return true;
      case Op::SendAct:
      case Op::SendGrad:
        return send(r, a);
      case Op::RecvAct:
      case Op::RecvGrad:
        return recv(r, a);
    }
    return false;
  }

  void compute(int r, const Action& a) {
    if (a.microbatch < 0 || a.microbatch >= s_.m || a.chunk < 0 || a.chunk >= s_.v)
      invalid(r, "micro-batch or chunk out of range");
    const int s = s_.stage_of(r, a.chunk);
    const size_t c = cell(a.microbatch, s);
    const bool local_prev = s > 0 && s_.rank_of_stage(s - 1) == r;
    const bool local_next = s + 1 < S_ && s_.rank_of_stage(s + 1) == r;
    double duration;
    if (a.op == Op::Forward) {
      if (f_done_[c]) invalid(r, "this forward already ran");
      const bool have_input =
          s == 0 || (local_prev ? f_done_[cell(a.microbatch, s - 1)] != 0 : act_in_[c] != 0);
      if (!have_input) invalid(r, "its input activation has not arrived");
      f_done_[c] = 1;
      duration = cost_.forward / s_.v;
      r_.peak_in_flight[r] = std::max(r_.peak_in_flight[r], ++in_flight_[r]);
    } else {
      if (b_done_[c]) invalid(r, "this backward already ran");
      if (!f_done_[c]) invalid(r, "its forward has not run");
      const bool have_grad =
          s == S_ - 1 || (local_next ? b_done_[cell(a.microbatch, s + 1)] != 0 : grad_in_[c] != 0);
      if (!have_grad) invalid(r, "its output gradient has not arrived");
      b_done_[c] = 1;
      duration = cost_.backward / s_.v;
      --in_flight_[r];
    }
    r_.busy[r] += duration;
    complete(r, time_[r], duration);
  }

  bool send(int r, const Action& a) {
    const int other = peer_stage(r, a);
    const int s = s_.stage_of(r, a.chunk);
    const bool grad = a.op == Op::SendGrad;
    if (!(grad ? b_done_ : f_done_)[cell(a.microbatch, s)])
      invalid(r, cat("sends the ", grad ? "gradient" : "activation", " before computing it"));
    if (mode_ == SendMode::Eager) {
      channels_[{r, a.peer, grad}].push_back(Message{a.microbatch, other, time_[r] + cost_.comm});
      complete(r, time_[r], 0.0);
      return true;
    }
    return rendezvous(r, a.peer);
  }

  bool recv(int r, const Action& a) {
    const int other = peer_stage(r, a);
    (void)other;
    if (mode_ == SendMode::Rendezvous) return rendezvous(a.peer, r);
    const bool grad = a.op == Op::RecvGrad;
    auto it = channels_.find({a.peer, r, grad});
    if (it == channels_.end() || it->second.empty()) return false;
    const Message msg = it->second.front();
    accept(r, a, msg);
    it->second.pop_front();
    complete(r, std::max(time_[r], msg.time), 0.0);
    return true;
  }

  // Marks the received data present after checking it is the message this receive expects.
  void accept(int r, const Action& a, const Message& msg) {
    const int s = s_.stage_of(r, a.chunk);
    if (msg.microbatch != a.microbatch || msg.stage != s)
      invalid(r, cat("the next message from rank ", a.peer, " is for micro-batch ", msg.microbatch,
                     " stage ", msg.stage, ", not micro-batch ", a.microbatch, " stage ", s));
    auto& have = a.op == Op::RecvGrad ? grad_in_ : act_in_;
    if (have[cell(a.microbatch, s)]) invalid(r, "received twice");
    have[cell(a.microbatch, s)] = 1;
  }

  // Rendezvous between sender `from` and receiver `to`: completes both when both stand at the
  // matching pair, at the later of their two times (plus the latency).
  bool rendezvous(int from, int to) {
    if (finished(from) || finished(to)) return false;
    const Action& sa = current(from);
    const Action& ra = current(to);
    const bool pair = (sa.op == Op::SendAct && ra.op == Op::RecvAct) ||
                      (sa.op == Op::SendGrad && ra.op == Op::RecvGrad);
    if (!pair || sa.peer != to || ra.peer != from) return false;
    const int other = peer_stage(from, sa);
    accept(to, ra, Message{sa.microbatch, other, 0.0});
    const double t = std::max(time_[from], time_[to]) + cost_.comm;
    complete(from, t - cost_.comm, cost_.comm);
    time_[from] = t;
    complete(to, t - cost_.comm, cost_.comm);
    time_[to] = t;
    return true;
  }

  SimResult deadlock() {
    r_.status = SimResult::Status::Deadlock;
    std::string msg = "deadlock: every unfinished rank is blocked:";
    for (int r = 0; r < s_.p; ++r) {
      if (finished(r)) continue;
      r_.stuck.push_back(SimResult::Stuck{r, static_cast<int>(pc_[r]), current(r)});
      msg += cat(" ", here(r), ";");
    }
    msg.pop_back();
    r_.message = msg;
    return r_;
  }

  void finish() {
    for (const auto& [key, queue] : channels_)
      if (!queue.empty())
        throw Invalid{cat("invalid schedule: ", queue.size(), " message(s) from rank ",
                          std::get<0>(key), " to rank ", std::get<1>(key),
                          " never received (first: micro-batch ", queue.front().microbatch,
                          " stage ", queue.front().stage, ")")};
    for (int mb = 0; mb < s_.m; ++mb)
      for (int s = 0; s < S_; ++s)
        if (!f_done_[cell(mb, s)] || !b_done_[cell(mb, s)])
          throw Invalid{cat("invalid schedule: the ", f_done_[cell(mb, s)] ? "backward" : "forward",
                            " of micro-batch ", mb, " on stage ", s, " never runs")};
    r_.makespan = *std::max_element(time_.begin(), time_.end());
    r_.ideal = s_.m * (cost_.forward + cost_.backward);
    r_.bubble = (r_.makespan - r_.ideal) / r_.ideal;
  }

  const Schedule& s_;
  const CostModel cost_;
  const SendMode mode_;
  const int S_;
  std::vector<char> f_done_, b_done_, act_in_, grad_in_;
  std::vector<size_t> pc_;
  std::vector<double> time_;
  std::vector<int> in_flight_;
  std::map<std::tuple<int, int, bool>, std::deque<Message>> channels_;
  SimResult r_;
};

}  // namespace

SimResult simulate(const Schedule& schedule, const CostModel& cost, SendMode mode) {
  LOOM_CHECK(cost.forward > 0 && cost.backward > 0 && cost.comm >= 0,
             "cost model needs positive compute costs and a non-negative comm cost (forward=",
             cost.forward, ", backward=", cost.backward, ", comm=", cost.comm, ")");
  return Simulator(schedule, cost, mode).run();
}

}  // namespace loom::pp
