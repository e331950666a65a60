// read_plan_input: the trainer's TOML ([model] [parallel] [precision] [train], read by the
// trainer's own readers so a key means the same to both) plus the planner's additions
// ([cluster] and [plan]).
#include <string>
#include <vector>

#include "comm/process_groups.h"
#include "core/error.h"
#include "model/model_config.h"
#include "parallel/data_parallel.h"
#include "plan/plan.h"
#include "precision/fp8_recipes.h"
#include "precision/policy.h"

namespace loom::plan {

namespace {

// Keys of the planner's former dialect and what replaced them: a file that still uses one is
// refused naming its replacement, never read with a guessed meaning.
struct Renamed {
  const char* old_key;
  const char* new_key;
};
constexpr Renamed kRenamed[] = {
    {"model.name", "model.preset (the name shown is the preset's, or \"custom\")"},
    {"model.layers", "model.n_layer"},
    {"model.hidden", "model.d_model"},
    {"model.heads", "model.n_head"},
    {"model.kv_heads", "model.n_kv_head"},
    {"model.ffn", "model.d_ff"},
    {"model.seq", "train.seq_len"},
    {"model.experts", "model.n_experts"},
    {"model.tied_embeddings", "model.tied"},
    {"model.gated_mlp", "plan.gated_mlp"},
    {"model.learned_positions", "plan.learned_positions"},
    {"model.dropout", "plan.dropout"},
    {"train.global_batch",
     "plan.global_batch, or train.grad_accum (global batch = micro_batch x grad_accum x dp)"},
    {"train.precision",
     "precision.policy (fp8: precision.policy = \"bf16\" with precision.fp8_recipe)"},
    {"train.fp8_recipe", "precision.fp8_recipe"},
    {"train.optimizer", "plan.optimizer"},
    {"train.zero_stage", "parallel.zero"},
    {"train.tp", "parallel.tp"},
    {"train.pp", "parallel.pp"},
    {"train.vp", "parallel.vp"},
    {"train.cp", "parallel.cp"},
    {"train.ep", "parallel.ep"},
    {"train.dp", "parallel.dp"},
    {"train.sequence_parallel", "parallel.sp"},
    {"train.overlap_grad_reduce", "parallel.overlap_grad_reduce"},
    {"train.overlap_param_gather", "plan.overlap_param_gather"},
    {"train.tp_comm_overlap", "plan.tp_comm_overlap"},
    {"train.flash_attention", "plan.flash_attention"},
    {"train.grad_fp32", "plan.grad_fp32"},
    {"train.pipeline_embedding_as_layer", "plan.pipeline_embedding_as_layer"},
    {"train.causal_flops", "plan.causal_flops"},
};

// Trainer keys that do not change a prediction: accepted so that a training config plans
// unchanged (`loom train` checks their values).
constexpr const char* kTrainKeysIgnored[] = {
    "train.steps",         "train.seed",          "train.threads",    "train.log_interval",
    "train.eval_interval", "train.eval_batches",  "train.out_dir",    "train.checkpoint_interval",
    "train.keep_last",     "train.resume",        "train.ckpt_async", "train.ckpt_timeout",
    "train.init_from",     "train.pretrained",    "train.clip_grad",  "train.peak_gflops",
    "train.quiet",         "train.tensorboard",   "train.freeze",     "train.max_bad_steps",
    "train.device",        "train.max_rollbacks", "train.on_spike",   "train.spike_threshold",
    "train.spike_window",  "parallel.device_comm"};
// Whole trainer sections that do not change a prediction.
constexpr const char* kSectionsIgnored[] = {"data.", "optim."};

// Every key read, by section, for the message naming the valid keys of a misspelt one.
const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> k = {
        "model.preset", "model.family", "model.n_layer", "model.d_model", "model.n_head",
        "model.n_kv_head", "model.head_dim", "model.d_ff", "model.vocab", "model.max_seq",
        "model.tied", "model.bias", "model.n_experts", "model.top_k", "model.moe_layer_freq",
        "model.norm_eps", "model.rope_theta", "model.rope_scaling", "model.rope_factor",
        "model.rope_low_freq_factor", "model.rope_high_freq_factor", "model.rope_original_max_seq",
        "model.init_std", "model.moe_router", "model.capacity_factor", "model.aux_loss_coeff",
        // [parallel]
        "parallel.tp", "parallel.pp", "parallel.vp", "parallel.cp", "parallel.ep", "parallel.dp",
        "parallel.sp", "parallel.zero", "parallel.overlap_grad_reduce", "parallel.bucket_mb",
        "parallel.grad_reduce_dtype", "parallel.pp_schedule", "parallel.etp",
        "parallel.pp_first_stage_layers", "parallel.pp_last_stage_layers",
        // [precision]
        "precision.policy", "precision.fp8_recipe", "precision.fp8_format", "precision.fp8_margin",
        "precision.fp8_amax_history", "precision.fp8_amax_compute", "precision.fp8_keep_first",
        "precision.fp8_keep_last", "precision.initial_loss_scale", "precision.loss_scale_window",
        "precision.min_loss_scale",
        // [train]
        "train.micro_batch", "train.grad_accum", "train.seq_len", "train.recompute", "train.mode",
        // [plan]: the planner's additions
        "plan.global_batch", "plan.optimizer", "plan.gated_mlp", "plan.learned_positions",
        "plan.dropout", "plan.overlap_param_gather", "plan.tp_comm_overlap", "plan.flash_attention",
        "plan.grad_fp32", "plan.pipeline_embedding_as_layer", "plan.causal_flops",
        // [cluster]
        "cluster.preset", "cluster.gpu", "cluster.name", "cluster.gpus_per_node", "cluster.nodes",
        "cluster.intra_bw_gbs", "cluster.intra_lat_us", "cluster.inter_bw_gbs",
        "cluster.inter_lat_us", "cluster.gpu_mtbf_hours", "cluster.ckpt_write_gbs",
        "cluster.restart_minutes", "cluster.peak_bf16_tflops", "cluster.peak_fp8_tflops",
        "cluster.hbm_gb", "cluster.hbm_bw_gbs", "cluster.gemm_eff_bf16", "cluster.gemm_eff_fp8",
        "cluster.peak_fp32_tflops", "cluster.gemm_dim0", "cluster.cache_mb", "cluster.cache_bw_gbs",
        "cluster.link_eff", "cluster.reduce_bw_gbs", "cluster.reduce_scatter_bw_gbs",
        "cluster.comm_overlaps_compute"};
    k.insert(k.end(), std::begin(kTrainKeysIgnored), std::end(kTrainKeysIgnored));
    return k;
  }();
  return keys;
}

