// GRPO, synchronous vs asynchronous (max staleness 1 and 2, and 2 with partial rollouts:
// "async-2p", completions cut after 4 of their 8 tokens and continued on the next weights), on the
// same task, model, seeds and number of samples: wall time to a fixed held-out accuracy, samples/s,
// rollout and learner utilisation, the longest learner wait; the reward and accuracy curves as JSON
// and as a self-contained HTML page (inline SVG). Synchronous runs its kernels on all cores; each
// async role on half of them, so on 2 cores the rollout thread and the learner really overlap. The
// task is synthetic so that a model from scratch learns it in seconds: reply with the letter 'a'
// only (a reply counts as correct when all of it is 'a'); held-out accuracy is over sampled replies
// (temperature 1, as trained; greedy replies flip from 0 to 1 within two steps) to prompts of a
// seed the training never draws, evaluated after the run on weight snapshots so that evaluation
// never steals time from the runs. The synchronous baseline runs twice, on all cores and on one
// (the tiny model's kernels may be faster on one), and the faster is the baseline. The
// multi-process modes (1 learner rank + 1 rollout rank, one thread each, weights sent as bf16:
// "mpi-0", max staleness 0, the synchronous algorithm over the two processes, which take turns;
// "mpi-1", max staleness 1, where they overlap) run as child jobs, `mpirun -n 2 bench_rl
// --mpi-run OUT STEPS TARGET STALENESS`, whose learner evaluates its snapshots after the run and
// writes OUT/bench_rl_mpi_STALENESS.json. mpi-1 against mpi-0 is the overlap's gain with the
// same processes, messages and kernels.
//   bench_rl [OUT_DIR] [STEPS] [TARGET_ACCURACY] [MODES: e.g. async-2,mpi; default all]
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

data::BpeTokenizer byte_tokenizer() {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, char(b)));
  data::SpecialTokens sp = {{"<|endoftext|>", 256}, {"<|im_start|>", 257}, {"<|im_end|>", 258}};
  return data::BpeTokenizer::from_ranks(tokens, data::PreTokenizer::Gpt2, sp);
}

ModelConfig bench_config() {
  ModelConfig c = model_preset("tiny-llama");
  c.n_layer = 2, c.d_model = 64, c.n_head = 4, c.n_kv_head = 2, c.head_dim = 16, c.d_ff = 128;
  c.vocab = 260, c.max_seq = 64, c.init_std = 0.02f;
  return c;
}

struct Run {
  std::string name;
  int64_t staleness = -1;                         // -1: synchronous
  std::vector<double> wall, reward, accuracy_at;  // per step; accuracy per evaluation
  std::vector<int64_t> eval_steps;
  double seconds = 0, max_wait = 0, rollout_util = 0, learner_util = 0, load_before = 0,
         load_after = 0, time_to_target = -1;
  int64_t samples = 0, spanning = 0;  // spanning: trained completions over several versions
  // Where the time goes: mean seconds a step of generation (the rollout side's busy time) and of
  // learning (GrpoLearner::learn), and the step at which the target was reached.
  double rollout_s = 0, learn_s = 0;
  int64_t steps_to_target = -1;
};

