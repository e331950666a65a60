#include "plan/plan.h"

#include <cstdio>
#include <vector>

#include "core/error.h"

namespace loom::plan {

double checkpoint_bytes(const ModelSpec& m, const TrainSpec& t) {
  StateBytes sb = state_bytes(t.precision, t.optimizer, t.grad_fp32);
  return count_params(m).total(m) * (sb.weight + sb.optimizer);
}

Plan make_plan(PlanInput in, const Efficiency& e) {
  resolve_and_validate(in.model, in.cluster, in.train);
  Plan p;
  p.in = in;
  p.memory = memory_per_gpu(in.model, in.cluster, in.train);
  p.step = step_time(in.model, in.cluster, in.train, e);
  ReliabilityInput ri;
  ri.gpus = in.cluster.world();
  ri.gpu_mtbf_hours = in.cluster.gpu_mtbf_hours;
  ri.checkpoint_bytes = checkpoint_bytes(in.model, in.train);
  ri.ckpt_write_gbs = in.cluster.ckpt_write_gbs;
  ri.restart_minutes = in.cluster.restart_minutes;
  p.restart_source = "cluster.restart_minutes";
  if (ri.restart_minutes < 0) {
    SupervisorMeasured m;
    double reload_s = ri.checkpoint_bytes / (ri.ckpt_write_gbs * 1e9);
    ri.restart_minutes = loom_restart_seconds(p.step.step, reload_s, m) / 60;
    p.restart_source = cat("Loom's supervisor: hang detected at ", m.hang_detect_ratio,
                           "x the calibrated timeout, relaunch ", m.relaunch_s,
                           " s, checkpoint reload; ", m.source);
  }
  p.restart_minutes = ri.restart_minutes;
  p.rel = reliability(ri);
  return p;
}

std::string layout_string(const TrainSpec& t) {
  return cat("tp=", t.tp, " pp=", t.pp, " vp=", t.vp, " cp=", t.cp, " ep=", t.ep, " dp=", t.dp,
             " mbs=", t.micro_batch, " recompute=", recompute_name(t.recompute),
             " zero=", t.zero_stage, t.sequence_parallel ? " sp" : "");
}

namespace {

double gb(double bytes) {
  return bytes / 1e9;
}

}  // namespace

Json plan_json(const Plan& p) {
  const ModelSpec& m = p.in.model;
  const ClusterSpec& c = p.in.cluster;
  const TrainSpec& t = p.in.train;
  ParamCounts pc = count_params(m);
  Json j = Json::object();
  j["model"] = Json(Json::Object{{"name", m.name},
                                 {"params", pc.total(m)},
                                 {"active_params", pc.active(m)},
                                 {"layers", m.layers},
                                 {"hidden", m.hidden},
                                 {"seq", m.seq}});
  j["cluster"] = Json(Json::Object{{"name", c.name},
                                   {"gpu", c.gpu.name},
                                   {"nodes", c.nodes},
                                   {"gpus_per_node", c.gpus_per_node},
                                   {"gpus", c.world()}});
  j["layout"] =
      Json(Json::Object{{"tp", t.tp},
                        {"pp", t.pp},
                        {"vp", t.vp},
                        {"cp", t.cp},
                        {"ep", t.ep},
                        {"dp", t.dp},
                        {"micro_batch", t.micro_batch},
                        {"global_batch", t.global_batch},
                        {"micro_batches", micro_batches(t)},
                        {"precision", name(t.precision)},
                        {"fp8_recipe", t.precision == Precision::fp8 ? name(t.fp8_recipe) : "none"},
                        {"optimizer", name(t.optimizer)},
                        {"zero_stage", t.zero_stage},
                        {"recompute", recompute_name(t.recompute)},
                        {"sequence_parallel", t.sequence_parallel}});
  const MemoryBreakdown& mem = p.memory;
  j["memory_per_gpu_gb"] = gb(mem.total());
  j["memory"] = Json(Json::Object{{"weights_gb", gb(mem.weights)},
                                  {"grads_gb", gb(mem.grads)},
                                  {"optimizer_gb", gb(mem.optimizer)},
                                  {"activations_gb", gb(mem.activations)},
                                  {"comm_buffers_gb", gb(mem.comm_buffers)},
                                  {"reserve_gb", gb(mem.reserve)},
                                  {"capacity_gb", gb(mem.capacity)},
                                  {"worst_stage", mem.worst_stage},
                                  {"fits", mem.fits()}});
  const StepBreakdown& s = p.step;
  j["step_time_s"] = s.step;
  j["tokens_per_s"] = s.tokens_per_s;
  j["tflops_per_gpu"] = s.tflops_per_gpu;
  j["hw_tflops_per_gpu"] = s.hw_tflops_per_gpu;
  j["mfu"] = s.mfu;
  j["step"] = Json(Json::Object{{"pipeline_s", s.pipeline},
                                {"bubble_s", s.bubble},
                                {"p2p_s", s.p2p},
                                {"dp_comm_s", s.dp_comm},
                                {"dp_exposed_s", s.dp_exposed},
                                {"optimizer_s", s.optimizer},
                                {"stage_time_s", s.stage_time},
                                {"stage_compute_s", s.stage_compute},
                                {"stage_tp_comm_s", s.stage_tp_comm},
                                {"stage_cp_comm_s", s.stage_cp_comm},
                                {"stage_ep_comm_s", s.stage_ep_comm},
                                {"model_flops", s.model_flops_per_step},
                                {"hardware_flops", s.hardware_flops_per_step},
                                {"tp_link", s.tp_link},
                                {"cp_link", s.cp_link},
                                {"ep_link", s.ep_link},
                                {"dp_link", s.dp_link},
                                {"pp_link", s.pp_link}});
  const Reliability& r = p.rel;
  j["reliability"] = Json(Json::Object{{"cluster_mtbf_hours", r.cluster_mtbf_hours},
                                       {"interruptions_per_day", r.interruptions_per_day},
                                       {"checkpoint_gb", gb(checkpoint_bytes(m, t))},
                                       {"checkpoint_save_s", r.checkpoint_save_s},
                                       {"young_interval_s", r.young_interval_s},
                                       {"daly_interval_s", r.daly_interval_s},
                                       {"restart_minutes", p.restart_minutes},
                                       {"restart_source", p.restart_source},
                                       {"goodput", r.goodput},
                                       {"wasted_gpu_hours_per_day", r.wasted_gpu_hours_per_day}});
  return j;
}

std::string plan_table(const Plan& p) {
  const ModelSpec& m = p.in.model;
  const ClusterSpec& c = p.in.cluster;
  const TrainSpec& t = p.in.train;
  const MemoryBreakdown& mem = p.memory;
  const StepBreakdown& s = p.step;
  const Reliability& r = p.rel;
  ParamCounts pc = count_params(m);
  std::string o;
  char buf[256];
  auto line = [&](const char* label, const std::string& value) {
    std::snprintf(buf, sizeof buf, "  %-26s %s\n", label, value.c_str());
    o += buf;
  };
  auto num = [&](const char* fmt, double v) {
    std::snprintf(buf, sizeof buf, fmt, v);
    return std::string(buf);
  };
  o += cat("model    ", m.name, ": ", num("%.2fB", pc.total(m) / 1e9), " parameters",
           m.moe() ? num(" (%.2fB active)", pc.active(m) / 1e9) : std::string(), ", ", m.layers,
           " layers, hidden ", m.hidden, ", seq ", m.seq, "\n");
  o += cat("cluster  ", c.name, ": ", c.nodes, " x ", c.gpus_per_node, " ", c.gpu.name, " = ",
           c.world(), " GPUs\n");
  o += cat("layout   ", layout_string(t), ", ", name(t.precision), ", ", name(t.optimizer),
           ", global batch ", t.global_batch, " (", micro_batches(t), " micro-batches)\n\n");
  o += "memory per GPU (GB)\n";
  line("weights", num("%.2f", gb(mem.weights)));
  line("gradients", num("%.2f", gb(mem.grads)));
  line("optimizer state", num("%.2f", gb(mem.optimizer)));
  line("activations", num("%.2f", gb(mem.activations)));
  line("communication buffers", num("%.2f", gb(mem.comm_buffers)));
  line("runtime reserve", num("%.2f", gb(mem.reserve)));
  line("total", cat(num("%.2f", gb(mem.total())), " of ", num("%.0f", gb(mem.capacity)), " (",
                    mem.worst_stage, " stage): ", mem.fits() ? "fits" : "DOES NOT FIT"));
  o += "\nstep time (s)\n";
  line("pipeline compute+comm", num("%.3f", s.pipeline - s.bubble));
  line("pipeline bubble", num("%.3f", s.bubble));
  line("pipeline p2p", num("%.3f", s.p2p));
  line("DP/ZeRO exposed",
       cat(num("%.3f", s.dp_exposed), " (of ", num("%.3f", s.dp_comm), " over ", s.dp_link, ")"));
  line("optimizer step", num("%.3f", s.optimizer));
  line("step", num("%.3f", s.step));
  line("per stage micro-batch",
       cat(num("%.1f ms", s.stage_time * 1e3), ": compute ", num("%.1f", s.stage_compute * 1e3),
           ", TP ", num("%.1f", s.stage_tp_comm * 1e3), " (", s.tp_link, "), CP ",
           num("%.1f", s.stage_cp_comm * 1e3), ", EP ", num("%.1f", s.stage_ep_comm * 1e3)));
  o += "\nthroughput\n";
  line("tokens/s", num("%.0f", s.tokens_per_s));
  line("TFLOP/s per GPU (model)", num("%.1f", s.tflops_per_gpu));
  line("TFLOP/s per GPU (hw)", num("%.1f", s.hw_tflops_per_gpu));
  line("MFU", num("%.1f%%", s.mfu * 100));
  o += "\nreliability\n";
  line("cluster MTBF", num("%.2f h", r.cluster_mtbf_hours));
  line("interruptions per day", num("%.2f", r.interruptions_per_day));
  line("checkpoint save", cat(num("%.1f s", r.checkpoint_save_s), " (",
                              num("%.0f GB", gb(checkpoint_bytes(m, t))), ")"));
  line("interval Young / Daly",
       cat(num("%.1f", r.young_interval_s / 60), " / ", num("%.1f min", r.daly_interval_s / 60)));
  line("restart (detect, relaunch, reload)",
       cat(num("%.1f min", p.restart_minutes), " (", p.restart_source, ")"));
  line("expected goodput", num("%.1f%%", r.goodput * 100));
  line("wasted GPU-hours/day", num("%.0f", r.wasted_gpu_hours_per_day));
  return o;
}

}  // namespace loom::plan
