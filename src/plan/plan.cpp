#include "plan/plan.h"

#include <cstdio>
#include <vector>

#include "core/error.h"

namespace loom::plan {

namespace {

int64_t get_int(const Config& c, const std::string& key, int64_t def) {
  return c.get_int(key, def);
}

const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = {"model.preset",
                                                "model.name",
                                                "model.layers",
                                                "model.hidden",
                                                "model.heads",
                                                "model.kv_heads",
                                                "model.head_dim",
                                                "model.ffn",
                                                "model.vocab",
                                                "model.seq",
                                                "model.experts",
                                                "model.top_k",
                                                "model.gated_mlp",
                                                "model.tied_embeddings",
                                                "model.bias",
                                                "model.learned_positions",
                                                "model.dropout",
                                                "cluster.preset",
                                                "cluster.gpu",
                                                "cluster.name",
                                                "cluster.gpus_per_node",
                                                "cluster.nodes",
                                                "cluster.intra_bw_gbs",
                                                "cluster.intra_lat_us",
                                                "cluster.inter_bw_gbs",
                                                "cluster.inter_lat_us",
                                                "cluster.gpu_mtbf_hours",
                                                "cluster.ckpt_write_gbs",
                                                "cluster.restart_minutes",
                                                "cluster.peak_bf16_tflops",
                                                "cluster.peak_fp8_tflops",
                                                "cluster.hbm_gb",
                                                "cluster.hbm_bw_gbs",
                                                "cluster.gemm_eff_bf16",
                                                "cluster.gemm_eff_fp8",
                                                "cluster.peak_fp32_tflops",
                                                "cluster.gemm_dim0",
                                                "cluster.cache_mb",
                                                "cluster.cache_bw_gbs",
                                                "cluster.link_eff",
                                                "cluster.reduce_bw_gbs",
                                                "cluster.reduce_scatter_bw_gbs",
                                                "cluster.comm_overlaps_compute",
                                                "train.global_batch",
                                                "train.micro_batch",
                                                "train.precision",
                                                "train.fp8_recipe",
                                                "train.optimizer",
                                                "train.zero_stage",
                                                "train.recompute",
                                                "train.tp",
                                                "train.pp",
                                                "train.vp",
                                                "train.cp",
                                                "train.ep",
                                                "train.dp",
                                                "train.sequence_parallel",
                                                "train.overlap_grad_reduce",
                                                "train.overlap_param_gather",
                                                "train.tp_comm_overlap",
                                                "train.flash_attention",
                                                "train.grad_fp32",
                                                "train.pipeline_embedding_as_layer",
                                                "train.causal_flops"};
  return keys;
}

}  // namespace