// mpi: this process is one rank of a 2-rank job (rank 0 learns, rank 1 generates); only rank 0's
// Run is filled.
// partial > 0: partial rollouts of that many tokens a batch (async only).
Run run(const std::string& name, int64_t staleness, int threads, int steps, int eval_every,
        double target, bool mpi = false, int partial = 0) {
  Run r;
  r.name = name;
  r.staleness = staleness;
  Decoder model(bench_config(), cpu_backend());
  model.params().init(7);
  auto tok = byte_tokenizer();
  data::ChatTemplate chat("chatml", tok);
  LetterA env;
  RlOptions o;
  o.prompts_per_step = 8;
  o.group_size = 8;
  o.max_tokens = 8;
  o.lr = 3e-3;
  o.seed = 11;
  o.partial_tokens = partial;
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
  if (mpi) {
    set_num_threads(threads);
    MpiRlOptions mo;
    mo.rollout_ranks = 1;
    mo.max_staleness = staleness;
    mo.learner_timeout = 300;
    mo.steps = steps;
    MpiGrpo t(comm::world(), model, tok, chat, env, o, mo);
    if (!t.is_learner()) {
      t.run_rollout();
      return r;
    }
    for (int s = 0; s < steps; ++s) {
      stats.push_back(t.step());
      r.wall.push_back(now_seconds() - t0 - snap_time);
      const double c0 = now_seconds();
      if ((s + 1) % eval_every == 0) snapshot(s + 1);
      snap_time += now_seconds() - c0;
    }
    t.finish();
  } else if (staleness < 0) {
    set_num_threads(threads);
    GrpoTrainer t(model, tok, chat, env, o);
    for (int s = 0; s < steps; ++s) {
      stats.push_back(t.step());
      r.wall.push_back(now_seconds() - t0 - snap_time);
      const double c0 = now_seconds();
      if ((s + 1) % eval_every == 0) snapshot(s + 1);
      snap_time += now_seconds() - c0;
    }
  } else {
    AsyncOptions ao;
    ao.max_staleness = staleness;
    ao.threads_per_role = threads;
    ao.learner_timeout = 300;
    AsyncGrpo t(model, tok, chat, env, o, ao);
    for (int s = 0; s < steps; ++s) {
      stats.push_back(t.step());
      r.wall.push_back(now_seconds() - t0 - snap_time);
      const double c0 = now_seconds();
      if ((s + 1) % eval_every == 0) snapshot(s + 1);
      snap_time += now_seconds() - c0;
    }
    t.stop();
  }
  r.seconds = r.wall.back();
  r.load_after = load_average();
  for (const RlStepStats& st : stats) {
    r.reward.push_back(st.reward_mean);
    r.samples += st.groups * o.group_size;
    r.spanning += st.spanning_rollouts;
    r.max_wait = std::max(r.max_wait, st.learner_wait_seconds);
    r.rollout_util += st.rollout_utilisation / double(steps);
    r.learner_util += st.learner_utilisation / double(steps);
    r.rollout_s += st.rollout_seconds / double(steps);
    r.learn_s += st.learner_seconds / double(steps);
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

// The child job's side of the multi-process mode: both ranks run, rank 0 writes the Run.
int mpi_child(const std::string& out, int steps, double target, int eval_every, int staleness) {
  comm::Communicator& w = comm::world();
  LOOM_CHECK(w.size() == 2, "bench_rl --mpi-run runs as 2 ranks, not ", w.size());
  const Run r = run(cat("mpi-", staleness), staleness, 1, steps, eval_every, target, true);
  if (w.rank() != 0) return 0;
  Json j = Json::object();
  j["seconds"] = r.seconds;
  j["max_wait"] = r.max_wait;
  j["rollout_util"] = r.rollout_util;
  j["learner_util"] = r.learner_util;
  j["load_before"] = r.load_before;
  j["load_after"] = r.load_after;
  j["time_to_target"] = r.time_to_target;
  j["samples"] = r.samples;
  j["rollout_s"] = r.rollout_s;
  j["learn_s"] = r.learn_s;
  j["steps_to_target"] = r.steps_to_target;
  j["wall"] = vec_json(r.wall);
  j["reward"] = vec_json(r.reward);
  j["accuracy_at"] = vec_json(r.accuracy_at);
  std::vector<double> es(r.eval_steps.begin(), r.eval_steps.end());
  j["eval_steps"] = vec_json(es);
  write_file_atomic(cat(out, "/bench_rl_mpi_", staleness, ".json"), j.dump(2) + "\n");
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
  const Json j = Json::parse(read_file(json), json);
  r->name = cat("mpi-", staleness);
  r->staleness = staleness;
  r->seconds = j.at("seconds").as_double();
  r->max_wait = j.at("max_wait").as_double();
  r->rollout_util = j.at("rollout_util").as_double();
  r->learner_util = j.at("learner_util").as_double();
  r->load_before = j.at("load_before").as_double();
  r->load_after = j.at("load_after").as_double();
  r->time_to_target = j.at("time_to_target").as_double();
  r->samples = int64_t(j.at("samples").as_double());
  r->rollout_s = j.at("rollout_s").as_double();
  r->learn_s = j.at("learn_s").as_double();
  r->steps_to_target = int64_t(j.at("steps_to_target").as_double());
  r->wall = json_vec(j.at("wall"));
  r->reward = json_vec(j.at("reward"));
  r->accuracy_at = json_vec(j.at("accuracy_at"));
  for (double e : json_vec(j.at("eval_steps"))) r->eval_steps.push_back(int64_t(e));
  return true;
#else
  std::fprintf(stderr, "built without MPI: no multi-process mode\n");
  return false;
#endif
}

}  // namespace

int main(int argc, char** argv) {
  const int eval_every = 2;
  if (argc > 1 && std::string(argv[1]) == "--mpi-run") {
    LOOM_CHECK(argc == 6, "bench_rl --mpi-run OUT STEPS TARGET STALENESS");
    return mpi_child(argv[2], std::stoi(argv[3]), std::stod(argv[4]), eval_every,
                     std::stoi(argv[5]));
  }
  const std::string out = argc > 1 ? argv[1] : "bench_rl_out";
  const int steps = argc > 2 ? std::stoi(argv[2]) : 40;
  const double target = argc > 3 ? std::stod(argv[3]) : 0.5;
  make_dirs(out);
  const int cores = std::max(1, omp_get_num_procs()), half = std::max(1, cores / 2);
  // An optional 4th argument picks modes (comma-separated; the baselines always run), so that a
  // quiet moment on a shared machine can be used for the runs that matter.
  const std::string only = argc > 4 ? cat(",", argv[4], ",") : std::string();
  auto want = [&](const char* m) {
    return only.empty() || only.find(cat(",", m, ",")) != std::string::npos;
  };
  std::vector<Run> runs = {run("sync", -1, cores, steps, eval_every, target),
                           run("sync-1t", -1, 1, steps, eval_every, target)};
  if (want("async-1")) runs.push_back(run("async-1", 1, half, steps, eval_every, target));
  if (want("async-2")) runs.push_back(run("async-2", 2, half, steps, eval_every, target));
  // Partial rollouts: 8-token completions in two slices of 4, the second on the newer weights
  // (new groups start at most 1 step ahead).
  if (want("async-2p"))
    runs.push_back(run("async-2p", 2, half, steps, eval_every, target, false, 4));
  Run m0, m1;
  const bool mpi_ok = want("mpi") && run_mpi_mode(out, steps, target, 0, &m0) &&
                      run_mpi_mode(out, steps, target, 1, &m1);
  if (mpi_ok) runs.push_back(m0), runs.push_back(m1);
  Json j = Json::object();
  j["steps"] = steps;
  j["target_accuracy"] = target;
  j["cores"] = omp_get_num_procs();
  Json rs = Json::array();
  std::printf("%-8s %9s %10s %12s %8s %9s %9s %9s %9s %9s %13s\n", "mode", "wall s", "samples/s",
              "s to target", "steps", "ms/step", "gen ms", "learn ms", "rollout%", "learner%",
              "loadavg");
  for (const Run& r : runs) {
    std::printf("%-8s %9.2f %10.1f %12.2f %8lld %9.1f %9.1f %9.1f %9.0f %9.0f %6.2f->%.2f\n",
                r.name.c_str(), r.seconds, double(r.samples) / r.seconds, r.time_to_target,
                static_cast<long long>(r.steps_to_target), 1e3 * r.seconds / double(steps),
                1e3 * r.rollout_s, 1e3 * r.learn_s, 100 * r.rollout_util, 100 * r.learner_util,
                r.load_before, r.load_after);
    Json x = Json::object();
    x["mode"] = r.name;
    x["max_staleness"] = r.staleness;
    x["wall_seconds"] = r.seconds;
    x["samples_per_s"] = double(r.samples) / r.seconds;
    x["seconds_to_target"] = r.time_to_target;
    x["rollout_utilisation"] = r.rollout_util;
    x["learner_utilisation"] = r.learner_util;
    x["max_learner_wait_seconds"] = r.max_wait;
    x["rollout_seconds_per_step"] = r.rollout_s;
    x["learn_seconds_per_step"] = r.learn_s;
    x["steps_to_target"] = r.steps_to_target;
    x["spanning_rollouts"] = r.spanning;
    x["loadavg_before"] = r.load_before;
    x["loadavg_after"] = r.load_after;
    Json rw = Json::array(), wl = Json::array(), ac = Json::array(), es = Json::array();
    for (double v : r.reward) rw.push_back(Json(v));
    for (double v : r.wall) wl.push_back(Json(v));
    for (double v : r.accuracy_at) ac.push_back(Json(v));
    for (int64_t v : r.eval_steps) es.push_back(Json(v));
    x["reward"] = rw;
    x["wall"] = wl;
    x["heldout_accuracy"] = ac;
    x["eval_steps"] = es;
    rs.push_back(x);
  }
  j["runs"] = rs;
  const Run& sync = runs[1].time_to_target > 0 && (runs[0].time_to_target < 0 ||
                                                   runs[1].time_to_target < runs[0].time_to_target)
                        ? runs[1]
                        : runs[0];
  std::printf("baseline: %s\n", sync.name.c_str());
  for (size_t k = 2; k < runs.size(); ++k)
    if (sync.time_to_target > 0 && runs[k].time_to_target > 0)
      std::printf("%s reaches accuracy %.2f %.2fx sooner than sync (target 1.3x)\n",
                  runs[k].name.c_str(), target, sync.time_to_target / runs[k].time_to_target);
    else
      std::printf("%s or sync never reached accuracy %.2f in %d steps\n", runs[k].name.c_str(),
                  target, steps);
  // The overlap's gain with the same two processes: mpi-1 against mpi-0.
  if (mpi_ok && m0.time_to_target > 0 && m1.time_to_target > 0)
    std::printf(
        "mpi-1 reaches accuracy %.2f %.2fx sooner than mpi-0 (the same 2 processes, "
        "synchronous)\n",
        target, m0.time_to_target / m1.time_to_target);
  write_file_atomic(out + "/bench_rl.json", j.dump(2) + "\n");
  // The curves against wall time: reward (solid) and held-out accuracy (dots), one colour a mode.
  double xmax = 1e-9;
  for (const Run& r : runs) xmax = std::max(xmax, r.seconds);
  const char* colours[] = {"#444", "#999", "#1f77b4", "#d62728", "#9467bd", "#8c564b", "#2ca02c"};
  std::string svg =
      "<svg xmlns='http://www.w3.org/2000/svg' width='600' height='300'>\n"
      "<rect width='600' height='300' fill='white'/>\n"
      "<line x1='40' y1='260' x2='580' y2='260' stroke='black'/>\n"
      "<line x1='40' y1='40' x2='40' y2='260' stroke='black'/>\n";
  svg += cat("<text x='300' y='290' font-size='12'>wall seconds (0 .. ", xmax, ")</text>\n");
  svg += "<text x='2' y='40' font-size='12'>1</text><text x='2' y='260' font-size='12'>0</text>\n";
  for (size_t k = 0; k < runs.size(); ++k) {
    const Run& r = runs[k];
    svg += polyline(r.wall, r.reward, xmax, colours[k]);
    std::vector<double> ex, ey;
    for (size_t e = 0; e < r.eval_steps.size(); ++e) {
      ex.push_back(r.eval_steps[e] == 0 ? 0 : r.wall[size_t(r.eval_steps[e] - 1)]);
      ey.push_back(r.accuracy_at[e]);
    }
    for (size_t e = 0; e < ex.size(); ++e)
      svg += cat("<circle r='3' fill='", colours[k], "' cx='", 40 + 540 * ex[e] / xmax, "' cy='",
                 260 - 220 * ey[e], "'/>\n");
    svg += cat("<text x='460' y='", 60 + 16 * k, "' font-size='12' fill='", colours[k], "'>",
               r.name, "</text>\n");
  }
  svg += "</svg>\n";
  write_file_atomic(out + "/bench_rl.html",
                    "<!doctype html><html><head><meta charset='utf-8'><title>loom GRPO: sync vs "
                    "async</title></head><body><h1>GRPO reward (lines) and held-out accuracy "
                    "(dots) against wall time</h1>\n" +
                        svg + "</body></html>\n");
  std::printf("wrote %s/bench_rl.json and %s/bench_rl.html\n", out.c_str(), out.c_str());
  return 0;
}
