#include "plan/search.h"

#include <algorithm>
#include <cstdio>
#include <functional>

#include "core/error.h"

namespace loom::plan {

namespace {

std::vector<int64_t> divisors(int64_t n, int64_t limit) {
  std::vector<int64_t> d;
  for (int64_t i = 1; i <= n && i <= limit; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

std::string pct(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", x * 100);
  return b;
}
std::string secs(double x) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3f s", x);
  return b;
}

// Per-step time components, to say which one an alternative loses on.
struct Parts {
  double compute, tp, cp, ep, bubble, p2p, dp, opt;
};
Parts parts(const Candidate& c) {
  double mb = double(micro_batches(c.train));
  const StepBreakdown& s = c.step;
  return {mb * s.stage_compute,
          mb * s.stage_tp_comm,
          mb * s.stage_cp_comm,
          mb * s.stage_ep_comm,
          s.bubble,
          s.p2p,
          s.dp_exposed,
          s.optimizer};
}

std::string why_slower(const Candidate& alt, const Candidate& win) {
  Parts a = parts(alt), w = parts(win);
  struct Item {
    const char* what;
    double a, w;
  } items[] = {{"compute (GEMM shapes, recompute)", a.compute, w.compute},
               {"exposed TP communication", a.tp, w.tp},
               {"exposed CP communication", a.cp, w.cp},
               {"MoE all-to-all", a.ep, w.ep},
               {"pipeline bubble", a.bubble, w.bubble},
               {"pipeline sends", a.p2p, w.p2p},
               {"exposed DP/ZeRO communication", a.dp, w.dp},
               {"optimizer step", a.opt, w.opt}};
  const Item* worst = &items[0];
  for (const Item& it : items)
    if (it.a - it.w > worst->a - worst->w) worst = &it;
  return cat(worst->what, " ", secs(worst->w), " -> ", secs(worst->a), " per step");
}

}  // namespace

SearchResult search_layouts(const ModelSpec& m, const ClusterSpec& c, const TrainSpec& base,
                            const SearchOptions& opt, const Efficiency& e) {
  validate(m);
  validate(c);
  // The global batch stays what the config asks for: one given as micro_batch x grad_accum x
  // dp is that product at the config's own layout.
  TrainSpec fixed = base;
  if (fixed.global_batch == 0) {
    TrainSpec own = base;
    resolve_and_validate(m, c, own);
    fixed.global_batch = own.global_batch;
  }
  SearchResult res;
  const int64_t world = c.world();
  std::vector<Candidate> all_fitting;
  std::vector<Candidate> oom;  // kept to explain what did not fit
  std::vector<int64_t> tps;
  for (int64_t tp = 1; tp <= std::min<int64_t>(m.heads, world); tp *= 2)
    if (m.heads % tp == 0) tps.push_back(tp);
  std::vector<int64_t> cps = {1};
  for (int64_t cp = 2; cp <= opt.max_cp && m.seq >= 8192; cp *= 2) cps.push_back(cp);
  std::vector<int64_t> eps = m.moe() ? divisors(m.experts, world) : std::vector<int64_t>{1};

  for (int64_t tp : tps)
    for (int64_t cp : cps)
      for (int64_t pp = 1; pp * tp * cp <= world; ++pp) {
        if (world % (pp * tp * cp) != 0) continue;
        for (int64_t vp = 1; vp <= (pp > 1 ? opt.max_vp : 1); ++vp)
          for (int64_t ep : eps)
            for (int64_t mbs : opt.micro_batches)
              for (Recompute rc : opt.recomputes) {
                TrainSpec t = fixed;
                t.tp = tp;
                t.cp = cp;
                t.pp = pp;
                t.vp = vp;
                t.ep = ep;
                t.dp = 0;
                t.micro_batch = mbs;
                t.recompute = rc;
                t.sequence_parallel = base.sequence_parallel;
                ++res.enumerated;
                try {
                  resolve_and_validate(m, c, t);
                } catch (const Error&) {
                  ++res.invalid;
                  continue;
                }
                Candidate cand{t, memory_per_gpu(m, c, t), {}};
                if (!cand.memory.fits()) {
                  ++res.not_fitting;
                  cand.step = step_time(m, c, t, e);
                  oom.push_back(cand);
                  continue;
                }
                cand.step = step_time(m, c, t, e);
                all_fitting.push_back(cand);
              }
      }
  std::stable_sort(all_fitting.begin(), all_fitting.end(),
                   [](const Candidate& a, const Candidate& b) {
                     return a.step.tokens_per_s > b.step.tokens_per_s;
                   });
  res.ranked = all_fitting;

  std::string& x = res.explanation;
  x += cat("enumerated ", res.enumerated, " layouts: ", res.invalid,
           " invalid (divisibility or batch rules), ", res.not_fitting, " do not fit in ",
           c.gpu.hbm_gb, " GB, ", res.ranked.size(), " fit\n");
  if (res.ranked.empty()) {
    const Candidate* least = nullptr;
    for (const Candidate& o : oom)
      if (!least || o.memory.total() < least->memory.total()) least = &o;
    if (least)
      x += cat("nothing fits: the smallest footprint is ", least->memory.total() / 1e9, " GB with ",
               layout_string(least->train), "; add nodes or use a larger-memory GPU\n");
    else
      x += "no valid layout for this model on this cluster (check batch size and world size)\n";
    return res;
  }
  const Candidate& w = res.ranked.front();
  x += cat("winner: ", layout_string(w.train), "\n");
  {
    char b[256];
    std::snprintf(b, sizeof b,
                  "  %.0f tokens/s, %.1f TFLOP/s per GPU, MFU %.1f%%, %.1f of %.0f GB per GPU\n",
                  w.step.tokens_per_s, w.step.tflops_per_gpu, w.step.mfu * 100,
                  w.memory.total() / 1e9, w.memory.capacity / 1e9);
    x += b;
  }
  Parts wp = parts(w);
  x += cat("  step ", secs(w.step.step), ": compute ", secs(wp.compute), ", TP ", secs(wp.tp), " (",
           w.step.tp_link, "), bubble ", secs(wp.bubble), ", DP exposed ", secs(wp.dp), " (",
           w.step.dp_link, ")\n");

  // For each knob, the best fitting layout that sets it differently, and what it loses on.
  auto best_where = [&](const std::function<bool(const TrainSpec&)>& pred) -> const Candidate* {
    for (const Candidate& cand : res.ranked)
      if (pred(cand.train)) return &cand;
    return nullptr;
  };
  auto count_oom = [&](const std::function<bool(const TrainSpec&)>& pred) {
    int64_t n = 0;
    for (const Candidate& o : oom) n += pred(o.train) ? 1 : 0;
    return n;
  };
  auto compare = [&](const std::string& label, const std::function<bool(const TrainSpec&)>& pred) {
    const Candidate* alt = best_where(pred);
    int64_t dropped = count_oom(pred);
    if (!alt) {
      if (dropped)
        x += cat("  ", label, ": none of the ", dropped, " such layouts fit in memory\n");
      return;
    }
    double loss = 1 - alt->step.tokens_per_s / w.step.tokens_per_s;
    if (loss < 0.005) {
      x += cat("  ", label, ": ", layout_string(alt->train), " is a near tie (", pct(loss),
               " slower)\n");
      return;
    }
    x += cat("  ", label, ": best is ", layout_string(alt->train), ", ", pct(loss),
             " slower; it loses on ", why_slower(*alt, w), "\n");
  };
  const int64_t gpn = c.gpus_per_node;
  if (w.train.tp <= gpn) {
    compare(cat("TP across nodes (tp > ", gpn, ", TP traffic over the network instead of NVLink)"),
            [&](const TrainSpec& t) { return t.tp > gpn; });
  }
  compare("smaller TP", [&](const TrainSpec& t) { return t.tp < w.train.tp; });
  compare("larger TP", [&](const TrainSpec& t) { return t.tp > w.train.tp && t.tp <= gpn; });
  compare("fewer pipeline stages", [&](const TrainSpec& t) { return t.pp < w.train.pp; });
  compare("more pipeline stages", [&](const TrainSpec& t) { return t.pp > w.train.pp; });
  if (w.train.pp > 1)
    compare("other interleaving (vp)",
            [&](const TrainSpec& t) { return t.pp == w.train.pp && t.vp != w.train.vp; });
  if (cps.size() > 1)
    compare("other context parallel", [&](const TrainSpec& t) { return t.cp != w.train.cp; });
  if (m.moe())
    compare("other expert parallel", [&](const TrainSpec& t) { return t.ep != w.train.ep; });
  compare("other micro-batch",
          [&](const TrainSpec& t) { return t.micro_batch != w.train.micro_batch; });
  compare("other recompute", [&](const TrainSpec& t) { return t.recompute != w.train.recompute; });
  return res;
}

}  // namespace loom::plan
