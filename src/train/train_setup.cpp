#include "train/train_setup.h"

#include <algorithm>
#include <optional>

#include "core/config_int32.h"
#include "core/error.h"
#include "core/log.h"
#include "parallel/ring_attention.h"
#include "parallel/schedule/pipeline_schedule.h"
#include "parallel/schedule/stage_layers.h"
#include "parallel/tensor_parallel.h"
#include "train/checkpointer.h"
#include "train/dpo.h"
#include "train/frozen_reference.h"

namespace loom {
namespace {

// Freezes every parameter whose name starts with one of the comma-separated prefixes; each
// prefix must name at least one. Returns how many were frozen.
int freeze_by_prefixes(ParamSet& P, const std::string& list) {
  int frozen = 0;
  for (size_t pos = 0; pos <= list.size();) {
    size_t end = list.find(',', pos);
    if (end == std::string::npos) end = list.size();
    std::string prefix = list.substr(pos, end - pos);
    pos = end + 1;
    prefix.erase(0, prefix.find_first_not_of(' '));
    prefix.erase(prefix.find_last_not_of(' ') + 1);
    if (prefix.empty()) continue;
    int hit = 0;
    for (const ParamInfo& p : P.infos())
      if (p.name.rfind(prefix, 0) == 0) {
        P.set_trainable(p.name, false);
        ++hit;
      }
    LOOM_CHECK(hit > 0, "train.freeze: '", prefix, "' names no parameter (names look like ",
               "embed.wte, blocks.0.attn.qkv.weight, final_norm.weight)");
    frozen += hit;
  }
  return frozen;
}

// What the trainer's step keeps off a device so far, refused up front with the reason (before
// the model allocates or anything is written). Every layout (DP with ZeRO 0-3, TP with SP, PP
// with virtual stages, CP, EP, MoE; bf16 gradient reduction, LoRA and DPO) trains on the device:
// each group that moves device memory has its device communicator (on_device: NCCL, or staged
// through the host), and the layers' parallel parts (vocabulary-parallel cross-entropy,
// pipeline activations, the CP ring, the EP exchange) run on Backend buffers and ops. fp8 runs
// on every layout the CPU recipe does: its amaxes are max-reduced over the CPU recipe's groups
// (TP x DP x CP of the pipeline stage for delayed scaling, TP for current scaling) on device
// communicators; a pipeline stage's recipe holds its own layers' state; expert MLPs take no
// recipe on either path (Decoder::linears() lists none), so under EP only the replicated
// attention and dense layers are fp8 (docs/gpu.md, "fp8 in the GPU trainer").
void refuse_fp8_off_device(const Fp8Options& fp8, const TrainSetup& s, int world_size, int cp) {
  const std::string on =
      cat("train.device = \"", s.opt.device, "\" (the ", s.be->name(), " backend): ");
  check_device_fp8(fp8, device_fp8_target(*s.be, world_size, largest_forward_tokens(s.opt), cp),
                   on);
}

}  // namespace

// The device fp8 recipe's scratch is sized for it, so no forward outgrows it mid-run.
int largest_forward_tokens(const TrainOptions& o) {
  return o.micro_batch * o.seq_len * (o.mode == "dpo" || o.mode == "reward" ? 2 : 1);
}

TrainSetup::~TrainSetup() {
  // The reference's shards gather over a device communicator on a device (device_comms), which
  // is declared after them: they go first.
  reference.shards.reset();
}

comm::Communicator& TrainSetup::on_device(comm::Communicator& host, DeviceComm kind) {
  if (be->host_accessible()) return host;
  auto& c = device_comms[&host];
  if (!c) c = make_device_communicator(host, *be, kind == DeviceComm::Auto ? device_comm : kind);
  return *c;
}

ParamSet& TrainSetup::trained_params() {
  return lora ? lora->params() : model->params();
}

const ParamSet& TrainSetup::trained_params() const {
  return lora ? lora->params() : model->params();
}

comm::Communicator& TrainSetup::grad_group() const {
  return pg->cp().size() > 1 ? pg->dp_cp() : pg->dp();
}

std::string TrainSetup::layout_name() const {
  const auto& d = pg->generator().dims();
  return cat("tp=", d.tp, " sp=", model->tensor_parallel().sequence_parallel, " cp=", d.cp,
             " dp=", d.dp, " pp=", d.pp, " zero=", dp->zero(),
             d.ep > 1 ? cat(" ep=", d.ep) : std::string(), pp_layout);
}

std::string TrainSetup::checkpoint_root() const {
  if (whole) return opt.out_dir + "/checkpoints";
  return opt.out_dir + "/checkpoints/" + ckpt::rank_dir_name(rank);
}

uint64_t TrainSetup::global_micro(int64_t step, size_t j) const {
  const int64_t dp_size = pg->dp().size(), dp_rank = pg->dp().rank();
  return uint64_t((step * opt.grad_accum + int64_t(j)) * dp_size + dp_rank);
}

std::unique_ptr<TrainSetup> assemble(const Config& cfg, comm::Communicator* world,
                                     Backend* backend) {
  auto owned = std::make_unique<TrainSetup>();
  TrainSetup& s = *owned;
  s.opt = train_options_from(cfg);
  // The device first: "cuda" without a CUDA build or a GPU fails here, before anything is read
  // or written. A backend handed in (tests) wins over train.device, GEMM math included.
  if (backend) {
    s.be = backend;
    s.device = backend->name();
  } else {
    const DeviceChoice dc = select_device(s.opt.device, "train.device", s.opt.quiet);
    s.be = dc.backend;
    s.device = dc.describe;
  }

  s.staging = std::make_unique<HostStaging>(*s.be);
  set_num_threads(s.opt.threads);
  s.model_cfg = model_config_from(cfg);
  LOOM_CHECK(s.opt.seq_len <= s.model_cfg.max_seq, "train.seq_len (", s.opt.seq_len,
             ") exceeds model.max_seq (", s.model_cfg.max_seq, ")");
  s.policy = precision_from_name(cfg.get_string("precision.policy", "fp32"));
  LossScaler scaler;  // fp16
  if (s.policy.loss_scaling) scaler = LossScaler(LossScaler::options_from(cfg));
  if (!backend) {
    // (A backend handed in keeps the math its owner chose.) A GPU's GEMMs: TF32 under fp32; under
    // bf16 / fp16 the tensor cores of that type (fp32 accumulation), as the CPU's oneDNN bf16
    // GEMMs: the weights and stored activations are such values already, gradients are rounded to
    // it for the product.
    const std::string math = set_gemm_math(
        *s.be, s.policy.compute == DType::F32 ? "tf32" : dtype_name(s.policy.compute));
    if (!math.empty()) s.device += cat(", ", math, " GEMMs");
  }
  s.sched = lr_schedule_from(cfg, s.opt.steps);

  AdamWConfig acfg = adamw_config_from(cfg);
  comm::ParallelDims dims = comm::ParallelDims::from(cfg);
  parallel::DataParallelOptions dp_opt = parallel::DataParallelOptions::from(cfg);
  const bool sequence_parallel = cfg.get_bool("parallel.sp", false);
  // Expert tensor parallelism: the experts' MLPs split over etp ranks of the TP group.
  const int etp = s.etp = get_int32(cfg, "parallel.etp", 1);
  // Pipeline: virtual stages per rank, schedule, and the first/last stage's layer counts
  // (-1 = even split).
  const int vp = get_int32(cfg, "parallel.vp", 1);
  const pp::ScheduleKind pp_kind = pp::parse_schedule_kind(
      cfg.get_string("parallel.pp_schedule", vp > 1 ? "interleaved" : "1f1b"));
  const int pp_first = get_int32(cfg, "parallel.pp_first_stage_layers", -1);
  const int pp_last = get_int32(cfg, "parallel.pp_last_stage_layers", -1);
  s.device_comm =
      device_comm_from_name(cfg.get_string("parallel.device_comm", "auto"), "parallel.device_comm");
  {  // before anything is allocated
    Fp8Options fp8_probe;
    const bool fp8 = Fp8Options::from(cfg, s.model_cfg.n_layer, &fp8_probe);
    // ZeRO-3 keeps no layer's whole weight between uses; the CPU recipe keeps fp8 copies of
    // them, and the GPU recipe, which quantises the gathered weights on every call, has not
    // been proven against the CPU trainer under ZeRO-3 (which has no fp8 run to compare with).
    // (LoRA at ZeRO-3 shards the frozen base the same way.)
    LOOM_CHECK(!fp8 || dp_opt.zero < 3, "precision.fp8_recipe = \"",
               fp8_recipe_name(fp8_probe.kind),
               "\" is not supported with parallel.zero = 3 (the fp8 recipes need each layer's ",
               "whole weight at hand); use parallel.zero = 0, 1 or 2, or leave ",
               "precision.fp8_recipe unset");
    if (!s.be->host_accessible())
      if (fp8)
        refuse_fp8_off_device(fp8_probe, s, (world ? *world : comm::world()).size(), dims.cp);
  }

  // One engine for every layout: a one-process run is data parallelism over a world of one
  // rank, whose groups are self communicators (every collective a copy or nothing).
  comm::Communicator& w = world ? *world : comm::world();
  s.pg = std::make_unique<comm::ProcessGroups>(w, dims);
  const auto& d = s.pg->generator().dims();
  // What is laid out over ranks only decides the checkpoint files: one rank holding every whole
  // tensor writes and reads the one-process layout (the one every tool reads); anything else
  // one part per rank.
  s.whole = w.size() == 1 && dp_opt.zero == 0 && vp == 1;
  LOOM_CHECK(d.cp == 1 || s.opt.seq_len % (2 * d.cp) == 0, "train.seq_len = ", s.opt.seq_len,
             " is not divisible by 2*cp = ", 2 * d.cp,
             " (context parallelism cuts every sequence into 2*cp chunks); use a multiple of ",
             2 * d.cp);
  LOOM_CHECK(vp >= 1, "parallel.vp must be positive, got ", vp);
  LOOM_CHECK(vp == 1 || pp_kind == pp::ScheduleKind::Interleaved, "parallel.vp = ", vp,
             " needs parallel.pp_schedule = \"interleaved\", got \"",
             pp::schedule_kind_name(pp_kind), "\"");
  PipelineStage stage;  // the whole model unless parallel.pp > 1
  pp::StageLayout layout;
  if (d.pp > 1 || vp > 1) {
    layout = pp::assign_layers(s.model_cfg.n_layer, d.pp, vp, pp_first, pp_last);
    stage = parallel::pipeline_stage_of(layout, s.pg->pp().rank());
    std::string split;
    for (const auto& r : layout.stages) split += cat(split.empty() ? "" : ",", r.size());
    s.pp_layout = cat(" vp=", vp, " stages=", split);
  } else {
    LOOM_CHECK(pp_first < 0 && pp_last < 0,
               "parallel.pp_first_stage_layers / pp_last_stage_layers need parallel.pp > 1");
  }
  LOOM_CHECK(!sequence_parallel || d.tp > 1, "parallel.sp needs parallel.tp > 1");
  s.rank = w.rank();
  if (s.rank != 0) s.opt.quiet = true;
  std::optional<LoraConfig> lora_cfg;
  if (lora_enabled(cfg)) lora_cfg = lora_config_from(cfg, s.opt.seed);
  std::optional<Fp8Options> fp8_opt;  // precision.fp8_recipe
  if (Fp8Options o; Fp8Options::from(cfg, s.model_cfg.n_layer, &o)) fp8_opt = o;

  TensorParallel tp = parallel::tensor_parallel_layout(*s.pg, sequence_parallel);
  ExpertParallel ep = parallel::expert_parallel_layout(*s.pg, etp);
  // On a device the layers' collectives take device memory: their groups' device communicators
  // (the same groups, the same ranks; a host-accessible backend keeps the host groups).
  tp.comm = &s.on_device(*tp.comm);
  ep.comm = &s.on_device(*ep.comm);
  if (ep.tp_comm) ep.tp_comm = &s.on_device(*ep.tp_comm);
  LOOM_CHECK(etp == ep.tp_size, "parallel.etp (", etp, ") must divide parallel.tp (", tp.size, ")");
  s.model = std::make_unique<Decoder>(s.model_cfg, *s.be, s.opt.recompute, s.policy.compute, tp, ep,
                                      stage);
  // Context-parallel ranks join data parallelism for the gradient reduction (dp x cp).
  if (s.pg->cp().size() > 1)
    s.model->set_context_parallel(parallel::context_parallel_layout(s.on_device(s.pg->cp())));
  // Experts split by EP are reduced over the ranks holding the same experts: edp, and under
  // CP also every CP rank of them (edp x cp; the EP all-to-all stays within one CP rank).
  comm::Communicator* edp = &s.pg->edp();
  if (s.pg->cp().size() > 1) {
    int index = 0;
    auto members = s.pg->generator().group_of("edp-cp", w.rank(), &index);
    int pos =
        static_cast<int>(std::find(members.begin(), members.end(), w.rank()) - members.begin());
    s.edp_cp = w.split(index, pos, "edp-cp");
    edp = s.edp_cp.get();
  }
  edp = &s.on_device(*edp);  // the experts' gradients: device memory
  if (!s.opt.freeze.empty()) {
    // Before the engine: every layout steps the same AdamW, which skips frozen parameters, and
    // their gradients stay zero (the model skips their weight-gradient GEMMs), so they add
    // nothing to the reductions or the norm.
    LOOM_CHECK(!lora_cfg, "train.freeze with LoRA: the base is frozen already");
    const int n = freeze_by_prefixes(s.model->params(), s.opt.freeze);
    if (!s.opt.quiet) log_info("frozen: ", n, " parameters (train.freeze)");
  }
  bool base_zero3 = false;
  if (lora_cfg) {
    // LoRA (one process or over data and tensor parallelism): every rank holds the whole
    // frozen base, or under TP its whole TP shard (loaded like one process), and the same
    // adapters (the same seed draws the same A; under TP split like their layers,
    // model/lora.h); the engine reduces and steps the adapters only, so gradients and
    // optimizer state exist for them alone.
    LOOM_CHECK(d.ep == 1, "LoRA under expert parallelism is not supported yet: use data, ",
               "tensor, pipeline and context parallelism (parallel.dp, tp, pp, cp)");
    LOOM_CHECK(!s.opt.pretrained.empty(),
               "LoRA fine-tunes a pretrained model: set train.pretrained to its checkpoint");
    // ZeRO-3: the frozen base is sharded over the DP ranks and gathered block by block
    // (parallel::FrozenShards), each rank reading only its shard and the parameters outside
    // the blocks from the checkpoint (load_pretrained), so no rank ever holds the whole base;
    // the adapters (about 1% of the model) stay whole on every rank, their gradients and
    // optimizer state sharded as ZeRO-2 shards them.
    base_zero3 = dp_opt.zero == 3;
    // The adapters' gradients and weights (and under ZeRO-3 the base's shards) are backend
    // memory: on a device the collectives that move them are the device's (as below for the
    // whole model; the ranks are the DP ranks: no context parallelism on a device).
    if (base_zero3) {
      s.base_shards =
          std::make_unique<parallel::FrozenShards>(*s.model, s.on_device(s.pg->dp()), false);
    } else {
      s.model->params().init(s.opt.seed);
    }
    load_pretrained(s, s.opt.pretrained);  // s.dp is not there yet: whole tensors on every rank
    s.lora = std::make_unique<Lora>(*s.model, *lora_cfg);
    if (s.policy.compute != DType::F32 && !base_zero3)  // (load_pretrained rounds the shards)
      s.be->round_to(s.policy.compute, s.model->params().data(), s.model->params().total(),
                     nullptr);
    parallel::DataParallelOptions adapters_opt = dp_opt;
    adapters_opt.zero = std::min(dp_opt.zero, 2);
    s.dp = std::make_unique<parallel::DataParallel>(*s.model, s.on_device(s.grad_group()),
                                                    adapters_opt, acfg, s.policy.compute, *s.be,
                                                    edp, &s.lora->params());
  } else {
    // The engine draws the initial weights: under ZeRO-3 only what this rank keeps (its shard
    // and the parameters that stay gathered), never the whole model.
    dp_opt.init_seed = s.opt.seed;
    // On a device the engine's collectives move device memory (on_device: NCCL or staged over
    // several ranks, Backend copies in one); the trainer's scalar reductions (loss, token counts,
    // the norm) stay on the host groups.
    s.dp = std::make_unique<parallel::DataParallel>(*s.model, s.on_device(s.grad_group()), dp_opt,
                                                    acfg, s.policy.compute, *s.be, edp);
  }
  std::vector<double> norm_weights =
      parallel::grad_norm_weights(s.trained_params(), s.pg->tp().rank(), etp);
  // Pretrained weights are the fp32 truth: the master copy takes them before the model's copy
  // is rounded to the compute type (load_pretrained).
  if (!s.opt.pretrained.empty() && !s.lora) load_pretrained(s, s.opt.pretrained);
  if (!stage.whole()) {
    // One schedule step runs the rank's grad_accum micro-batches through the pipeline.
    // Its activations and the tied embedding's gradient are device memory on a device, moved
    // by the staged communicator whatever parallel.device_comm says: the runner posts receives
    // ahead of need (a whole evaluation window's at once), which MPI's tags match in any order,
    // but NCCL's in-order matching on one stream could deadlock on (docs/parallel.md).
    s.pipe = std::make_unique<parallel::PipelineRunner>(
        *s.model, s.on_device(s.pg->pp(), DeviceComm::Staged),
        pp::make_schedule(pp_kind, layout.p, s.opt.grad_accum, vp));
    // A tied embedding counts on the first stage only.
    std::vector<double> pw = s.pipe->grad_norm_weights();
    // (Per model parameter: LoRA's trained set is the adapters, never on a tied embedding.)
    if (!s.lora)
      for (size_t i = 0; i < pw.size(); ++i) norm_weights[i] *= pw[i];
  }
  // The squared global gradient norm: every trained element counted once over the job. The
  // engine counts sharded parameters on every TP rank and replicated ones on one (norm_weights,
  // a tied embedding on one pipeline stage), summed over the groups holding disjoint parts: the
  // whole world under a pipeline (every stage's parameters are distinct), else TP x DP (x CP).
  comm::Communicator& norm_group = s.pipe                  ? s.pg->world()
                                   : s.pg->cp().size() > 1 ? s.pg->tp_dp_cp()
                                                           : s.pg->tp_dp();
  s.engine = std::make_unique<StepEngine>(*s.dp, norm_group, std::move(norm_weights),
                                          s.policy.loss_scaling, scaler, s.opt.clip_grad);
  if (s.opt.mode == "reward") {
    // Reward models: the value head reads whole rows of one process (data parallelism keeps a
    // micro-batch's pairs on one rank, as DPO).
    LOOM_CHECK(d.tp == 1 && d.pp == 1 && d.cp == 1 && d.ep == 1,
               "train.mode = \"reward\" runs in one process or under data parallelism ",
               "(parallel.dp, zero) only, not tensor, pipeline, context or expert parallelism");
    LOOM_CHECK(cfg.get_string("data.source", "text") == "preference" &&
                   cfg.get_string("dpo.loss", "sigmoid") != "kto",
               "train.mode = \"reward\" needs data.source = \"preference\" (pairs of chosen ",
               "and rejected replies)");
  }
  if (s.opt.mode == "dpo") {
    // DPO over data-parallel ranks: a micro-batch's pairs stay together on one rank (the
    // sources deal out whole micro-batches), so only the sums cross ranks. Under tensor
    // parallelism (and SP) the TP ranks of a DP group run the same pairs: the vocabulary-
    // parallel cross-entropy gives every one of them each token's whole log-probability, so
    // they compute the same sequence log-probabilities, DPO terms and per-token weights.
    // The reference model has the policy's layout (its TP shard); under ZeRO-3 it is sharded
    // like the policy (make_reference). Under context parallelism every CP rank of a DP group
    // runs its chunks of the same pairs, and the sequence log-probabilities are summed over
    // the CP group (Decoder::collect_outputs). Under a pipeline the last stage computes the
    // DPO terms (dpo_pipeline); not with CP as well (untested: the CP sum would run inside
    // the last stage's forward-only passes). No expert parallelism.
    LOOM_CHECK(d.ep == 1, "DPO under expert parallelism is not supported yet: use data, ",
               "tensor, pipeline and context parallelism (parallel.dp, tp, sp, pp, cp)");
    LOOM_CHECK(d.cp == 1 || (d.pp == 1 && vp == 1),
               "DPO under pipeline and context parallelism at once is not supported yet");
    // The reference is the policy's starting point, frozen; LoRA needs no copy (its base);
    // SimPO and ORPO read none.
    if (!s.lora && uses_reference(dpo_loss_from_name(cfg.get_string("dpo.loss", "sigmoid"))))
      make_reference(s, nullptr);
  }
  // bf16 GEMMs where the CPU has them natively (kept off under ZeRO-3, whose point is not to hold
  // every weight at once: the recipe keeps a bf16 copy of each).
  if (s.policy.compute == DType::BF16 && s.dp->zero() < 3 && !base_zero3 && s.be->host_accessible())
    s.recipes.bf16 = attach_bf16_gemms(*s.model, s.opt.quiet);
  // (On a device the linear layers widen stored bf16 into the Decoder's Backend scratch,
  // Linear::widen, and the GPU multiplies on the tensor cores of the policy's type.)
  // The 2-byte weights: what the bf16 GEMMs read keeps no fp32 values in the model (the bf16
  // copy and the optimizer's master are its copies); not under LoRA (the frozen base is read
  // by the adapters' merge and export). FP8's CPU recipes quantise such weights from the bf16
  // copy (the same values, half the bytes).
  if (s.recipes.bf16 && !s.lora) drop_fp32_weights(*s.model);
  // FP8: the CPU recipe on the host, the GPU one on a device (the same keys select both).
  if (fp8_opt && s.be->host_accessible())
    s.recipes.fp8 = attach_fp8_recipes(*fp8_opt, *s.model, s.opt.quiet);
  if (fp8_opt && !s.be->host_accessible())
    s.recipes.device_fp8 = attach_device_fp8_recipes(
        *fp8_opt, *s.model, *s.be, s.pg->dp().size(), largest_forward_tokens(s.opt),
        cat("train.device = \"", s.opt.device, "\": "), s.opt.quiet);
  // Delayed scaling's amaxes are max-reduced over the ranks of one pipeline stage (TE's amax
  // reduction group): one process's history under TP, DP and CP alike.
  comm::Communicator& amax_group = s.pg->cp().size() > 1 ? s.pg->tp_dp_cp() : s.pg->tp_dp();
  if (s.recipes.fp8) s.recipes.fp8->set_amax_group(&amax_group);
  if (s.recipes.device_fp8) {
    // The same groups on device memory (the amaxes never leave the GPU); current scaling's
    // per-quantisation reduction over TP shares TP's device communicator.
    s.recipes.device_fp8->set_amax_group(&s.on_device(amax_group));
    s.recipes.device_fp8->set_tp_group(s.pg->tp().size() > 1 &&
                                               fp8_opt->kind == Fp8RecipeKind::TensorwiseCurrent
                                           ? &s.on_device(s.pg->tp())
                                           : nullptr);
  }
  s.inputs = std::make_unique<CpInputs>(s.pg->cp().size(), s.pg->cp().rank());
  if (s.pipe)
    s.pp_describe =
        cat("pipeline: ", pp::schedule_kind_name(pp_kind), ", p=", layout.p, " v=", vp,
            " m=", s.opt.grad_accum, ", layers per stage ",
            s.pp_layout.substr(s.pp_layout.find("stages=") + 7),
            ", ideal bubble (p-1)/(v*m) = ", double(layout.p - 1) / (vp * s.opt.grad_accum));
  return owned;
}

}  // namespace loom