PlanInput read_plan_input(const Config& cfg) {
  PlanInput in;
  // Model: a preset, or every shape field spelled out.
  ModelSpec& m = in.model;
  std::string preset = cfg.get_string("model.preset", "");
  if (!preset.empty()) {
    m = model_preset(preset);
  } else {
    m.name = cfg.get_string("model.name", "custom");
    LOOM_CHECK(cfg.has("model.layers") || cfg.has("model.hidden"),
               "no model given: use --model NAME (see --list), model.preset in a [model] "
               "section, or the full shape (model.layers, hidden, heads, ffn, vocab, seq)");
    for (const char* f : {"layers", "hidden", "heads", "ffn", "vocab", "seq"})
      LOOM_CHECK(cfg.has(cat("model.", f)), "missing field 'model.", f,
                 "' (give model.preset = one of the presets, or all of model.layers, "
                 "model.hidden, model.heads, model.ffn, model.vocab, model.seq)");
  }
  m.layers = get_int(cfg, "model.layers", m.layers);
  m.hidden = get_int(cfg, "model.hidden", m.hidden);
  m.heads = get_int(cfg, "model.heads", m.heads);
  m.kv_heads = get_int(cfg, "model.kv_heads", m.kv_heads);
  m.head_dim = get_int(cfg, "model.head_dim", m.head_dim);
  m.ffn = get_int(cfg, "model.ffn", m.ffn);
  m.vocab = get_int(cfg, "model.vocab", m.vocab);
  m.seq = get_int(cfg, "model.seq", m.seq);
  m.experts = get_int(cfg, "model.experts", m.experts);
  m.top_k = get_int(cfg, "model.top_k", m.top_k);
  m.gated_mlp = cfg.get_bool("model.gated_mlp", m.gated_mlp);
  m.tied_embeddings = cfg.get_bool("model.tied_embeddings", m.tied_embeddings);
  m.bias = cfg.get_bool("model.bias", m.bias);
  m.learned_positions = cfg.get_bool("model.learned_positions", m.learned_positions);
  m.dropout = cfg.get_bool("model.dropout", m.dropout);

  // Cluster: a preset (DGX-style nodes) or a GPU plus link figures.
  ClusterSpec& c = in.cluster;
  std::string cpreset = cfg.get_string("cluster.preset", "");
  if (!cpreset.empty()) c = cluster_preset(cpreset);
  std::string gpu = cfg.get_string("cluster.gpu", "");
  // "custom": no datasheet; every figure comes from the file (e.g. a measured CPU node written
  // by bench/plan_calibrate.sh), and validate() names any that is missing.
  if (gpu == "custom") {
    c.gpu = GpuSpec{};
    c.gpu.name = "custom";
  } else if (!gpu.empty()) {
    c.gpu = gpu_preset(gpu);
  }
  LOOM_CHECK(!cpreset.empty() || !gpu.empty(),
             "missing field 'cluster.preset' (one of dgx-a100, dgx-h100, dgx-h200, dgx-b200) or "
             "'cluster.gpu' (a100, a100-40gb, h100, h200, b200) with cluster link figures");
  if (cpreset.empty()) c.name = "custom-" + c.gpu.name;
  c.name = cfg.get_string("cluster.name", c.name);
  c.gpus_per_node = get_int(cfg, "cluster.gpus_per_node", c.gpus_per_node);
  c.nodes = get_int(cfg, "cluster.nodes", c.nodes);
  c.intra_bw_gbs = cfg.get_double("cluster.intra_bw_gbs", c.intra_bw_gbs);
  c.intra_lat_us = cfg.get_double("cluster.intra_lat_us", c.intra_lat_us);
  c.inter_bw_gbs = cfg.get_double("cluster.inter_bw_gbs", c.inter_bw_gbs);
  c.inter_lat_us = cfg.get_double("cluster.inter_lat_us", c.inter_lat_us);
  c.gpu_mtbf_hours = cfg.get_double("cluster.gpu_mtbf_hours", c.gpu_mtbf_hours);
  c.ckpt_write_gbs = cfg.get_double("cluster.ckpt_write_gbs", c.ckpt_write_gbs);
  c.restart_minutes = cfg.get_double("cluster.restart_minutes", c.restart_minutes);
  c.gpu.peak_bf16_tflops = cfg.get_double("cluster.peak_bf16_tflops", c.gpu.peak_bf16_tflops);
  c.gpu.peak_fp8_tflops = cfg.get_double("cluster.peak_fp8_tflops", c.gpu.peak_fp8_tflops);
  c.gpu.hbm_gb = cfg.get_double("cluster.hbm_gb", c.gpu.hbm_gb);
  c.gpu.hbm_bw_gbs = cfg.get_double("cluster.hbm_bw_gbs", c.gpu.hbm_bw_gbs);
  c.gpu.gemm_eff_bf16 = cfg.get_double("cluster.gemm_eff_bf16", c.gpu.gemm_eff_bf16);
  c.gpu.gemm_eff_fp8 = cfg.get_double("cluster.gemm_eff_fp8", c.gpu.gemm_eff_fp8);
  c.gpu.peak_fp32_tflops = cfg.get_double("cluster.peak_fp32_tflops", c.gpu.peak_fp32_tflops);
  c.gpu.gemm_dim0 = cfg.get_double("cluster.gemm_dim0", c.gpu.gemm_dim0);
  c.gpu.cache_mb = cfg.get_double("cluster.cache_mb", c.gpu.cache_mb);
  c.gpu.cache_bw_gbs = cfg.get_double("cluster.cache_bw_gbs", c.gpu.cache_bw_gbs);
  c.link_eff = cfg.get_double("cluster.link_eff", c.link_eff);
  c.reduce_bw_gbs = cfg.get_double("cluster.reduce_bw_gbs", c.reduce_bw_gbs);
  c.reduce_scatter_bw_gbs =
      cfg.get_double("cluster.reduce_scatter_bw_gbs", c.reduce_scatter_bw_gbs);
  c.comm_overlaps_compute = cfg.get_bool("cluster.comm_overlaps_compute", c.comm_overlaps_compute);

  TrainSpec& t = in.train;
  LOOM_CHECK(cfg.has("train.global_batch"),
             "missing field 'train.global_batch' (sequences per optimizer step)");
  t.global_batch = get_int(cfg, "train.global_batch", 0);
  t.micro_batch = get_int(cfg, "train.micro_batch", t.micro_batch);
  t.precision = parse_precision(cfg.get_string("train.precision", name(t.precision)));
  t.fp8_recipe = parse_fp8_recipe(cfg.get_string("train.fp8_recipe", name(t.fp8_recipe)));
  LOOM_CHECK(t.precision == Precision::fp8 || !cfg.has("train.fp8_recipe"),
             "train.fp8_recipe is set but train.precision is ", name(t.precision), ", not fp8");
  t.optimizer = parse_optimizer(cfg.get_string("train.optimizer", name(t.optimizer)));
  t.zero_stage = int(get_int(cfg, "train.zero_stage", t.zero_stage));
  t.recompute = parse_recompute(cfg.get_string("train.recompute", name(t.recompute)));
  t.tp = get_int(cfg, "train.tp", t.tp);
  t.pp = get_int(cfg, "train.pp", t.pp);
  t.vp = get_int(cfg, "train.vp", t.vp);
  t.cp = get_int(cfg, "train.cp", t.cp);
  t.ep = get_int(cfg, "train.ep", t.ep);
  t.dp = get_int(cfg, "train.dp", t.dp);
  t.sequence_parallel = cfg.get_bool("train.sequence_parallel", t.sequence_parallel);
  t.overlap_grad_reduce = cfg.get_bool("train.overlap_grad_reduce", t.overlap_grad_reduce);
  t.overlap_param_gather = cfg.get_bool("train.overlap_param_gather", t.overlap_param_gather);
  t.tp_comm_overlap = cfg.get_bool("train.tp_comm_overlap", t.tp_comm_overlap);
  t.flash_attention = cfg.get_bool("train.flash_attention", t.flash_attention);
  t.grad_fp32 = cfg.get_bool("train.grad_fp32", t.grad_fp32);
  t.pipeline_embedding_as_layer =
      cfg.get_bool("train.pipeline_embedding_as_layer", t.pipeline_embedding_as_layer);
  t.causal_flops = cfg.get_bool("train.causal_flops", t.causal_flops);
  try {
    cfg.check_all_used();
  } catch (const Error& e) {
    // Name every valid key of the section, not only the ones this file happened to set.
    std::string msg = e.what();
    msg = msg.substr(0, msg.find(" (keys read"));
    size_t q = msg.find("unknown config key '");
    std::string key = q == std::string::npos ? "" : msg.substr(q + 20);
    std::string section = key.substr(0, key.find('.'));
    std::string valid;
    for (const std::string& k : known_keys())
      if (k.rfind(section + ".", 0) == 0) valid += (valid.empty() ? "" : ", ") + k;
    fail(msg, valid.empty() ? " (sections: [model], [cluster], [train])"
                            : cat(" (valid keys: ", valid, ")"));
  }
  return in;
}

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
             " mbs=", t.micro_batch, " recompute=", name(t.recompute), " zero=", t.zero_stage,
             t.sequence_parallel ? " sp" : "");
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
                        {"recompute", name(t.recompute)},
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
