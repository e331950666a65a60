// `loom plan`: predicts memory per GPU, step time, throughput, MFU and goodput of a training
// run at any scale, or searches the layouts of a model on a cluster (--search).
#include <cstdio>

#include "cli/command.h"
#include "cli/options.h"
#include "core/config.h"
#include "core/error.h"
#include "core/fs.h"
#include "model/model_config.h"
#include "plan/plan.h"
#include "plan/search.h"
#include "plan/validation.h"

namespace loom::cli {

namespace {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

// Command-line options that are shorthands for config keys.
struct Shorthand {
  const char* option;
  const char* key;
};
constexpr Shorthand kShorthands[] = {
    {"model", "model.preset"},
    {"seq", "train.seq_len"},
    {"cluster", "cluster.preset"},
    {"gpu", "cluster.gpu"},
    {"nodes", "cluster.nodes"},
    {"gpus-per-node", "cluster.gpus_per_node"},
    {"global-batch", "plan.global_batch"},
    {"micro-batch", "train.micro_batch"},
    {"grad-accum", "train.grad_accum"},
    {"precision", "precision.policy"},
    {"fp8-recipe", "precision.fp8_recipe"},
    {"optimizer", "plan.optimizer"},
    {"zero", "parallel.zero"},
    {"recompute", "train.recompute"},
    {"tp", "parallel.tp"},
    {"pp", "parallel.pp"},
    {"vp", "parallel.vp"},
    {"cp", "parallel.cp"},
    {"ep", "parallel.ep"},
    {"dp", "parallel.dp"},
};

std::string validation_report(bool as_json) {
  Json rows = Json::array();
  std::string table = "row                              published  predicted   error  asserted\n";
  for (const plan::PublishedRow& r : plan::published_rows()) {
    double pred = plan::predicted_tflops(r);
    double err = pred / r.published_tflops - 1;
    char b[256];
    std::snprintf(b, sizeof b, "%-32s %9.0f %10.1f %+6.1f%%  %s\n", r.name.c_str(),
                  r.published_tflops, pred, err * 100, r.asserted ? "yes" : "no");
    table += b;
    rows.push_back(Json(Json::Object{{"name", r.name},
                                     {"source", r.source},
                                     {"published_tflops", r.published_tflops},
                                     {"predicted_tflops", pred},
                                     {"error", err},
                                     {"hardware_flops", r.hardware_flops},
                                     {"asserted", r.asserted}}));
  }
  return as_json ? Json(Json::Object{{"rows", rows}}).dump(2) + "\n" : table;
}

}  // namespace

int run_plan(const Args& args) {
  Options opt(
      "loom plan [--config FILE] [--model NAME] [--cluster NAME] [options]",
      "Predicts memory per GPU, step time, tokens/s, TFLOP/s per GPU, MFU and goodput for\n"
      "a model on a cluster with a parallel layout, or searches layouts (--search).\n"
      "The config is a training config (loom train's [model], [parallel], [precision],\n"
      "[train]; [data] and [optim] are accepted and not read) plus the planner's [cluster]\n"
      "and [plan] sections (docs/plan.md); without a cluster, one dgx-h100 node. Options\n"
      "are shorthands for config keys; --set KEY=VALUE sets any key. Command line\n"
      "overrides the file.\n"
      "Models: loom's presets (" +
          join(loom::model_preset_names()) + ") or the planner's (" +
          join(plan::model_preset_names()) + ")\nClusters: " + join(plan::cluster_preset_names()) +
          "; GPUs: " + join(plan::gpu_preset_names()));
  opt.value("config", "", "TOML file: a training config, with [cluster] and [plan] if wanted")
      .value("model", "", "model preset (model.preset)")
      .value("seq", "", "sequence length (train.seq_len)")
      .value("cluster", "", "cluster preset of DGX-style nodes (cluster.preset)")
      .value("gpu", "", "GPU type for a custom cluster (cluster.gpu)")
      .value("nodes", "", "number of nodes (cluster.nodes)")
      .value("gpus-per-node", "", "GPUs per node (cluster.gpus_per_node)")
      .value("global-batch", "", "sequences per optimizer step (plan.global_batch)")
      .value("micro-batch", "", "sequences per micro-batch (train.micro_batch)")
      .value("grad-accum", "", "micro-batches per step per DP rank (train.grad_accum)")
      .value("precision", "", "fp32, bf16 or fp16 (precision.policy)")
      .value("fp8-recipe", "",
             "fp8_tensorwise_delayed, fp8_tensorwise_current or mxfp8 (precision.fp8_recipe)")
      .value("optimizer", "", "adam, sgd or adam8bit (plan.optimizer)")
      .value("zero", "", "ZeRO stage 0-3; 1 = distributed optimizer (parallel.zero)")
      .value("recompute", "", "none, selective or full (train.recompute)")
      .value("tp", "", "tensor parallel size (parallel.tp)")
      .value("pp", "", "pipeline parallel size (parallel.pp)")
      .value("vp", "", "virtual pipeline chunks per stage (parallel.vp)")
      .value("cp", "", "context parallel size (parallel.cp)")
      .value("ep", "", "expert parallel size (parallel.ep)")
      .value("dp", "", "data parallel size; default world / (tp pp cp) (parallel.dp)")
      .multi("set", "any config key, e.g. --set plan.tp_comm_overlap=true")
      .flag("search", "enumerate layouts, drop those that do not fit, rank, explain the winner")
      .value("top", "10", "with --search: how many ranked layouts to list")
      .flag("json", "print one JSON object instead of a table")
      .value("out", "", "write the output to this file (atomically) instead of stdout")
      .flag("validate", "print predictions against the published throughput rows")
      .flag("list", "list model, cluster and GPU presets");
  if (!opt.parse(args)) return 0;
  const bool as_json = opt.has("json");
  std::string out;

  if (opt.has("list")) {
    out = "models:   " + join(loom::model_preset_names()) +
          "\nplanner models: " + join(plan::model_preset_names()) +
          "\nclusters: " + join(plan::cluster_preset_names()) +
          "\ngpus:     " + join(plan::gpu_preset_names()) + "\n";
  } else if (opt.has("validate")) {
    out = validation_report(as_json);
  } else {
    Config cfg = opt.has("config") ? Config::load(opt.get("config")) : Config();
    for (const Shorthand& s : kShorthands)
      if (opt.has(s.option)) cfg.set(s.key, opt.get(s.option), cat("--", s.option));
    for (const std::string& kv : opt.all("set")) cfg.set_override(kv, "--set");
    LOOM_CHECK(opt.get("precision") != "fp8",
               "--precision fp8: fp8 is --precision bf16 with --fp8-recipe "
               "fp8_tensorwise_delayed, fp8_tensorwise_current or mxfp8 (precision.fp8_recipe)");
    bool cluster_given = false;
    for (const std::string& k : cfg.keys())
      cluster_given = cluster_given || k.rfind("cluster.", 0) == 0;
    plan::PlanInput in = plan::read_plan_input(cfg);
    if (!cluster_given)
      std::fprintf(stderr, "loom plan: no cluster given: one %s node (--cluster, [cluster])\n",
                   in.cluster.name.c_str());
    if (opt.has("search")) {
      int64_t top = opt.get_int("top");
      LOOM_CHECK(top >= 1, "--top must be >= 1");
      plan::SearchResult res = plan::search_layouts(in.model, in.cluster, in.train);
      if (res.ranked.empty()) fail("no layout fits: ", res.explanation);
      if (as_json) {
        Json j = Json::object();
        if (!res.ranked.empty()) {
          plan::PlanInput best = in;
          best.train = res.ranked.front().train;
          j = plan::plan_json(plan::make_plan(best));
        }
        Json ranked = Json::array();
        for (size_t i = 0; i < res.ranked.size() && int64_t(i) < top; ++i) {
          const plan::Candidate& c = res.ranked[i];
          ranked.push_back(Json(Json::Object{{"layout", plan::layout_string(c.train)},
                                             {"tokens_per_s", c.step.tokens_per_s},
                                             {"tflops_per_gpu", c.step.tflops_per_gpu},
                                             {"mfu", c.step.mfu},
                                             {"step_time_s", c.step.step},
                                             {"memory_per_gpu_gb", c.memory.total() / 1e9}}));
        }
        j["search"] = Json(Json::Object{{"enumerated", res.enumerated},
                                        {"invalid", res.invalid},
                                        {"not_fitting", res.not_fitting},
                                        {"fitting", int64_t(res.ranked.size())},
                                        {"ranked", ranked},
                                        {"explanation", res.explanation}});
        out = j.dump(2) + "\n";
      } else {
        char b[256];
        out = "rank  tokens/s  TFLOP/s  MFU    mem GB  layout\n";
        for (size_t i = 0; i < res.ranked.size() && int64_t(i) < top; ++i) {
          const plan::Candidate& c = res.ranked[i];
          std::snprintf(b, sizeof b, "%4zu %9.0f %8.1f %5.1f%% %7.1f  %s\n", i + 1,
                        c.step.tokens_per_s, c.step.tflops_per_gpu, c.step.mfu * 100,
                        c.memory.total() / 1e9, plan::layout_string(c.train).c_str());
          out += b;
        }
        out += "\n" + res.explanation;
        if (!res.ranked.empty()) {
          plan::PlanInput best = in;
          best.train = res.ranked.front().train;
          out += "\n" + plan::plan_table(plan::make_plan(best));
        }
      }
    } else {
      plan::Plan p = plan::make_plan(in);
      out = as_json ? plan::plan_json(p).dump(2) + "\n" : plan::plan_table(p);
    }
  }
  if (opt.has("out")) {
    write_file_atomic(opt.get("out"), out);
  } else {
    std::fputs(out.c_str(), stdout);
  }
  return 0;
}

}  // namespace loom::cli