bool starts_with(const std::string& s, const std::string& prefix) {
  return s.rfind(prefix, 0) == 0;
}

void refuse_former_keys(const Config& cfg) {
  for (const std::string& k : cfg.keys())
    for (const Renamed& r : kRenamed)
      if (k == r.old_key)
        fail(cfg.where(k), ": '", k, "' is no longer read: the planner reads the trainer's keys; ",
             "use ", r.new_key, " (docs/plan.md)");
}

bool is_planner_preset(const std::string& name) {
  for (const std::string& n : loom::model_preset_names())
    if (n == name) return false;  // the trainer's preset of that name is the model
  for (const std::string& n : model_preset_names())
    if (n == name) return true;
  return false;
}

// The trainer's shape of a planner preset, plus the features its two families cannot say
// (a SwiGLU model without RoPE, a GeLU one without learned positions, dropout).
struct PresetShape {
  ModelConfig config;
  ModelSpec spec;
};
PresetShape planner_preset(const std::string& name) {
  PresetShape s;
  s.spec = model_preset(name);
  ModelConfig& c = s.config;
  const ModelSpec& m = s.spec;
  c.name = m.name;
  c.family = m.gated_mlp ? Family::Llama : Family::GPT2;
  c.n_layer = int(m.layers);
  c.d_model = int(m.hidden);
  c.n_head = int(m.heads);
  c.n_kv_head = int(m.kv());
  c.head_dim = int(m.hd());
  c.d_ff = int(m.ffn);
  c.vocab = int(m.vocab);
  c.max_seq = int(m.seq);
  c.tied = m.tied_embeddings;
  c.bias = m.bias;
  c.n_experts = m.moe() ? int(m.experts) : 0;
  if (m.moe()) c.top_k = int(m.top_k);
  return s;
}

