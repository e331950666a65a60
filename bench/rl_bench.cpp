// GRPO, synchronous vs asynchronous, on the same task, model, seeds and number of samples: wall
// time to a fixed held-out accuracy (the figure), samples/s, where a step's time goes
// (generation, learning), rollout and learner utilisation, the longest learner wait; repeated in
// alternating rounds (every mode once a round, so that a change of the machine's load hits every
// mode alike) and summarised by the median and the range, each run's ratio taken against the
// baseline of its own round. The reward and accuracy curves go to JSON and a self-contained HTML
// page (inline SVG).
//
// The baseline is the synchronous loop in one process on one thread ("sync-1t"): what one core
// does without any overlap (on a loaded 2-core machine two OpenMP threads of the tiny model spin
// and run ~10x slower, so "sync" on all cores is optional). The fair "same resources" baseline is
// "mpi-0": the synchronous algorithm over a learner process and a rollout process (max staleness
// 0: they take turns), against which "mpi-1" (max staleness 1: they overlap) is the overlap's gain
// with the same processes, messages and kernels. In one process, "async-S" overlaps a rollout
// thread and the learner with max staleness S, one core each; "async-Sh" adds the learner share
// (RlOptions::learner_share, kShare of each step's forward and backward run by the rollout thread
// while it waits for new weights); "async-2p" uses partial rollouts (each completion cut after
// half its tokens and continued on the next weights).
//
// The task is synthetic so that a model from scratch learns it in a bounded number of steps:
// reply with the letter 'a' only (the reward is the share of 'a's; a reply counts as correct when
// all of it is 'a'); held-out accuracy is over sampled replies (temperature 1, as trained) to
// prompts of a seed the training never draws, evaluated after the run on weight snapshots so that
// evaluation never steals time from the runs. Its size (4 layers, width 256, 16-token replies)
// makes a run last tens of seconds, long enough for a speed-up to stand out of the noise of a
// shared machine. The multi-process modes run as child jobs, `mpirun -n 2 bench_rl --mpi-run OUT
// STEPS TARGET STALENESS`, whose learner writes OUT/bench_rl_mpi_STALENESS.json.
//   bench_rl [OUT_DIR] [STEPS] [TARGET_ACCURACY] [MODES] [ROUNDS]
// MODES: comma-separated, default sync-1t,async-1,async-1h,mpi-0,mpi-1 (sync-1t always runs);
// also sync, async-2, async-2h, async-2p, mpi-2. ROUNDS: default 3.
#include <omp.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/bench_util.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/json.h"
#include "core/log.h"
#include "kernels/backend.h"
#include "rl/async_grpo.h"
#include "rl/evaluate.h"
#include "rl/grpo_trainer.h"
#include "rl/mpi_grpo.h"

using namespace loom;
using namespace loom::rl;