ModelSpec read_model(const Config& cfg) {
  const std::string preset = cfg.get_string("model.preset", "tiny");
  ModelSpec m;
  ModelConfig c;
  int64_t default_seq = 128;  // train.seq_len's default in the trainer (TrainOptions)
  const bool planner_shape = is_planner_preset(preset);
  if (planner_shape) {
    PresetShape s = planner_preset(preset);
    c = model_config_from(cfg, s.config);
    m = s.spec;
    default_seq = s.spec.seq;
  } else {
    c = model_config_from(cfg, loom::model_preset(preset));
    bool shape_given = false;  // a shape spelled out over the default preset is "custom"
    for (const std::string& k : cfg.keys()) shape_given = shape_given || starts_with(k, "model.");
    m.name = cfg.has("model.preset") || !shape_given ? c.name : "custom";
    m.dropout = false;  // Loom's decoder has no dropout
  }
  LOOM_CHECK(!c.is_moe() || c.moe_layer_freq == 1, "model.moe_layer_freq = ", c.moe_layer_freq,
             ": the planner models a MoE layer in every layer (set 1)");
  m.layers = c.n_layer;
  m.hidden = c.d_model;
  m.heads = c.n_head;
  m.kv_heads = c.n_kv_head;
  m.head_dim = c.head_dim;
  m.ffn = c.d_ff;
  m.vocab = c.vocab;
  m.positions = c.max_seq;
  m.experts = c.n_experts;
  m.top_k = c.is_moe() ? c.top_k : 1;
  m.tied_embeddings = c.tied;
  m.bias = c.bias;
  if (!planner_shape || cfg.has("model.family")) {  // what the family implies
    m.gated_mlp = c.family == Family::Llama;
    m.learned_positions = c.uses_positions_table();
  }
  m.gated_mlp = cfg.get_bool("plan.gated_mlp", m.gated_mlp);
  m.learned_positions = cfg.get_bool("plan.learned_positions", m.learned_positions);
  m.dropout = cfg.get_bool("plan.dropout", m.dropout);
  m.seq = cfg.get_int("train.seq_len", default_seq);
  LOOM_CHECK(m.seq <= c.max_seq, "train.seq_len (", m.seq, ") exceeds model.max_seq (", c.max_seq,
             ")");
  return m;
}

void read_cluster(const Config& cfg, ClusterSpec& c) {
  bool any = false;
  for (const std::string& k : cfg.keys()) any = any || starts_with(k, "cluster.");
  // A training config names no cluster: one DGX H100 node (the command line says so).
  std::string cpreset = cfg.get_string("cluster.preset", any ? "" : "dgx-h100");
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
  c.gpus_per_node = cfg.get_int("cluster.gpus_per_node", c.gpus_per_node);
  c.nodes = cfg.get_int("cluster.nodes", c.nodes);
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
}