namespace {

// The learner share of the "-h" modes: the rollout side idles about a third of a step (it
// generates ~1/3 of the synchronous step, the learner ~2/3), so a third of the forward and
// backward balances the two roles.
constexpr double kShare = 0.3;
constexpr int kEvalEvery = 4;  // steps between weight snapshots (held-out accuracy)

struct LetterA : Environment {
  std::string name() const override { return "letter-a"; }
  Task task(uint64_t seed, uint64_t i) const override {
    return {"say a " + std::to_string((seed * 31 + i) % 97), "", {}};
  }
  double reward(const Task&, const std::string& reply) const override {
    if (reply.empty()) return 0;
    double a = 0;
    for (char ch : reply) a += ch == 'a';
    return a / double(reply.size());
  }
};

ModelConfig bench_config() {
  ModelConfig c = model_preset("tiny-llama");
  c.n_layer = 4, c.d_model = 256, c.n_head = 8, c.n_kv_head = 4, c.head_dim = 32, c.d_ff = 512;
  c.vocab = 260, c.max_seq = 64, c.init_std = 0.02f;
  return c;
}

RlOptions bench_options() {
  RlOptions o;
  o.prompts_per_step = 8;
  o.group_size = 8;
  o.max_tokens = 16;
  o.lr = 3e-4;
  o.seed = 11;
  return o;
}

struct Mode {
  std::string name;
  int64_t staleness = -1;  // -1: synchronous
  int threads = 1;
  bool mpi = false;
  int partial = 0;   // partial rollouts: tokens a batch (async only)
  double share = 0;  // learner share (async only)
};

struct Run {
  std::string name;
  int64_t staleness = -1;
  std::vector<double> wall, reward, accuracy_at;  // per step; accuracy per evaluation
  std::vector<int64_t> eval_steps;
  double seconds = 0, max_wait = 0, rollout_util = 0, learner_util = 0, load_before = 0,
         load_after = 0, time_to_target = -1;
  int64_t samples = 0, spanning = 0;  // spanning: trained completions over several versions
  // Where the time goes, over the steps up to the target: mean seconds a step of generation (the
  // rollout side's busy time), of learning (GrpoLearner::learn) and of the learner share on the
  // rollout side, and of wall time; the step at which the target was reached.
  double rollout_s = 0, learn_s = 0, help_s = 0, ms_per_step = 0;
  int64_t steps_to_target = -1;
};

// mpi: this process is one rank of a 2-rank job (rank 0 learns, rank 1 generates); only rank 0's
// Run is filled.
Run run(const Mode& m, int steps, double target) {
  Run r;
  r.name = m.name;
  r.staleness = m.staleness;
  Decoder model(bench_config(), cpu_backend());
  model.params().init(7);
  auto tok = data::byte_chatml_tokenizer();
  data::ChatTemplate chat("chatml", tok);
  LetterA env;
  RlOptions o = bench_options();
  o.partial_tokens = m.partial;
  o.learner_share = m.share;
  std::vector<std::vector<float>> snaps;
  auto snapshot = [&](int64_t step) {
    const ParamSet& P = model.params();
    snaps.emplace_back(P.data(), P.data() + P.total());
    r.eval_steps.push_back(step);
  };
  snapshot(0);
  r.load_before = load_average();
  const double t0 = now_seconds();
  std::vector<RlStepStats> stats;
  double snap_time = 0;  // excluded: the copies are the benchmark's, not the algorithm's
  auto loop = [&](auto&& step) {
    for (int s = 0; s < steps; ++s) {
      stats.push_back(step());
      r.wall.push_back(now_seconds() - t0 - snap_time);
      const double c0 = now_seconds();
      if ((s + 1) % kEvalEvery == 0) snapshot(s + 1);
      snap_time += now_seconds() - c0;
    }
  };
  if (m.mpi) {
    set_num_threads(m.threads);
    MpiRlOptions mo;
    mo.rollout_ranks = 1;
    mo.max_staleness = m.staleness;
    mo.learner_timeout = 300;
    mo.steps = steps;
    MpiGrpo t(comm::world(), model, tok, chat, env, o, mo);
    if (!t.is_learner()) {
      t.run_rollout();
      return r;
    }
    loop([&] { return t.step(); });
    t.finish();
  } else if (m.staleness < 0) {
    set_num_threads(m.threads);
    GrpoTrainer t(model, tok, chat, env, o);
    loop([&] { return t.step(); });
  } else {
    AsyncOptions ao;
    ao.max_staleness = m.staleness;
    ao.threads_per_role = m.threads;
    ao.learner_timeout = 300;
    AsyncGrpo t(model, tok, chat, env, o, ao);
    loop([&] { return t.step(); });
    t.stop();
  }
  r.seconds = r.wall.back();
  r.load_after = load_average();
  for (const RlStepStats& st : stats) {
    r.reward.push_back(st.reward_mean);
    r.samples += st.groups * o.group_size;
    r.spanning += st.spanning_rollouts;
    r.max_wait = std::max(r.max_wait, st.learner_wait_seconds);
  }
  set_num_threads(1);  // evaluation is not timed; one thread is fastest for the tiny model
  for (size_t k = 0; k < snaps.size(); ++k) {
    std::memcpy(model.params().data(), snaps[k].data(), snaps[k].size() * sizeof(float));
    const double acc = heldout_accuracy(model, tok, chat, env, 128, o.seed, o.max_tokens, 1.0f);
    r.accuracy_at.push_back(acc);
    if (r.time_to_target < 0 && acc >= target) {
      r.time_to_target = r.eval_steps[k] == 0 ? 0 : r.wall[size_t(r.eval_steps[k] - 1)];
      r.steps_to_target = r.eval_steps[k];
    }
  }
  // Where the time goes, over the steps that count: those up to the target (all when it was
  // not reached; the steps after it, with most groups all correct and so nothing to train, would
  // make the learner look cheaper than it is on the way). Busy shares of that wall time (means
  // of per-step shares would weigh short steps alike).
  const size_t k = r.steps_to_target > 0 ? size_t(r.steps_to_target) : stats.size();
  const double wall = r.wall[k - 1];
  for (size_t i = 0; i < k; ++i) {
    const RlStepStats& st = stats[i];
    r.rollout_util += (st.rollout_seconds + st.helper_seconds) / wall;
    r.learner_util += st.learner_seconds / wall;
    r.rollout_s += st.rollout_seconds / double(k);
    r.learn_s += st.learner_seconds / double(k);
    r.help_s += st.helper_seconds / double(k);
  }
  r.ms_per_step = 1e3 * wall / double(k);
  return r;
}

std::string polyline(const std::vector<double>& x, const std::vector<double>& y, double xmax,
                     const char* colour) {
  std::string pts;
  for (size_t i = 0; i < x.size(); ++i)
    pts += cat(40 + 540 * x[i] / xmax, ",", 260 - 220 * y[i], " ");
  return cat("<polyline fill='none' stroke='", colour, "' stroke-width='2' points='", pts, "'/>\n");
}

Json vec_json(const std::vector<double>& v) {
  Json a = Json::array();
  for (double x : v) a.push_back(Json(x));
  return a;
}

std::vector<double> json_vec(const Json& a) {
  std::vector<double> v;
  for (const Json& x : a.as_array()) v.push_back(x.as_double());
  return v;
}

Json run_json(const Run& r) {
  Json j = Json::object();
  j["mode"] = r.name;
  j["max_staleness"] = r.staleness;
  j["wall_seconds"] = r.seconds;
  j["samples"] = r.samples;
  j["samples_per_s"] = double(r.samples) / r.seconds;
  j["seconds_to_target"] = r.time_to_target;
  j["steps_to_target"] = r.steps_to_target;
  j["rollout_utilisation"] = r.rollout_util;
  j["learner_utilisation"] = r.learner_util;
  j["max_learner_wait_seconds"] = r.max_wait;
  j["rollout_seconds_per_step"] = r.rollout_s;
  j["learn_seconds_per_step"] = r.learn_s;
  j["helper_seconds_per_step"] = r.help_s;
  j["ms_per_step_to_target"] = r.ms_per_step;
  j["spanning_rollouts"] = r.spanning;
  j["loadavg_before"] = r.load_before;
  j["loadavg_after"] = r.load_after;
  j["reward"] = vec_json(r.reward);
  j["wall"] = vec_json(r.wall);
  j["heldout_accuracy"] = vec_json(r.accuracy_at);
  std::vector<double> es(r.eval_steps.begin(), r.eval_steps.end());
  j["eval_steps"] = vec_json(es);
  return j;
}

Run run_from_json(const Json& j) {
  Run r;
  r.name = j.at("mode").as_string();
  r.staleness = int64_t(j.at("max_staleness").as_double());
  r.seconds = j.at("wall_seconds").as_double();
  r.samples = int64_t(j.at("samples").as_double());
  r.time_to_target = j.at("seconds_to_target").as_double();
  r.steps_to_target = int64_t(j.at("steps_to_target").as_double());
  r.rollout_util = j.at("rollout_utilisation").as_double();
  r.learner_util = j.at("learner_utilisation").as_double();
  r.max_wait = j.at("max_learner_wait_seconds").as_double();
  r.rollout_s = j.at("rollout_seconds_per_step").as_double();
  r.learn_s = j.at("learn_seconds_per_step").as_double();
  r.help_s = j.at("helper_seconds_per_step").as_double();
  r.ms_per_step = j.at("ms_per_step_to_target").as_double();
  r.load_before = j.at("loadavg_before").as_double();
  r.load_after = j.at("loadavg_after").as_double();
  r.reward = json_vec(j.at("reward"));
  r.wall = json_vec(j.at("wall"));
  r.accuracy_at = json_vec(j.at("heldout_accuracy"));
  for (double e : json_vec(j.at("eval_steps"))) r.eval_steps.push_back(int64_t(e));
  return r;
}

// The child job's side of the multi-process mode: both ranks run, rank 0 writes the Run.
int mpi_child(const std::string& out, int steps, double target, int staleness) {
  comm::Communicator& w = comm::world();
  LOOM_CHECK(w.size() == 2, "bench_rl --mpi-run runs as 2 ranks, not ", w.size());
  Mode m{cat("mpi-", staleness), staleness, 1, true};
  const Run r = run(m, steps, target);
  if (w.rank() != 0) return 0;
  write_file_atomic(cat(out, "/bench_rl_mpi_", staleness, ".json"), run_json(r).dump(2) + "\n");
  return 0;
}

// Runs the multi-process mode as a child job of 2 ranks; false (with a message) if it failed.
bool run_mpi_mode(const std::string& out, int steps, double target, int staleness, Run* r) {
#ifdef LOOM_MPIEXEC
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) return false;
  self[n] = '\0';
  const std::string json = cat(out, "/bench_rl_mpi_", staleness, ".json");
  std::remove(json.c_str());
  const std::string cmd =
      cat("OMP_NUM_THREADS=1 ", LOOM_MPIEXEC, " --oversubscribe --bind-to none ", "-n 2 '", self,
          "' --mpi-run '", out, "' ", steps, " ", target, " ", staleness);
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "the multi-process mode failed: %s\n", cmd.c_str());
    return false;
  }
  *r = run_from_json(Json::parse(read_file(json), json));
  return true;
#else
  (void)out, (void)steps, (void)target, (void)staleness, (void)r;
  std::fprintf(stderr, "built without MPI: no multi-process mode\n");
  return false;
#endif
}

double median(std::vector<double> v) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "median [min-max]" of the values, or "-" when there are none.
std::string spread(const std::vector<double>& v, const char* fmt = "%.2f") {
  if (v.empty()) return "-";
  char a[32], b[32], c[32];
  std::snprintf(a, sizeof a, fmt, median(v));
  std::snprintf(b, sizeof b, fmt, *std::min_element(v.begin(), v.end()));
  std::snprintf(c, sizeof c, fmt, *std::max_element(v.begin(), v.end()));
  return cat(a, " [", b, "-", c, "]");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--mpi-run") {
    LOOM_CHECK(argc == 6, "bench_rl --mpi-run OUT STEPS TARGET STALENESS");
    return mpi_child(argv[2], std::stoi(argv[3]), std::stod(argv[4]), std::stoi(argv[5]));
  }
  const std::string out = argc > 1 ? argv[1] : "bench_rl_out";
  const int steps = argc > 2 ? std::stoi(argv[2]) : 80;
  const double target = argc > 3 ? std::stod(argv[3]) : 0.8;
  const std::string modes = argc > 4 ? argv[4] : "sync-1t,async-1,async-1h,mpi-0,mpi-1";
  const int rounds = argc > 5 ? std::stoi(argv[5]) : 3;
  LOOM_CHECK(steps >= kEvalEvery && steps <= 100000, "bench_rl: STEPS must lie in [", kEvalEvery,
             ", 100000], not ", steps);
  LOOM_CHECK(target > 0 && target <= 1, "bench_rl: TARGET_ACCURACY must lie in (0, 1]");
  LOOM_CHECK(rounds >= 1 && rounds <= 100, "bench_rl: ROUNDS must lie in [1, 100]");
  make_dirs(out);
  const int cores = std::max(1, omp_get_num_procs());
  const std::vector<Mode> known = {{"sync-1t", -1, 1},
                                   {"sync", -1, cores},
                                   {"async-1", 1, 1},
                                   {"async-1h", 1, 1, false, 0, kShare},
                                   {"async-2", 2, 1},
                                   {"async-2h", 2, 1, false, 0, kShare},
                                   {"async-2p", 2, 1, false, bench_options().max_tokens / 2},
                                   {"mpi-0", 0, 1, true},
                                   {"mpi-1", 1, 1, true},
                                   {"mpi-2", 2, 1, true}};
  std::vector<Mode> picked = {known[0]};  // the baseline always runs, first in each round
  for (size_t a = 0; a <= modes.size();) {
    size_t b = modes.find(',', a);
    if (b == std::string::npos) b = modes.size();
    const std::string name = modes.substr(a, b - a);
    a = b + 1;
    if (name.empty() || name == "sync-1t") continue;
    auto it =
        std::find_if(known.begin(), known.end(), [&](const Mode& m) { return m.name == name; });
    LOOM_CHECK(
        it != known.end(), "bench_rl: unknown mode '", name,
        "' (sync-1t, sync, async-1, async-1h, async-2, async-2h, async-2p, mpi-0, mpi-1, mpi-2)");
    picked.push_back(*it);
  }
  std::printf(
      "bench_rl: %d steps, target held-out accuracy %.2f, %d rounds, %d cores, load "
      "average %.2f at the start\n",
      steps, target, rounds, cores, load_average());
  // runs[m][round]
  std::vector<std::vector<Run>> runs(picked.size());
  for (int round = 0; round < rounds; ++round)
    for (size_t m = 0; m < picked.size(); ++m) {
      Run r;
      if (picked[m].mpi) {
        if (!run_mpi_mode(out, steps, target, int(picked[m].staleness), &r)) return 1;
        r.name = picked[m].name;
      } else {
        r = run(picked[m], steps, target);
      }
      std::printf("round %d %-9s %7.2f s to target (step %lld), %6.1f ms/step, load %.2f->%.2f\n",
                  round + 1, r.name.c_str(), r.time_to_target,
                  static_cast<long long>(r.steps_to_target), r.ms_per_step, r.load_before,
                  r.load_after);
      std::fflush(stdout);
      runs[m].push_back(std::move(r));
    }
  // A run's ratio is taken against the baseline of its own round (the load changes between
  // rounds); mpi-1 also against mpi-0 of its round.
  auto ratios = [&](size_t m, const std::string& base_name) {
    std::vector<double> v;
    size_t b = 0;
    while (b < picked.size() && picked[b].name != base_name) ++b;
    if (b == picked.size()) return v;
    for (int k = 0; k < rounds; ++k)
      if (runs[b][k].time_to_target > 0 && runs[m][k].time_to_target > 0)
        v.push_back(runs[b][k].time_to_target / runs[m][k].time_to_target);
    return v;
  };
  std::printf("\n%-9s %-22s %6s %-20s %8s %8s %8s %6s %6s %7s %-13s %-18s\n", "mode", "s to target",
              "steps", "ms/step", "gen ms", "learn ms", "help ms", "roll%", "learn%", "wait s",
              "load", "vs sync-1t");
  Json j = Json::object();
  j["steps"] = steps;
  j["target_accuracy"] = target;
  j["rounds"] = rounds;
  j["cores"] = cores;
  j["learner_share"] = kShare;
  Json modes_json = Json::array();
  for (size_t m = 0; m < picked.size(); ++m) {
    std::vector<double> ttt, ms, gen, learn, help, ru, lu, stp, lb, la;
    double wait = 0;
    for (const Run& r : runs[m]) {
      if (r.time_to_target > 0) ttt.push_back(r.time_to_target);
      if (r.steps_to_target > 0) stp.push_back(double(r.steps_to_target));
      ms.push_back(r.ms_per_step);
      gen.push_back(1e3 * r.rollout_s);
      learn.push_back(1e3 * r.learn_s);
      help.push_back(1e3 * r.help_s);
      ru.push_back(100 * r.rollout_util);
      lu.push_back(100 * r.learner_util);
      lb.push_back(r.load_before);
      la.push_back(r.load_after);
      wait = std::max(wait, r.max_wait);
    }
    const std::vector<double> vs = ratios(m, "sync-1t");
    std::printf("%-9s %-22s %6.0f %-20s %8.1f %8.1f %8.1f %6.0f %6.0f %7.2f %5.1f->%-6.1f %-18s\n",
                picked[m].name.c_str(), spread(ttt).c_str(), median(stp),
                spread(ms, "%.1f").c_str(), median(gen), median(learn), median(help), median(ru),
                median(lu), wait, median(lb), median(la),
                m == 0 ? "1" : spread(vs, "%.2fx").c_str());
    Json x = Json::object();
    x["mode"] = picked[m].name;
    x["median_seconds_to_target"] = median(ttt);
    x["median_ms_per_step"] = median(ms);
    x["ratio_vs_sync_1t"] = vec_json(vs);
    x["median_ratio_vs_sync_1t"] = median(vs);
    Json rj = Json::array();
    for (const Run& r : runs[m]) rj.push_back(run_json(r));
    x["runs"] = rj;
    modes_json.push_back(x);
  }
  j["modes"] = modes_json;
  std::printf("\nbaseline: sync-1t (synchronous, one process, one thread); target: 1.3x sooner\n");
  for (size_t m = 1; m < picked.size(); ++m) {
    const std::vector<double> vs = ratios(m, "sync-1t");
    if (vs.empty()) {
      std::printf("%s or sync-1t never reached accuracy %.2f in %d steps\n", picked[m].name.c_str(),
                  target, steps);
      continue;
    }
    std::printf(
        "%-9s reaches accuracy %.2f %s sooner than sync-1t (median [range] of %zu "
        "rounds): %s\n",
        picked[m].name.c_str(), target, spread(vs, "%.2fx").c_str(), vs.size(),
        median(vs) >= 1.3 && *std::min_element(vs.begin(), vs.end()) >= 1.3
            ? "1.3x met in every round"
        : median(vs) >= 1.3 ? "1.3x met by the median, not in every round"
                            : "1.3x NOT met");
    if (picked[m].name != "mpi-0" && picked[m].name.rfind("mpi-", 0) == 0) {
      const std::vector<double> v0 = ratios(m, "mpi-0");
      if (!v0.empty())
        std::printf("%-9s reaches it %s sooner than mpi-0 (the same 2 processes, synchronous)\n",
                    picked[m].name.c_str(), spread(v0, "%.2fx").c_str());
    }
  }
  write_file_atomic(out + "/bench_rl.json", j.dump(2) + "\n");
  // The curves of each mode's first round against wall time: reward (solid) and held-out
  // accuracy (dots), one colour a mode.
  double xmax = 1e-9;
  for (const auto& rs : runs) xmax = std::max(xmax, rs[0].seconds);
  const char* colours[] = {"#444",    "#999",    "#1f77b4", "#d62728", "#9467bd",
                           "#8c564b", "#2ca02c", "#ff7f0e", "#17becf"};
  std::string svg =
      "<svg xmlns='http://www.w3.org/2000/svg' width='600' height='300'>\n"
      "<rect width='600' height='300' fill='white'/>\n"
      "<line x1='40' y1='260' x2='580' y2='260' stroke='black'/>\n"
      "<line x1='40' y1='40' x2='40' y2='260' stroke='black'/>\n";
  svg += cat("<text x='300' y='290' font-size='12'>wall seconds (0 .. ", xmax, ")</text>\n");
  svg += "<text x='2' y='40' font-size='12'>1</text><text x='2' y='260' font-size='12'>0</text>\n";
  for (size_t k = 0; k < runs.size(); ++k) {
    const Run& r = runs[k][0];
    const char* colour = colours[k % (sizeof colours / sizeof colours[0])];
    svg += polyline(r.wall, r.reward, xmax, colour);
    for (size_t e = 0; e < r.eval_steps.size(); ++e) {
      const double x = r.eval_steps[e] == 0 ? 0 : r.wall[size_t(r.eval_steps[e] - 1)];
      svg += cat("<circle r='3' fill='", colour, "' cx='", 40 + 540 * x / xmax, "' cy='",
                 260 - 220 * r.accuracy_at[e], "'/>\n");
    }
    svg += cat("<text x='460' y='", 60 + 16 * k, "' font-size='12' fill='", colour, "'>", r.name,
               "</text>\n");
  }
  svg += "</svg>\n";
  write_file_atomic(out + "/bench_rl.html",
                    "<!doctype html><html><head><meta charset='utf-8'><title>loom GRPO: sync vs "
                    "async</title></head><body><h1>GRPO reward (lines) and held-out accuracy "
                    "(dots) against wall time (first round)</h1>\n" +
                        svg + "</body></html>\n");
  std::printf("wrote %s/bench_rl.json and %s/bench_rl.html\n", out.c_str(), out.c_str());
  return 0;
}