// [parallel], [precision] and [train] through the trainer's readers, then [plan].
void read_train(const Config& cfg, const ModelSpec& m, TrainSpec& t) {
  const comm::ParallelDims d = comm::ParallelDims::from(cfg);
  t.tp = d.tp;
  t.pp = d.pp;
  t.cp = d.cp;
  t.ep = d.ep;
  t.dp = d.dp;
  t.vp = cfg.get_int("parallel.vp", 1);
  const std::string schedule = cfg.get_string("parallel.pp_schedule", "");
  LOOM_CHECK(schedule.empty() || schedule == "1f1b" || schedule == "interleaved",
             "parallel.pp_schedule = \"", schedule, "\" (", cfg.where("parallel.pp_schedule"),
             "): the planner models 1f1b and interleaved (parallel.vp > 1)");
  for (const char* k : {"parallel.pp_first_stage_layers", "parallel.pp_last_stage_layers"})
    LOOM_CHECK(cfg.get_int(k, -1) == -1, k, " (", cfg.where(k),
               "): the planner splits layers evenly over pipeline stages (leave it unset)");
  LOOM_CHECK(cfg.get_int("parallel.etp", 1) == 1, "parallel.etp (", cfg.where("parallel.etp"),
             "): the planner does not model expert tensor parallelism (leave it 1)");
  t.sequence_parallel = cfg.get_bool("parallel.sp", false);
  const parallel::DataParallelOptions dpo = parallel::DataParallelOptions::from(cfg);
  t.zero_stage = dpo.zero;
  t.overlap_grad_reduce = dpo.overlap;

  const PrecisionPolicy policy = precision_from_name(cfg.get_string("precision.policy", "fp32"));
  if (policy.loss_scaling) LossScaler::options_from(cfg);  // read (and checked) as the trainer does
  t.precision = parse_precision(policy.name);
  if (Fp8Options fp8; Fp8Options::from(cfg, int(m.layers), &fp8)) {
    t.precision = Precision::fp8;
    t.fp8_recipe = parse_fp8_recipe(fp8_recipe_name(fp8.kind));
  }

  t.micro_batch = cfg.get_int("train.micro_batch", 8);  // the trainer's defaults (TrainOptions)
  t.grad_accum = cfg.get_int("train.grad_accum", 1);
  t.recompute = recompute_from_name(cfg.get_string("train.recompute", "none"));
  const std::string mode = cfg.get_string("train.mode", "pretrain");
  LOOM_CHECK(mode == "pretrain" || mode == "sft", "train.mode = \"", mode, "\" (",
             cfg.where("train.mode"),
             "): the planner models the pretrain and sft step (not DPO's reference model)");

  LOOM_CHECK(!cfg.has("plan.global_batch") || !cfg.has("train.grad_accum"), "plan.global_batch (",
             cfg.where("plan.global_batch"), ") and train.grad_accum (",
             cfg.where("train.grad_accum"),
             ") are both set: give one (global batch = micro_batch x grad_accum x dp)");
  t.global_batch = cfg.get_int("plan.global_batch", 0);
  LOOM_CHECK(!cfg.has("plan.global_batch") || t.global_batch >= 1, cfg.where("plan.global_batch"),
             ": plan.global_batch must be positive, got ", t.global_batch);
  t.optimizer = parse_optimizer(cfg.get_string("plan.optimizer", name(t.optimizer)));
  t.overlap_param_gather = cfg.get_bool("plan.overlap_param_gather", t.overlap_param_gather);
  t.tp_comm_overlap = cfg.get_bool("plan.tp_comm_overlap", t.tp_comm_overlap);
  t.flash_attention = cfg.get_bool("plan.flash_attention", t.flash_attention);
  t.grad_fp32 = cfg.get_bool("plan.grad_fp32", t.grad_fp32);
  t.pipeline_embedding_as_layer =
      cfg.get_bool("plan.pipeline_embedding_as_layer", t.pipeline_embedding_as_layer);
  t.causal_flops = cfg.get_bool("plan.causal_flops", t.causal_flops);
}

void check_all_read(const Config& cfg) {
  for (const std::string& k : cfg.keys()) {
    bool ignored = false;
    for (const char* s : kSectionsIgnored) ignored = ignored || starts_with(k, s);
    for (const char* i : kTrainKeysIgnored) ignored = ignored || k == i;
    if (ignored) cfg.get_string(k, "");
  }
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
      if (starts_with(k, section + ".")) valid += (valid.empty() ? "" : ", ") + k;
    fail(msg, valid.empty() ? " (sections: [model], [parallel], [precision], [train], [data], "
                              "[optim], [plan], [cluster])"
                            : cat(" (valid keys: ", valid, ")"));
  }
}

}  // namespace

PlanInput read_plan_input(const Config& cfg) {
  refuse_former_keys(cfg);
  PlanInput in;
  in.model = read_model(cfg);
  read_cluster(cfg, in.cluster);
  read_train(cfg, in.model, in.train);
  check_all_read(cfg);
  return in;
}

}  // namespace loom::plan
