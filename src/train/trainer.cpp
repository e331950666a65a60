#include "train/trainer.h"

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint.h"
#include "ckpt/consolidate.h"
#include "ckpt/global_commit.h"
#include "ckpt/reshard.h"
#include "ckpt/tokenizer_copy.h"
#include "comm/process_groups.h"
#include "core/config_int32.h"
#include "core/error.h"
#include "core/fs.h"
#include "core/log.h"
#include "kernels/cpu/sgemm_peak.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/ring_attention.h"
#include "parallel/schedule/pipeline_schedule.h"
#include "parallel/schedule/stage_layers.h"
#include "parallel/tensor_parallel.h"
#include "resil/heartbeat.h"
#include "train/data_source.h"
#include "train/device.h"

namespace loom {

static TrainOptions train_options_from(const Config& c) {
  TrainOptions o;
  o.steps = c.get_int("train.steps", o.steps);
  o.micro_batch = get_int32(c, "train.micro_batch", o.micro_batch);
  o.seq_len = get_int32(c, "train.seq_len", o.seq_len);
  o.grad_accum = get_int32(c, "train.grad_accum", o.grad_accum);
  o.seed = static_cast<uint64_t>(c.get_int("train.seed", static_cast<int64_t>(o.seed)));
  o.threads = get_int32(c, "train.threads", o.threads);
  o.log_interval = c.get_int("train.log_interval", o.log_interval);
  o.eval_interval = c.get_int("train.eval_interval", o.eval_interval);
  o.eval_batches = get_int32(c, "train.eval_batches", o.eval_batches);
  o.out_dir = c.get_string("train.out_dir", o.out_dir);
  o.checkpoint_interval = c.get_int("train.checkpoint_interval", o.checkpoint_interval);
  o.keep_last = get_int32(c, "train.keep_last", o.keep_last);
  o.resume = c.get_bool("train.resume", o.resume);
  o.ckpt_async = c.get_bool("train.ckpt_async", o.ckpt_async);
  o.ckpt_timeout = c.get_double("train.ckpt_timeout", o.ckpt_timeout);
  LOOM_CHECK(o.ckpt_timeout > 0 && o.ckpt_timeout <= 86400, "train.ckpt_timeout = ", o.ckpt_timeout,
             " must lie in (0, 86400] seconds");
  o.init_from = c.get_string("train.init_from", o.init_from);
  o.pretrained = c.get_string("train.pretrained", o.pretrained);
  o.clip_grad = c.get_double("train.clip_grad", o.clip_grad);
  o.peak_gflops = c.get_double("train.peak_gflops", o.peak_gflops);
  o.quiet = c.get_bool("train.quiet", o.quiet);
  o.tensorboard = c.get_bool("train.tensorboard", o.tensorboard);
  o.mode = c.get_string("train.mode", o.mode);
  o.freeze = c.get_string("train.freeze", o.freeze);
  o.max_bad_steps = get_int32(c, "train.max_bad_steps", o.max_bad_steps);
  LOOM_CHECK(o.max_bad_steps >= 0, "train.max_bad_steps must be >= 0");
  o.device = c.get_string("train.device", o.device);
  LOOM_CHECK(o.device == "cpu" || o.device == "cuda" || o.device == "auto",
             "train.device must be cpu, cuda or auto, got '", o.device, "'");
  LOOM_CHECK(o.mode == "pretrain" || o.mode == "sft" || o.mode == "dpo",
             "train.mode must be pretrain, sft or dpo, got '", o.mode, "'");
  LOOM_CHECK(o.steps > 0, "train.steps must be positive, got ", o.steps);
  LOOM_CHECK(o.micro_batch > 0, "train.micro_batch must be positive, got ", o.micro_batch);
  LOOM_CHECK(o.seq_len > 0, "train.seq_len must be positive, got ", o.seq_len);
  LOOM_CHECK(o.grad_accum > 0, "train.grad_accum must be positive, got ", o.grad_accum);
  LOOM_CHECK(o.log_interval > 0, "train.log_interval must be positive");
  LOOM_CHECK(o.eval_interval >= 0 && o.checkpoint_interval >= 0,
             "train.eval_interval and train.checkpoint_interval must be >= 0");
  LOOM_CHECK(o.keep_last >= 0, "train.keep_last must be >= 0");
  LOOM_CHECK(o.clip_grad >= 0, "train.clip_grad must be >= 0");
  return o;
}

namespace {

// LOOM_FAULT_INJECT=<rank>:<step>[:error] kills that rank (SIGKILL), or makes it throw, when
// it starts that step: the failure tests check that the job ends with a message naming the
// rank instead of hanging.
void maybe_inject_fault(int rank, int64_t step) {
  const char* f = std::getenv("LOOM_FAULT_INJECT");
  if (!f) return;
  int r = -1;
  long long s = -1;
  char mode[16] = "";
  int n = std::sscanf(f, "%d:%lld:%15s", &r, &s, mode);
  if (n < 2 || r != rank || s != step) return;
  if (std::string(mode) == "error") fail("injected fault at step ", step);
  std::raise(SIGKILL);
}

// The tokens of the largest forward the linear layers run: a micro-batch's rows (DPO: every
// pair's chosen and rejected sequences, twice train.micro_batch; evaluation batches are the
// same size) of train.seq_len tokens (a CP rank sees part of each: fewer). The device fp8
// recipe's scratch is sized for it, so no forward outgrows it mid-run.
int largest_forward_tokens(const TrainOptions& o) {
  return o.micro_batch * o.seq_len * (o.mode == "dpo" ? 2 : 1);
}

// A parameter of one of the blocks (what ZeRO-3 gathers around use), not the embeddings, final
// norm or head.
bool in_block(const std::string& name) {
  return name.rfind("blocks.", 0) == 0;
}

// Throws naming the first parameter with a non-finite element: a checkpoint (or a run) whose
// weights are NaN or inf must never be trained on, sampled from, or written over good ones.
// (A Backend op on the set's own backend: on a device, one flag comes back per parameter.)
void check_finite(const ParamSet& P, const std::string& where) {
  for (const ParamInfo& p : P.infos()) {
    bool finite = true;
    if (p.fp32_dropped) {  // 2-byte weights (host memory): the bf16 copy's exponent bits
      const uint16_t* b = P.bf16_data() + p.offset;
      for (int64_t i = 0; i < p.numel && finite; ++i) finite = (b[i] & 0x7f80u) != 0x7f80u;
    } else {
      finite = P.backend().all_finite(P.fp32_storage() + p.offset, p.numel);  // (kept)
    }
    LOOM_CHECK(finite, where, ": parameter '", p.name, "' holds non-finite values (NaN or inf)");
  }
}

// Weights in host tensors (a checkpoint's as read, before they go to the device).
void check_finite(const ckpt::TensorList& host, const std::string& where) {
  for (const auto& t : host)
    LOOM_CHECK(cpu_backend().all_finite(t.tensor.data<float>(), t.tensor.numel()), where,
               ": parameter '", t.name, "' holds non-finite values (NaN or inf)");
}

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

// Every parameter of P whole, as views of its buffer (backend memory: on a device only for
// Trainer::stage), each held by replica `replica` (a data-parallel rank).
ckpt::TensorList whole_views(ParamSet& P, int replica) {
  ckpt::TensorList out;
  for (const ParamInfo& p : P.infos()) {
    ckpt::ShardInfo info;
    info.replica_id = replica;
    out.push_back({p.name, Tensor::view_of(P.data() + p.offset, p.shape, DType::F32), info});
  }
  return out;
}

}  // namespace

std::string Trainer::checkpoint_root() const {
  if (whole_) return opt_.out_dir + "/checkpoints";
  return opt_.out_dir + "/checkpoints/" + ckpt::rank_dir_name(rank_);
}

std::string Trainer::layout_name() const {
  const auto& d = pg_->generator().dims();
  return cat("tp=", d.tp, " sp=", model_->tensor_parallel().sequence_parallel, " cp=", d.cp,
             " dp=", d.dp, " pp=", d.pp, " zero=", dp_->zero(),
             d.ep > 1 ? cat(" ep=", d.ep) : std::string(), pp_layout_);
}

Trainer::Trainer(const Config& cfg, comm::Communicator* world, Backend* backend) : cfg_(cfg) {
  const double setup_start = now_seconds();  // the supervisor's restart-time breakdown
  config_text_ = cfg_.dump();
  opt_ = train_options_from(cfg_);
  // The device first: "cuda" without a CUDA build or a GPU fails here, before anything is read
  // or written. A backend handed in (tests) wins over train.device, GEMM math included.
  if (backend) {
    be_ = backend;
    device_ = backend->name();
  } else {
    const DeviceChoice dc = select_device(opt_.device, "train.device", opt_.quiet);
    be_ = dc.backend;
    device_ = dc.describe;
  }

  guard_ = std::make_unique<LossGuard>(loss_guard_options_from(cfg_));
  set_num_threads(opt_.threads);
  mcfg_ = model_config_from(cfg_);
  LOOM_CHECK(opt_.seq_len <= mcfg_.max_seq, "train.seq_len (", opt_.seq_len,
             ") exceeds model.max_seq (", mcfg_.max_seq, ")");
  policy_ = precision_from_name(cfg_.get_string("precision.policy", "fp32"));
  if (policy_.loss_scaling) scaler_ = LossScaler(LossScaler::options_from(cfg_));
  if (!backend) {
    // (A backend handed in keeps the math its owner chose.) A GPU's GEMMs: TF32 under fp32; under
    // bf16 / fp16 the tensor cores of that type (fp32 accumulation), as the CPU's oneDNN bf16
    // GEMMs: the weights and stored activations are such values already, gradients are rounded to
    // it for the product.
    const std::string math =
        set_gemm_math(*be_, policy_.compute == DType::F32 ? "tf32" : dtype_name(policy_.compute));
    if (!math.empty()) device_ += cat(", ", math, " GEMMs");
  }
  sched_ = lr_schedule_from(cfg_, opt_.steps);
  Recompute rc = recompute_from_name(cfg_.get_string("train.recompute", "none"));

  AdamWConfig acfg = adamw_config_from(cfg_);
  comm::ParallelDims dims = comm::ParallelDims::from(cfg_);
  parallel::DataParallelOptions dpo = parallel::DataParallelOptions::from(cfg_);
  const bool sequence_parallel = cfg_.get_bool("parallel.sp", false);
  // Expert tensor parallelism: the experts' MLPs split over etp ranks of the TP group.
  const int etp = get_int32(cfg_, "parallel.etp", 1);
  // Pipeline: virtual stages per rank, schedule, and the first/last stage's layer counts
  // (-1 = even split).
  const int vp = get_int32(cfg_, "parallel.vp", 1);
  const pp::ScheduleKind pp_kind = pp::parse_schedule_kind(
      cfg_.get_string("parallel.pp_schedule", vp > 1 ? "interleaved" : "1f1b"));
  const int pp_first = get_int32(cfg_, "parallel.pp_first_stage_layers", -1);
  const int pp_last = get_int32(cfg_, "parallel.pp_last_stage_layers", -1);
  device_comm_ = device_comm_from_name(cfg_.get_string("parallel.device_comm", "auto"),
                                       "parallel.device_comm");
  {  // before any data is opened or anything allocated
    Fp8Options fp8_probe;
    const bool fp8 = Fp8Options::from(cfg_, mcfg_.n_layer, &fp8_probe);
    // ZeRO-3 keeps no layer's whole weight between uses; the CPU recipe keeps fp8 copies of
    // them, and the GPU recipe, which quantises the gathered weights on every call, has not
    // been proven against the CPU trainer under ZeRO-3 (which has no fp8 run to compare with).
    // (LoRA at ZeRO-3 shards the frozen base the same way.)
    LOOM_CHECK(!fp8 || dpo.zero < 3, "precision.fp8_recipe = \"", fp8_recipe_name(fp8_probe.kind),
               "\" is not supported with parallel.zero = 3 (the fp8 recipes need each layer's ",
               "whole weight at hand); use parallel.zero = 0, 1 or 2, or leave ",
               "precision.fp8_recipe unset");
    if (!be_->host_accessible())
      check_device_support((world ? *world : comm::world()).size(), dims.cp,
                           fp8 ? &fp8_probe : nullptr);
  }
  if (opt_.eval_interval > 0) {  // every data-parallel rank evaluates the same batches
    valid_data_ = make_batch_source(cfg_, opt_, mcfg_, "valid");
    valid_start_ = valid_data_->state();
  }

  // One engine for every layout: a one-process run is data parallelism over a world of one
  // rank, whose groups are self communicators (every collective a copy or nothing).
  comm::Communicator& w = world ? *world : comm::world();
  pg_ = std::make_unique<comm::ProcessGroups>(w, dims);
  const auto& d = pg_->generator().dims();
  // What is laid out over ranks only decides the checkpoint files: one rank holding every whole
  // tensor writes and reads the one-process layout (the one every tool reads); anything else
  // one part per rank.
  whole_ = w.size() == 1 && dpo.zero == 0 && vp == 1;
  LOOM_CHECK(d.cp == 1 || opt_.seq_len % (2 * d.cp) == 0, "train.seq_len = ", opt_.seq_len,
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
    layout = pp::assign_layers(mcfg_.n_layer, d.pp, vp, pp_first, pp_last);
    stage = parallel::pipeline_stage_of(layout, pg_->pp().rank());
    std::string split;
    for (const auto& r : layout.stages) split += cat(split.empty() ? "" : ",", r.size());
    pp_layout_ = cat(" vp=", vp, " stages=", split);
  } else {
    LOOM_CHECK(pp_first < 0 && pp_last < 0,
               "parallel.pp_first_stage_layers / pp_last_stage_layers need parallel.pp > 1");
  }
  LOOM_CHECK(!sequence_parallel || d.tp > 1, "parallel.sp needs parallel.tp > 1");
  rank_ = w.rank();
  if (rank_ != 0) opt_.quiet = true;
  train_data_ = make_batch_source(cfg_, opt_, mcfg_, "train", pg_->dp().rank(), pg_->dp().size());
  if (opt_.mode == "dpo") {
    dpo_beta_ = cfg_.get_double("dpo.beta", 0.1);
    LOOM_CHECK(dpo_beta_ > 0 && dpo_beta_ <= 100, "dpo.beta must lie in (0, 100], got ", dpo_beta_);
    dpo_loss_ = dpo_loss_from_name(cfg_.get_string("dpo.loss", "sigmoid"));
    LOOM_CHECK(cfg_.get_string("data.source", "text") == "preference",
               "train.mode = \"dpo\" needs data.source = \"preference\"");
  }
  if (opt_.mode == "sft") {
    const std::string source = cfg_.get_string("data.source", "text");
    LOOM_CHECK(source == "chat" || source == "chat_tokens",
               "train.mode = \"sft\" needs data.source = \"chat\" or \"chat_tokens\"");
  }
  std::optional<LoraConfig> lora_cfg;  // read before every key must have been used
  if (lora_enabled(cfg_)) lora_cfg = lora_config_from(cfg_, opt_.seed);
  std::optional<Fp8Options> fp8_opt;  // precision.fp8_recipe (issue 18)
  if (Fp8Options o; Fp8Options::from(cfg_, mcfg_.n_layer, &o)) fp8_opt = o;
  cfg_.check_all_used();
  LOOM_CHECK(train_data_->vocab() <= mcfg_.vocab, "the data's vocabulary (", train_data_->vocab(),
             ") exceeds model.vocab (", mcfg_.vocab, ")");

  TensorParallel tp = parallel::tensor_parallel_layout(*pg_, sequence_parallel);
  ExpertParallel ep = parallel::expert_parallel_layout(*pg_, etp);
  // On a device the layers' collectives take device memory: their groups' device communicators
  // (the same groups, the same ranks; a host-accessible backend keeps the host groups).
  tp.comm = &on_device(*tp.comm);
  ep.comm = &on_device(*ep.comm);
  if (ep.tp_comm) ep.tp_comm = &on_device(*ep.tp_comm);
  LOOM_CHECK(etp == ep.tp_size, "parallel.etp (", etp, ") must divide parallel.tp (", tp.size, ")");
  model_ = std::make_unique<Decoder>(mcfg_, *be_, rc, policy_.compute, tp, ep, stage);
  // Context-parallel ranks join data parallelism for the gradient reduction (dp x cp).
  if (pg_->cp().size() > 1)
    model_->set_context_parallel(parallel::context_parallel_layout(on_device(pg_->cp())));
  // Experts split by EP are reduced over the ranks holding the same experts: edp, and under
  // CP also every CP rank of them (edp x cp; the EP all-to-all stays within one CP rank).
  comm::Communicator* edp = &pg_->edp();
  if (pg_->cp().size() > 1) {
    int index = 0;
    auto members = pg_->generator().group_of("edp-cp", w.rank(), &index);
    int pos =
        static_cast<int>(std::find(members.begin(), members.end(), w.rank()) - members.begin());
    edp_cp_ = w.split(index, pos, "edp-cp");
    edp = edp_cp_.get();
  }
  edp = &on_device(*edp);  // the experts' gradients: device memory
  if (!opt_.freeze.empty()) {
    // Before the engine: every layout steps the same AdamW, which skips frozen parameters, and
    // their gradients stay zero (the model skips their weight-gradient GEMMs), so they add
    // nothing to the reductions or the norm.
    LOOM_CHECK(!lora_cfg, "train.freeze with LoRA: the base is frozen already");
    const int n = freeze_by_prefixes(model_->params(), opt_.freeze);
    if (!opt_.quiet) log_info("frozen: ", n, " parameters (train.freeze)");
  }
  if (lora_cfg) {
    // LoRA (one process or over data and tensor parallelism): every rank holds the whole
    // frozen base, or under TP its whole TP shard (loaded like one process), and the same
    // adapters (the same seed draws the same A; under TP split like their layers,
    // model/lora.h); the engine reduces and steps the adapters only, so gradients and
    // optimizer state exist for them alone.
    LOOM_CHECK(d.ep == 1, "LoRA under expert parallelism is not supported yet: use data, ",
               "tensor, pipeline and context parallelism (parallel.dp, tp, pp, cp)");
    LOOM_CHECK(!opt_.pretrained.empty(),
               "LoRA fine-tunes a pretrained model: set train.pretrained to its checkpoint");
    // ZeRO-3: the frozen base is sharded over the DP ranks and gathered block by block
    // (parallel::FrozenShards), each rank reading only its shard and the parameters outside
    // the blocks from the checkpoint (load_pretrained), so no rank ever holds the whole base;
    // the adapters (about 1% of the model) stay whole on every rank, their gradients and
    // optimizer state sharded as ZeRO-2 shards them.
    base_zero3_ = dpo.zero == 3;
    // The adapters' gradients and weights (and under ZeRO-3 the base's shards) are backend
    // memory: on a device the collectives that move them are the device's (as below for the
    // whole model; the ranks are the DP ranks: no context parallelism on a device).
    if (base_zero3_) {
      base_shards_ = std::make_unique<parallel::FrozenShards>(*model_, on_device(pg_->dp()), false);
    } else {
      model_->params().init(opt_.seed);
    }
    load_pretrained(opt_.pretrained);  // dp_ is not there yet: whole tensors on every rank
    lora_ = std::make_unique<Lora>(*model_, *lora_cfg);
    if (policy_.compute != DType::F32 && !base_zero3_)  // (load_pretrained rounds the shards)
      be_->round_to(policy_.compute, model_->params().data(), model_->params().total(), nullptr);
    parallel::DataParallelOptions adapters_opt = dpo;
    adapters_opt.zero = std::min(dpo.zero, 2);
    dp_ = std::make_unique<parallel::DataParallel>(*model_, on_device(grad_group()), adapters_opt,
                                                   acfg, policy_.compute, *be_, edp,
                                                   &lora_->params());
  } else {
    // The engine draws the initial weights: under ZeRO-3 only what this rank keeps (its shard
    // and the parameters that stay gathered), never the whole model.
    dpo.init_seed = opt_.seed;
    // On a device the engine's collectives move device memory (on_device: NCCL or staged over
    // several ranks, Backend copies in one); the trainer's scalar reductions (loss, token counts,
    // the norm) stay on the host groups.
    dp_ = std::make_unique<parallel::DataParallel>(*model_, on_device(grad_group()), dpo, acfg,
                                                   policy_.compute, *be_, edp);
  }
  norm_weights_ = parallel::grad_norm_weights(trained_params(), pg_->tp().rank(), etp);
  // Pretrained weights are the fp32 truth: the master copy takes them before the model's copy
  // is rounded to the compute type (load_pretrained).
  if (!opt_.pretrained.empty() && !lora_) load_pretrained(opt_.pretrained);
  if (!stage.whole()) {
    // One schedule step runs the rank's grad_accum micro-batches through the pipeline.
    // Its activations and the tied embedding's gradient are device memory on a device, moved
    // by the staged communicator whatever parallel.device_comm says: the runner posts receives
    // ahead of need (a whole evaluation window's at once), which MPI's tags match in any order,
    // but NCCL's in-order matching on one stream could deadlock on (docs/parallel.md).
    pipe_ = std::make_unique<parallel::PipelineRunner>(
        *model_, on_device(pg_->pp(), DeviceComm::Staged),
        pp::make_schedule(pp_kind, layout.p, opt_.grad_accum, vp));
    // A tied embedding counts on the first stage only.
    std::vector<double> pw = pipe_->grad_norm_weights();
    // (Per model parameter: LoRA's trained set is the adapters, never on a tied embedding.)
    if (!lora_)
      for (size_t i = 0; i < pw.size(); ++i) norm_weights_[i] *= pw[i];
  }
  if (opt_.mode == "dpo") {
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
    // The reference is the policy's starting point, frozen; LoRA needs no copy (its base).
    if (!lora_) make_reference(nullptr);
  }
  // bf16 GEMMs where the CPU has them natively (kept off under ZeRO-3, whose point is not to hold
  // every weight at once: the recipe keeps a bf16 copy of each).
  if (policy_.compute == DType::BF16 && dp_->zero() < 3 && !base_zero3_ && be_->host_accessible())
    bf16_gemms_ = attach_bf16_gemms(*model_, opt_.quiet);
  // (On a device the linear layers widen stored bf16 into the Decoder's Backend scratch,
  // Linear::widen, and the GPU multiplies on the tensor cores of the policy's type.)
  // The 2-byte weights: what the bf16 GEMMs read keeps no fp32 values in the model (the bf16
  // copy and the optimizer's master are its copies); not under LoRA (the frozen base is read
  // by the adapters' merge and export). FP8's CPU recipes quantise such weights from the bf16
  // copy (the same values, half the bytes).
  if (bf16_gemms_ && !lora_) drop_fp32_weights(*model_);
  // FP8: the CPU recipe on the host, the GPU one on a device (the same keys select both).
  if (fp8_opt && be_->host_accessible()) fp8_ = attach_fp8_recipes(*fp8_opt, *model_, opt_.quiet);
  if (fp8_opt && !be_->host_accessible())
    device_fp8_ = attach_device_fp8_recipes(
        *fp8_opt, *model_, *be_, pg_->dp().size(), largest_forward_tokens(opt_),
        cat("train.device = \"", opt_.device, "\": "), opt_.quiet);
  // Delayed scaling's amaxes are max-reduced over the ranks of one pipeline stage (TE's amax
  // reduction group): one process's history under TP, DP and CP alike.
  comm::Communicator& amax_group = pg_->cp().size() > 1 ? pg_->tp_dp_cp() : pg_->tp_dp();
  if (fp8_) fp8_->set_amax_group(&amax_group);
  if (device_fp8_) {
    // The same groups on device memory (the amaxes never leave the GPU); current scaling's
    // per-quantisation reduction over TP shares TP's device communicator.
    device_fp8_->set_amax_group(&on_device(amax_group));
    device_fp8_->set_tp_group(pg_->tp().size() > 1 &&
                                      fp8_opt->kind == Fp8RecipeKind::TensorwiseCurrent
                                  ? &on_device(pg_->tp())
                                  : nullptr);
  }
  micro_.resize(opt_.grad_accum);
  flops_per_token_ = mcfg_.train_flops_per_token(opt_.seq_len);

  make_dirs(opt_.out_dir);
  if (rank_ == 0) run_lock_ = lock_run_dir(opt_.out_dir);  // before anything there is read
  const double restore_start = now_seconds();
  bool resumed = opt_.resume && resume_across_layouts();  // the newest is another layout's
  if (!resumed)
    resumed = !whole_ ? opt_.resume && resume_distributed()
                      : opt_.resume && ckpt::has_checkpoints(checkpoint_root()) &&
                            resume_from(checkpoint_root());
  if (!resumed && !opt_.init_from.empty()) start_from_one_process(opt_.init_from);
  reference_from_init_weights(resumed);
  const double restore_seconds = now_seconds() - restore_start;
  if (rank_ == 0) {  // one metrics log and config per run, written by rank 0
    metrics_ = std::make_unique<MetricsLog>(opt_.out_dir + "/metrics.jsonl", resumed,
                                            opt_.tensorboard ? opt_.out_dir + "/tensorboard" : "",
                                            resumed ? step_ : -1);
    write_file_atomic(opt_.out_dir + "/config.toml", config_text_);
  }

  // MFU's denominator: train.peak_gflops, else on a GPU its dense bf16 tensor-core peak, on
  // the CPU this machine's measured sgemm peak.
  const double gpu_peak = be_->host_accessible() ? 0.0 : gpu_bf16_peak_gflops(*be_);
  peak_gflops_ = opt_.peak_gflops > 0     ? opt_.peak_gflops
                 : rank_ != 0             ? 1.0  // only rank 0 reports MFU
                 : gpu_peak > 0           ? gpu_peak
                 : be_->host_accessible() ? measure_sgemm_peak_gflops(num_threads())
                                          : 1.0;  // an unknown GPU: train.peak_gflops sets it
  if (!opt_.quiet) {
    log_info("model ", mcfg_.name, ": ", mcfg_.fingerprint(), ", ", mcfg_.num_params(),
             " parameters, ", flops_per_token_ / 1e6, " MFLOP/token");
    log_info("data: ", train_data_->describe());
    if (!whole_)
      log_info("parallel: ", pg_->describe(), ", ZeRO-", dp_->zero(), ", ", dp_->num_buckets(),
               " gradient buckets");
    if (pipe_)
      log_info("pipeline: ", pp::schedule_kind_name(pp_kind), ", p=", layout.p, " v=", vp,
               " m=", opt_.grad_accum, ", layers per stage ",
               pp_layout_.substr(pp_layout_.find("stages=") + 7),
               ", ideal bubble (p-1)/(v*m) = ", double(layout.p - 1) / (vp * opt_.grad_accum));
    if (!opt_.pretrained.empty()) log_info("pretrained weights: ", opt_.pretrained);
    if (lora_)
      log_info(lora_->config().describe(), ": ", lora_->target_names().size(), " adapters, ",
               lora_->params().total(), " trainable parameters (base frozen)");
    log_info("device ", device_, ", precision ", policy_.name, ", recompute ", recompute_name(rc),
             ", ", num_threads(), " threads, MFU against ", peak_gflops_, " GFLOP/s (",
             opt_.peak_gflops > 0     ? "train.peak_gflops"
             : gpu_peak > 0           ? "the GPU's dense bf16 peak"
             : be_->host_accessible() ? "measured sgemm peak"
                                      : "unknown GPU: set train.peak_gflops",
             ")");
  }
  resil::heartbeat_start(rank_, pg_->world().size(), opt_.out_dir,  // if supervised
                         now_seconds() - setup_start, restore_seconds);
}

Trainer::~Trainer() {
  // The reference's shards gather over a device communicator on a device (device_comms_),
  // which is declared after them: they go first.
  reference_shards_.reset();
}

StepResult Trainer::train_step() {
  maybe_inject_fault(rank_, step_);
  resil::heartbeat_section(resil::Section::Data, step_ + 1);
  if (bf16_gemms_) bf16_gemms_->new_weights();  // stepped (or loaded) since the last use
  if (fp8_) fp8_->begin_step();                 // new weights; delayed scaling's history moves on
  if (device_fp8_) device_fp8_->begin_step();
  if (opt_.mode == "dpo") return dpo_step();
  double t0 = now_seconds();
  StepResult r;
  r.step = step_;
  r.lr = sched_.at(step_);
  // Gather the step's micro-batches first: the loss is a mean over every target token of the
  // global batch, so each token's gradient weight needs their total (over all DP ranks).
  int64_t valid = 0;
  for (auto& b : micro_) {
    train_data_->next(b);
    valid += b.valid_targets();
  }
  resil::heartbeat_section(resil::Section::ForwardBackward, step_ + 1);
  valid = pg_->dp().all_reduce_scalar(valid, comm::ReduceOp::Sum);
  LOOM_CHECK(valid > 0, "a global batch without any target token");
  const double scale = policy_.loss_scaling ? scaler_.scale() : 1.0;
  double loss_sum = 0, aux_sum = 0;
  if (pipe_) {
    // The pipeline accumulates every micro-batch's gradients, then one DP reduction.
    std::vector<ModelInput> in;
    // Under CP each stage runs ring attention over its CP group on the rank's rows; the
    // activations passed between stages are those rows (pp peers share the cp coordinate).
    for (auto& b : micro_) in.push_back(model_input(b));
    dp_->start_step(1);
    dp_->start_micro(0);
    // LoRA dropout keyed by the micro-batch each forward or backward (which recomputes the
    // chunk) computes, in whatever order the schedule runs them.
    LoraDropoutScope drop(lora_.get(), 0);
    if (lora_)
      pipe_->before_micro = [this, &in](int mb) {
        lora_->set_dropout_batch(global_micro(size_t(mb)), cp_rows(in[size_t(mb)]));
      };
    loss_sum = pipe_->run(in, static_cast<float>(scale / valid));
    pipe_->before_micro = nullptr;
    aux_sum = pipe_->last_aux_loss();
    dp_->finish_micro();
    // The loss lives on the last stage (aux losses on the stages holding MoE layers): summing
    // over the pipeline gives every rank the loss, rank 0 included, which logs it.
    loss_sum = pg_->pp().all_reduce_scalar(loss_sum, comm::ReduceOp::Sum);
    if (mcfg_.is_moe()) aux_sum = pg_->pp().all_reduce_scalar(aux_sum, comm::ReduceOp::Sum);
    std::vector<float> idle(size_t(pg_->pp().size()), 0.f);
    idle[size_t(pg_->pp().rank())] = static_cast<float>(pipe_->last_idle_fraction());
    pg_->pp().all_reduce(idle.data(), int64_t(idle.size()), DType::F32, comm::ReduceOp::Sum);
    r.pp_idle.assign(idle.begin(), idle.end());
  } else {
    // Distributed, gradient buckets reduce during backward of the last micro-batch (every
    // micro-batch under ZeRO-2/3); each element's reduced gradient is then counted on exactly
    // one DP rank.
    dp_->start_step(static_cast<int>(micro_.size()));
    for (size_t j = 0; j < micro_.size(); ++j) {
      dp_->start_micro(static_cast<int>(j));
      const ModelInput in = model_input(micro_[j]);
      LoraDropoutScope drop(lora_.get(), global_micro(j), cp_rows(in));
      loss_sum += model_->forward_backward(in, static_cast<float>(scale / valid));
      aux_sum += model_->last_aux_loss();
      dp_->finish_micro();
    }
  }
  if (inject_ != 1.f) {
    // (After the reduction: the gradients are in the trained set's buffer at ZeRO-0 only.)
    LOOM_CHECK(pg_->world().size() == 1 && dp_->zero() == 0,
               "inject_gradient_factor is for one-process tests at parallel.zero = 0");
    ParamSet& T = trained_params();
    be_->scale_inplace(T.grad(), inject_, T.total());
  }
  // Under CP each rank holds the loss (and aux losses) of its share of the tokens: sum over
  // dp x cp. Tensor-parallel ranks of one DP group hold the same loss.
  loss_sum = grad_group().all_reduce_scalar(loss_sum, comm::ReduceOp::Sum);
  if (mcfg_.is_moe()) aux_sum = grad_group().all_reduce_scalar(aux_sum, comm::ReduceOp::Sum);
  const double sq = grad_sq();
  r.aux_loss = aux_sum / valid;
  finish_step(r, loss_sum, valid, sq, scale);
  r.seconds = now_seconds() - t0;
  return r;
}

// The squared global gradient norm: every trained element counted once over the job. The
// engine counts sharded parameters on every TP rank and replicated ones on one (norm_weights_,
// a tied embedding on one pipeline stage), summed over the groups holding disjoint parts: the
// whole world under a pipeline (every stage's parameters are distinct), else TP x DP (x CP).
double Trainer::grad_sq() {
  comm::Communicator& g = pipe_                  ? pg_->world()
                          : pg_->cp().size() > 1 ? pg_->tp_dp_cp()
                                                 : pg_->tp_dp();
  return g.all_reduce_scalar(dp_->grad_sq_local(norm_weights_), comm::ReduceOp::Sum);
}

void Trainer::finish_step(StepResult& r, double loss_sum, int64_t valid, double sq, double scale) {
  resil::heartbeat_section(resil::Section::Optimizer, step_ + 1);
  r.loss = loss_sum / valid;
  bool finite = std::isfinite(sq);
  r.grad_norm = std::sqrt(sq) / scale;
  bool proceed = policy_.loss_scaling ? scaler_.update(finite) : finite;
  if (!finite && !policy_.loss_scaling)
    log_warn("step ", step_, ": non-finite gradients; step skipped");
  if (proceed) {
    float grad_scale = static_cast<float>(1.0 / scale);
    if (opt_.clip_grad > 0 && r.grad_norm > opt_.clip_grad)
      grad_scale *= static_cast<float>(opt_.clip_grad / r.grad_norm);
    dp_->step(r.lr, grad_scale);
  }
  r.skipped = !proceed;
  ++step_;
}

double Trainer::evaluate() {
  if (bf16_gemms_) bf16_gemms_->new_weights();
  if (fp8_) fp8_->new_weights();
  Fp8Evaluating fp8_eval(fp8_.get());  // validation amaxes stay out of the training history
  if (device_fp8_) device_fp8_->set_recording(false);
  struct Recording {  // ... on the GPU as well, however evaluate() ends
    DeviceFp8Recipes* r;
    ~Recording() {
      if (r) r->set_recording(true);
    }
  } device_fp8_eval{device_fp8_.get()};
  LOOM_CHECK(valid_data_, "evaluation needs train.eval_interval > 0");
  valid_data_->restore(valid_start_);  // the same validation batches every time
  double sum = 0;
  int64_t n = 0;
  if (opt_.mode == "dpo") {
    DpoStats total;
    Batch b;
    if (pipe_) {
      std::vector<Batch> batches(size_t(std::max(0, opt_.eval_batches)));
      for (Batch& v : batches) valid_data_->next(v);
      total = dpo_pipeline(batches, false, 1);
    }
    for (int i = 0; i < opt_.eval_batches && !pipe_; ++i) {
      valid_data_->next(b);
      const DpoStats s = dpo_micro(b, false, 1);
      total.loss += s.loss;
      total.correct += s.correct;
      total.reward_chosen += s.reward_chosen;
      total.reward_rejected += s.reward_rejected;
      total.pairs += s.pairs;
    }
    eval_extra_ = {
        {"valid_reward_accuracy", total.correct / total.pairs},
        {"valid_reward_margin", (total.reward_chosen - total.reward_rejected) / total.pairs}};
    return total.loss / total.pairs;
  }
  if (pipe_) {
    sum = pipeline_eval_sum(n);
  } else {
    Batch b;
    for (int i = 0; i < opt_.eval_batches; ++i) {
      valid_data_->next(b);
      sum += model_->forward_loss(model_input(b));
      n += b.valid_targets();
    }
  }
  // Every DP rank evaluates the same batches, so no DP reduction. Under CP each rank's loss
  // covers its share of the tokens.
  if (pg_->cp().size() > 1) sum = pg_->cp().all_reduce_scalar(sum, comm::ReduceOp::Sum);
  return sum / std::max<int64_t>(1, n);
}

// The validation loss sum under pipeline parallelism: the eval batches run forward only through
// the stages (PipelineRunner::forward_only); the head loss lives on the last stage and MoE aux
// losses on the stages holding their layers, so the sum over the pipeline is every rank's.
// Adds the batches' target tokens to `valid`.
double Trainer::pipeline_eval_sum(int64_t& valid) {
  std::vector<Batch> batches(size_t(std::max(0, opt_.eval_batches)));
  for (auto& b : batches) {
    valid_data_->next(b);
    valid += b.valid_targets();
  }
  std::vector<ModelInput> in;
  for (const auto& b : batches) in.push_back(model_input(b));
  const double sum = pipe_->forward_only(in);
  for (const auto& b : batches) cp_local_.erase(&b);  // these batches die here
  return pg_->pp().all_reduce_scalar(sum, comm::ReduceOp::Sum);
}

comm::Communicator& Trainer::grad_group() const {
  return pg_->cp().size() > 1 ? pg_->dp_cp() : pg_->dp();
}

// The model's input for a micro-batch: the batch itself, or under context parallelism this
// rank's share of it (every document cut into 2*cp chunks, chunks r and 2cp-1-r kept, with
// their positions for RoPE), which stays valid until the next call for the same batch.
ModelInput Trainer::model_input(const Batch& b) {
  if (pg_->cp().size() == 1) return b.input();
  const int cp = pg_->cp().size(), r = pg_->cp().rank();
  CpLocal& l = cp_local_[&b];
  l.batch = CpBatch::make(b.cu_seqlens.data(), static_cast<int>(b.cu_seqlens.size()) - 1, cp);
  const cpu::CpShard& s = l.batch.shards[size_t(r)];
  l.tokens.resize(size_t(s.rows()));
  l.targets.resize(size_t(s.rows()));
  for (int i = 0; i < s.rows(); ++i) {
    l.tokens[size_t(i)] = b.tokens[size_t(s.global_rows[size_t(i)])];
    l.targets[size_t(i)] = b.targets[size_t(s.global_rows[size_t(i)])];
  }
  ModelInput in{l.tokens.data(),    l.targets.data(),
                s.positions.data(), s.local_cu_seqlens.data(),
                s.rows(),           static_cast<int>(s.local_cu_seqlens.size()) - 1};
  in.cp = &l.batch;
  return in;
}

void Trainer::log_step(const StepResult& r, int64_t tokens) {
  double tps = tokens / r.seconds;
  // Per rank: the model's FLOPs are split over every rank of the job, and MFU compares one
  // rank's share with one rank's peak.
  const int ranks = pg_->world().size();
  double gflops = flops_per_token_ * tps / ranks / 1e9;
  Json j = Json::object();
  j["step"] = r.step + 1;
  j["loss"] = r.loss;
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  if (mcfg_.is_moe()) j["aux_loss"] = r.aux_loss;
  j["tokens_per_s"] = tps;
  j["gflops"] = gflops;
  j["mfu"] = gflops / peak_gflops_;
  j["step_seconds"] = r.seconds;
  if (policy_.loss_scaling) j["loss_scale"] = scaler_.scale();
  if (r.skipped) j["skipped"] = true;
  for (const auto& [k, v] : r.extra) j[k] = v;
  double bubble = 0;
  if (!r.pp_idle.empty()) {
    Json idle = Json::array();
    for (double f : r.pp_idle) {
      idle.push_back(f);
      bubble += f / r.pp_idle.size();
    }
    j["pp_idle"] = idle;  // per pipeline rank
    j["pp_bubble"] = bubble;
  }
  if (metrics_) metrics_->write(j);
  ++steps_this_run_;
  if (opt_.quiet || ((r.step + 1) % opt_.log_interval != 0 && r.step + 1 != opt_.steps)) return;
  double elapsed = now_seconds() - started_;
  double eta = elapsed / steps_this_run_ * (opt_.steps - r.step - 1);
  char buf[640], aux[48] = "";
  if (mcfg_.is_moe()) std::snprintf(aux, sizeof aux, " (aux %.4f)", r.aux_loss);
  std::string pp_info;
  if (!r.pp_idle.empty()) {
    pp_info =
        cat(" | bubble ", static_cast<int>(std::lround(100 * bubble)), "% (idle per stage rank");
    for (double f : r.pp_idle) pp_info += cat(" ", static_cast<int>(std::lround(100 * f)), "%");
    pp_info += ")";
  }
  for (const auto& [k, v] : r.extra) pp_info += cat(" | ", k, " ", std::lround(v * 1000) / 1000.0);
  std::snprintf(buf, sizeof buf,
                "step %6lld/%lld | loss %.4f%s | lr %.2e | grad norm %.3f | %.0f tok/s | "
                "%.1f GFLOP/s | MFU %.1f%% | ETA %.0fs%s%s",
                static_cast<long long>(r.step + 1), static_cast<long long>(opt_.steps), r.loss, aux,
                r.lr, r.grad_norm, tps, gflops, 100 * gflops / peak_gflops_, eta,
                r.skipped ? " | skipped" : "", pp_info.c_str());
  log_info(buf);
}

double Trainer::run() {
  if (pg_->world().size() > 1) {
    // One rank failing must end the whole job (with its rank named), not leave the others
    // waiting in a collective.
    try {
      return run_loop();
    } catch (const std::exception& e) {
      comm::abort_job(e.what());
    }
  }
  return run_loop();
}

double Trainer::run_loop() {
  started_ = now_seconds();
  const int64_t tokens =
      int64_t(opt_.micro_batch) * opt_.seq_len * opt_.grad_accum * (pg_->dp().size());
  if (step_ >= opt_.steps && !opt_.quiet)
    log_info("already at step ", step_, " of ", opt_.steps, ": nothing to do");
  double last = NAN;
  while (step_ < opt_.steps) {
    StepResult r = train_step();
    resil::heartbeat_step_done(step_);
    r.loss = guard_->apply_test_spike(step_, r.loss);
    last = r.loss;
    log_step(r, tokens);
    if (guard_step(r)) continue;  // rolled back to the last checkpoint: no eval, no save
    if (opt_.eval_interval > 0 && (step_ % opt_.eval_interval == 0 || step_ == opt_.steps)) {
      resil::heartbeat_section(resil::Section::Eval, step_);
      double vl = evaluate();
      Json j = Json::object();
      j["step"] = step_;
      j["valid_loss"] = vl;
      std::string more;
      for (const auto& [k, v] : eval_extra_) {
        j[k] = v;
        more += cat(" | ", k, " ", v);
      }
      if (metrics_) metrics_->write(j);
      if (!opt_.quiet) log_info("step ", step_, " | validation loss ", vl, more);
    }
    bool at_interval = opt_.checkpoint_interval > 0 && step_ % opt_.checkpoint_interval == 0;
    if (at_interval || step_ == opt_.steps) save_checkpoint();
  }
  finish_checkpoints();
  return last;
}

// What a checkpoint holds besides tensors, in one process and distributed alike.
ckpt::TrainerState Trainer::checkpoint_state(int64_t optimizer_steps) const {
  ckpt::TrainerState st;
  st.step = step_;
  st.seed = opt_.seed;
  st.data = train_data_->state();
  st.config_text = config_text_;
  st.extra["model_fingerprint"] = mcfg_.fingerprint();
  st.extra["optimizer_steps"] = optimizer_steps;
  st.extra["precision"] = policy_.name;
  if (!whole_) {
    st.extra["layout"] = layout_name();
    st.extra["rank"] = rank_;
  }
  if (policy_.loss_scaling) st.extra["loss_scaler"] = scaler_.state();
  if (lora_) st.extra["lora"] = lora_->config().describe();
  // Delayed scaling's histories, in one format from either recipe (a checkpoint moves between
  // CPU and GPU runs).
  const Json f = fp8_ ? fp8_->state() : device_fp8_ ? device_fp8_->state() : Json();
  if (!f.is_null()) st.extra["fp8"] = f;
  return st;
}

// Refuses a checkpoint of another model, precision or (distributed) layout, then restores
// what checkpoint_state() recorded; returns the optimizer's step count.
int64_t Trainer::restore_state(const ckpt::Checkpoint& c, bool same_layout) {
  const Json& extra = c.state().extra;
  auto recorded = [&](const char* key) {
    return extra.contains(key) ? extra.at(key).as_string() : std::string();
  };
  LOOM_CHECK(recorded("model_fingerprint") == mcfg_.fingerprint(), c.dir(),
             ": checkpoint is for model '", recorded("model_fingerprint"),
             "', but this run's model is '", mcfg_.fingerprint(), "'");
  if (!whole_ && same_layout)
    LOOM_CHECK(recorded("layout") == layout_name(), c.dir(), ": checkpoint layout '",
               recorded("layout"), "' differs from this run's '", layout_name(), "'");
  LOOM_CHECK(recorded("precision") == policy_.name, c.dir(),
             ": checkpoint was trained with precision '", recorded("precision"),
             "', this run uses '", policy_.name, "'");
  if (policy_.loss_scaling) scaler_.restore(extra.at("loss_scaler"));
  const Json* fp8_state = extra.contains("fp8") ? &extra.at("fp8") : nullptr;
  if (fp8_) fp8_->restore(fp8_state, c.dir());
  if (device_fp8_) device_fp8_->restore(fp8_state, c.dir());
  try {
    train_data_->restore(c.state().data);
  } catch (const Error& e) {
    fail(c.dir(), "/state.json: field 'data' (the data position): ", e.what());
  }
  step_ = c.state().step;
  return extra.at("optimizer_steps").as_int();
}

void Trainer::save_checkpoint() {
  // Never write non-finite weights (rotation would then delete good checkpoints).
  resil::heartbeat_section(resil::Section::Checkpoint, step_);
  check_finite(model_->params(), cat("step ", step_, " checkpoint"));
  if (lora_) check_finite(lora_->params(), cat("step ", step_, " checkpoint"));
  if (!ckpt_writer_) {
    ckpt::CheckpointWriterOptions wo;
    wo.async = opt_.ckpt_async;
    wo.keep_last = whole_ ? opt_.keep_last : 0;  // per-rank parts: after the global commit
    wo.timeout_s = opt_.ckpt_timeout;
    wo.quiet = opt_.quiet;
    ckpt_writer_ = std::make_unique<ckpt::CheckpointWriter>(checkpoint_root(), wo);
  }
  ckpt::TrainerState st = checkpoint_state(dp_->steps_taken());
  if (rank_ == 0) ckpt::copy_tokenizer_in(opt_.out_dir, config_text_);  // served from anywhere
  // Per-rank parts: the previous step's global commit first (asynchronous: its parts are
  // durable by now), this one's after a synchronous write.
  if (!whole_) commit_distributed();
  // Under LoRA only the adapters: the base is train.pretrained, named in the saved config.
  // On a device the writer gets host copies (staged here, copied again by an asynchronous
  // writer's snapshot); on the CPU the buffers themselves.
  staged_.clear();
  ckpt_writer_->save(st, stage(shard_list(dp_->save_slices())), stage(optim_list()));
  staged_.clear();  // (nothing to upload: the writer only read them)
  if (!whole_ && !opt_.ckpt_async) commit_distributed();
  if (opt_.quiet) return;
  if (opt_.ckpt_async)
    log_info("checkpoint step ", step_, ": snapshot in ", ckpt_writer_->last_stall_seconds(),
             " s, writing in the background");
  else if (whole_)
    log_info("saved checkpoint ", checkpoint_root(), "/", ckpt::step_dir_name(step_), " (",
             ckpt_writer_->last_stall_seconds(), " s)");
}

void Trainer::finish_checkpoints() {
  if (!ckpt_writer_) return;
  if (whole_)
    ckpt_writer_->wait();
  else
    commit_distributed();
}

double Trainer::last_checkpoint_stall() const {
  return ckpt_writer_ ? ckpt_writer_->last_stall_seconds() : 0.0;
}

bool Trainer::resume_from(const std::string& path) {
  LOOM_CHECK(whole_, "a run over several ranks or a sharded layout resumes from its own ",
             "per-rank checkpoints");
  ckpt::Checkpoint c(path);
  restore(c);
  if (!opt_.quiet) log_info("resumed from ", c.dir(), " at step ", step_);
  return true;
}

// What every resume does once the checkpoint is chosen: the state, then this rank's weights
// and optimizer state placed as the engine holds them, and the model re-derived from them.
// Weights that are not finite are refused, naming the parameter, before anything else is read.
void Trainer::restore(const ckpt::Checkpoint& c) {
  check_same_global_batch(c);  // the data position means the same place only then
  const int64_t optimizer_steps = restore_state(c);
  // Read into host memory (the buffers themselves on the CPU, staged copies on a device),
  // checked, then uploaded. (A failed read before left copies behind: not uploaded now.)
  staged_.clear();
  const ckpt::TensorList model = stage(shard_list(dp_->load_slices()));
  c.restore_model(model);
  check_finite(model, c.dir());
  c.restore_optim(stage(optim_list()));
  unstage();
  dp_->sync_model_from_master();
  dp_->set_steps_taken(optimizer_steps);
}

// What the trainer's step keeps off a device so far, refused up front with the reason (before
// the model allocates or anything is written). Every layout (DP with ZeRO 0-2, TP with SP, PP
// with virtual stages, CP, EP, MoE; ZeRO-3, bf16 gradient reduction, LoRA and DPO) trains on the
// device: each group that moves device memory has its device communicator (on_device: NCCL, or
// staged through the host), and the layers' parallel parts (vocabulary-parallel cross-entropy,
// pipeline activations, the CP ring, the EP exchange) run on Backend buffers and ops.
void Trainer::check_device_support(int world_size, int cp, const Fp8Options* fp8) const {
  const std::string on =
      cat("train.device = \"", opt_.device, "\" (the ", be_->name(), " backend): ");
  // fp8 runs on every layout the CPU recipe does: its amaxes are max-reduced over the CPU
  // recipe's groups (TP x DP x CP of the pipeline stage for delayed scaling, TP for current
  // scaling) on device communicators; a pipeline stage's recipe holds its own layers' state;
  // expert MLPs take no recipe on either path (Decoder::linears() lists none), so under EP only
  // the replicated attention and dense layers are fp8 (docs/gpu.md, "fp8 in the GPU trainer").
  if (fp8)
    check_device_fp8(*fp8, device_fp8_target(*be_, world_size, largest_forward_tokens(opt_), cp),
                     on);
}

comm::Communicator& Trainer::on_device(comm::Communicator& host, DeviceComm kind) {
  if (be_->host_accessible()) return host;
  auto& c = device_comms_[&host];
  if (!c) c = make_device_communicator(host, *be_, kind == DeviceComm::Auto ? device_comm_ : kind);
  return *c;
}

// Host tensors for checkpoint I/O: on a host-accessible backend the views themselves; on a
// device a host copy of each (copy_d2h), remembered so that unstage() uploads them back after
// they were filled (copy_h2d). Slices name device memory there, never read by the host.
ckpt::TensorList Trainer::stage(ckpt::TensorList views) {
  if (be_->host_accessible()) return views;
  for (auto& t : views) {
    Tensor host = Tensor::zeros(t.tensor.shape());
    be_->copy_d2h(host.data<float>(), t.tensor.data<float>(), size_t(t.tensor.nbytes()));
    staged_.push_back({t.tensor.data<float>(), host});
    t.tensor = host;
  }
  return views;
}

void Trainer::unstage() {
  for (auto& [dev, host] : staged_) be_->copy_h2d(dev, host.data<float>(), size_t(host.nbytes()));
  staged_.clear();
}

// Checkpoints hold the engine's slices (StateSlice: its weights and optimizer state), placed by
// the layout. One rank holding every whole tensor (whole_): the one-process layout, each slice
// a whole tensor shaped like its parameter, in name order, under <out_dir>/checkpoints (what
// `loom ckpt consolidate` writes and every reader takes). Otherwise every rank writes its own
// step directory under <out_dir>/checkpoints/rank_NNNNN with the tensors it holds, each with
// its placement (ShardInfo): ZeRO-0 whole parameters (replica = DP rank), ZeRO >= 1 the rank's
// slice of each flattened parameter and of its optimizer state; resuming needs the same layout.
ckpt::TensorList Trainer::shard_list(const std::vector<StateSlice>& slices) const {
  ckpt::TensorList out;
  if (whole_) {
    const ParamSet& T = lora_ ? lora_->params() : model_->params();
    for (const StateSlice& s : slices) {
      // "<param>", or "exp_avg.<param>" and the like.
      const std::string param = T.has(s.name) ? s.name : s.name.substr(s.name.find('.') + 1);
      const ParamInfo& p = T.info(param);
      LOOM_CHECK(s.offset == 0 && s.tensor.numel() == p.numel, s.name,
                 ": one process's engine must hold whole parameters");
      out.push_back(
          {s.name, Tensor::view_of(s.tensor.data<float>(), p.shape, DType::F32), {}, s.fill});
    }
    std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
    return out;
  }
  for (const auto& sl : slices) {
    ckpt::ShardInfo info;
    if (dp_->zero() == 0) {
      info.replica_id = grad_group().rank();  // every DP rank holds the whole (TP-local) tensor
    } else {
      info.global_shape = {sl.global_numel};
      info.global_offset = {sl.offset};
    }
    out.push_back({sl.name, sl.tensor, info, sl.fill});
  }
  return out;
}

// The optimizer's state as a checkpoint holds it (Optimizer::state_slices(), placed by
// shard_list).
ckpt::TensorList Trainer::optim_list() const {
  return shard_list(dp_->state_slices());
}

// A step counts as committed only once every rank's part is durable: the ranks exchange their
// parts' commit digests, rank 0 writes the global commit record (ckpt/global_commit.h), and only
// after that does any rank rotate older parts away, so the newest committed step always stays.
void Trainer::commit_distributed() {
  auto done = ckpt_writer_->wait();  // this rank's write error ends the job (run())
  comm::Communicator& w = pg_->world();
  const int n = w.size(), me = w.rank();
  std::vector<int64_t> all(size_t(2 * n), 0);
  all[size_t(2 * me)] = done ? done->step : -1;
  all[size_t(2 * me + 1)] = done ? static_cast<int64_t>(done->digest) : 0;
  w.all_gather(all.data(), std::vector<int64_t>(size_t(n), 2), DType::I64);
  const int64_t step = all[0];
  for (int r = 1; r < n; ++r)
    LOOM_CHECK(all[size_t(2 * r)] == step, "checkpoint: rank ", r, " finished step ",
               all[size_t(2 * r)], " while rank 0 finished step ", step);
  if (step < 0) return;
  const std::string shared = opt_.out_dir + "/checkpoints";
  if (rank_ == 0) {
    ckpt::GlobalCommit gc;
    gc.step = step;
    gc.layout = layout_name();
    for (int r = 0; r < n; ++r) gc.parts.push_back(static_cast<uint64_t>(all[size_t(2 * r + 1)]));
    ckpt::write_global_commit(shared, gc);
  }
  w.barrier();  // the record is durable before any rank deletes an older part
  if (opt_.keep_last > 0) ckpt::prune_checkpoints(checkpoint_root(), step, opt_.keep_last);
  if (rank_ == 0) ckpt::prune_global_commits(shared, checkpoint_root(), step);
  if (!opt_.quiet)
    log_info("checkpoint step ", step, " committed on every rank (",
             ckpt::global_commit_dir(shared), ")");
}

// The newest step that rank 0 holds a global commit record for and whose part verifies on every
// rank; parts without a record (a rank killed during the save) are ignored, and a step that
// fails verification anywhere is skipped for the one before, on every rank alike.
bool Trainer::resume_distributed() {
  comm::Communicator& w = pg_->world();
  const std::string shared = opt_.out_dir + "/checkpoints";
  const bool mine = ckpt::has_checkpoints(checkpoint_root());
  if (w.all_reduce_scalar(int64_t(mine ? 1 : 0), comm::ReduceOp::Max) == 0) return false;
  std::vector<int64_t> committed;
  if (rank_ == 0) committed = ckpt::list_global_commits(shared);
  int64_t below = INT64_MAX;
  for (;;) {
    // Rank 0 names the candidate and each part's digest: [step, world size, digests...].
    std::vector<int64_t> rec(size_t(2 + w.size()), -1);
    if (rank_ == 0) {
      for (auto it = committed.rbegin(); it != committed.rend() && rec[0] < 0; ++it) {
        if (*it >= below) continue;
        try {
          auto gc = ckpt::read_global_commit(shared, *it);
          rec[0] = *it;
          rec[1] = static_cast<int64_t>(gc->parts.size());
          for (size_t r = 0; r < gc->parts.size() && r < size_t(w.size()); ++r)
            rec[2 + r] = static_cast<int64_t>(gc->parts[r]);
        } catch (const ckpt::CheckpointCorrupt& e) {
          log_warn("checkpoint step ", *it, " skipped: ", e.what());
        }
      }
    }
    w.broadcast(rec.data(), int64_t(rec.size()), DType::I64, 0);
    if (rec[0] < 0) {
      if (rank_ == 0)
        log_warn("checkpoint: no step under ", shared, " was committed by every rank and ",
                 "verifies; parts of uncommitted steps are ignored: starting fresh");
      return false;
    }
    // Every rank fails alike (no rank left waiting in a collective).
    LOOM_CHECK(rec[1] == w.size(), ckpt::global_commit_dir(shared), ": step ", rec[0],
               " was committed by ", rec[1], " ranks, but this run has ", w.size(),
               ": consolidate the run's checkpoints (loom ckpt consolidate) and start from them ",
               "with train.init_from");
    const int64_t step = rec[0];
    const std::string dir = checkpoint_root() + "/" + ckpt::step_dir_name(step);
    std::unique_ptr<ckpt::Checkpoint> c;
    try {
      c = std::make_unique<ckpt::Checkpoint>(dir);
      LOOM_CHECK(ckpt::commit_digest(dir) == static_cast<uint64_t>(rec[2 + rank_]), dir,
                 ": differs from the part that the global commit record of step ", step,
                 " lists (replaced after the commit)");
    } catch (const Error& e) {
      log_warn("checkpoint step ", step, " skipped on rank ", rank_, ": ", e.what());
      c.reset();
    }
    if (w.all_reduce_scalar(int64_t(c ? 0 : 1), comm::ReduceOp::Max) == 0) {  // all verified
      restore(*c);
      if (!opt_.quiet) log_info("resumed every rank from step ", step_, " (", layout_name(), ")");
      return true;
    }
    below = step;
  }
}

// The data position is a global sample count: it means the same place in the data only under
// the same global batch (micro_batch * grad_accum * dp) and sequence length as the checkpoint's
// run, whose dp is that of the layout it was written under or consolidated from (1 for a
// one-process run). Every resume and train.init_from checks it.
void Trainer::check_same_global_batch(const ckpt::Checkpoint& c) const {
  const Config saved = Config::parse(c.state().config_text, c.dir() + "/state.json");
  const TrainOptions defaults;
  const int64_t micro = saved.get_int("train.micro_batch", defaults.micro_batch);
  const int64_t accum = saved.get_int("train.grad_accum", defaults.grad_accum);
  const int64_t seq = saved.get_int("train.seq_len", defaults.seq_len);
  int64_t dp = 1;
  const Json& extra = c.state().extra;
  if (extra.contains("consolidated_from"))
    dp = ckpt::DistributedLayout::parse(extra.at("consolidated_from").as_string()).dp;
  else if (extra.contains("layout"))  // a rank's part of a distributed run
    dp = ckpt::DistributedLayout::parse(extra.at("layout").as_string()).dp;
  const int64_t theirs = micro * accum * dp;
  const int our_dp = pg_->dp().size();
  const int64_t ours = int64_t(opt_.micro_batch) * opt_.grad_accum * our_dp;
  LOOM_CHECK(theirs == ours && seq == opt_.seq_len, c.dir(), ": trained with a global batch of ",
             theirs, " samples (micro_batch ", micro, " x grad_accum ", accum, " x dp ", dp,
             ") of ", seq, " tokens; this run's is ", ours, " (", opt_.micro_batch, " x ",
             opt_.grad_accum, " x ", our_dp, ") of ", opt_.seq_len,
             ": set train.micro_batch and train.grad_accum so that the products match");
}

// train.init_from: every rank reads the whole tensors of a one-process checkpoint (mapped, only
// the rows it needs) and extracts its pieces by the placement consolidation uses
// (ckpt/reshard.h), then continues the run's step, optimizer, loss scale and data position.
// The DPO loss is normalised by pairs in its token weights and passes dloss = 1; a MoE
// model's auxiliary loss is averaged over the step's routed tokens as in pre-training (every
// micro-batch's, on every DP and CP rank: micro-batches of one shape).
float Trainer::dpo_aux_weight(const ModelInput& in) const {
  const double tokens =
      double(in.N) * double(micro_.size()) * double(pg_->dp().size()) * double(pg_->cp().size());
  return static_cast<float>(1.0 / tokens);
}

Trainer::DpoStats Trainer::dpo_micro(const Batch& b, bool backward, int64_t pairs_in_step) {
  // Under context parallelism this rank's chunks of the pairs (the sequences stay in order, so
  // pair k is still local sequences 2k and 2k+1), erased again on the way out.
  ModelInput in = model_input(b);
  struct Forget {
    std::map<const Batch*, CpLocal>& m;
    const Batch* b;
    ~Forget() { m.erase(b); }
  } forget{cp_local_, &b};
  // LoRA dropout (dpo_step set the micro-batch): under CP by the tokens' micro-batch rows.
  if (lora_ && lora_->dropout_active())
    lora_->set_dropout_batch(lora_->dropout_micro(), cp_rows(in));
  StepOutputs ref, pol;
  if (lora_) {
    lora_->set_attached(false);
    model_->forward_loss(in, &ref);
    lora_->set_attached(true);
  } else {
    reference_->forward_loss(in, &ref);
  }
  model_->forward_loss(in, &pol);
  std::vector<float> w;
  const DpoStats st = dpo_terms(in, ref, pol, pairs_in_step, w);
  if (backward) {
    in.loss_weights = w.data();
    in.aux_weight = dpo_aux_weight(in);
    model_->forward_backward(in, 1.f);
  }
  return st;
}

// A micro-batch's pairs (sequences 2k and 2k+1 of `in`) from the policy's and the reference's
// sequence log-probabilities: their DPO losses and statistics, and in `w` each token's loss
// weight for the backward (dL/dpi of its sequence, over the step's pairs).
Trainer::DpoStats Trainer::dpo_terms(const ModelInput& in, const StepOutputs& ref,
                                     const StepOutputs& pol, int64_t pairs_in_step,
                                     std::vector<float>& w) const {
  DpoStats st;
  st.pairs = in.nseq / 2;
  w.assign(size_t(in.N), 0.f);
  for (int64_t k = 0; k < st.pairs; ++k) {
    const size_t c = size_t(2 * k), r = c + 1;
    const DpoPair p = dpo_pair(pol.seq_logprobs[c], pol.seq_logprobs[r], ref.seq_logprobs[c],
                               ref.seq_logprobs[r], dpo_beta_, dpo_loss_);
    st.loss += p.loss;
    st.reward_chosen += p.reward_chosen;
    st.reward_rejected += p.reward_rejected;
    st.correct += p.reward_chosen > p.reward_rejected;
    // The model's loss is sum_i w_i (-log p_i), whose gradient is -sum_i w_i d log p_i; the
    // DPO gradient is sum_s dL/dpi_s d pi_s with pi_s = sum_{i in s} log p_i: w_i = -dL/dpi_s.
    const double d[2] = {p.d_chosen, p.d_rejected};
    for (int s = 0; s < 2; ++s)
      for (int i = in.cu_seqlens[c + s]; i < in.cu_seqlens[c + s + 1]; ++i)
        w[size_t(i)] = static_cast<float>(-d[s] / double(pairs_in_step));
  }
  return st;
}

// DPO over a pipeline: the step's micro-batches run forward only through the reference's
// stages (LoRA: the policy's, adapters detached) and the policy's, the rank holding the last
// stage turns the sequence log-probabilities into the DPO terms and per-token weights (the
// weights matter only to the head, which is there), and then one pipeline schedule runs the
// policy's forwards and backwards with those weights. The figures live on the last stage:
// summed over the pipeline (the other stages hold zeros). With `backward`, gradients
// accumulate with the weights scaled by 1 / pairs_in_step.
Trainer::DpoStats Trainer::dpo_pipeline(std::vector<Batch>& batches, bool backward,
                                        int64_t pairs_in_step) {
  std::vector<ModelInput> in;
  for (const Batch& b : batches) in.push_back(b.input());
  std::vector<StepOutputs> ref, pol;
  if (lora_) {
    lora_->set_attached(false);
    pipe_->forward_only(in, &ref);
    lora_->set_attached(true);
  } else {
    reference_pipe_->forward_only(in, &ref);
  }
  // The policy's forward-only passes and the training schedule draw the same dropout masks.
  LoraDropoutScope drop(backward ? lora_.get() : nullptr, 0);
  if (backward && lora_)
    pipe_->before_micro = [this](int mb) { lora_->set_dropout_batch(global_micro(size_t(mb))); };
  struct Unhook {
    parallel::PipelineRunner& p;
    ~Unhook() { p.before_micro = nullptr; }
  } unhook{*pipe_};
  pipe_->forward_only(in, &pol);
  DpoStats total;
  std::vector<std::vector<float>> w(in.size());
  if (model_->pipeline_stage().last)
    for (size_t j = 0; j < in.size(); ++j) {
      const DpoStats st = dpo_terms(in[j], ref[j], pol[j], pairs_in_step, w[j]);
      total.loss += st.loss;
      total.reward_chosen += st.reward_chosen;
      total.reward_rejected += st.reward_rejected;
      total.correct += st.correct;
      total.pairs += st.pairs;
      in[j].loss_weights = w[j].data();
    }
  if (backward) {
    for (ModelInput& x : in) x.aux_weight = dpo_aux_weight(x);
    pipe_->run(in, 1.f);
  }
  comm::Communicator& pp = pg_->pp();
  total.loss = pp.all_reduce_scalar(total.loss, comm::ReduceOp::Sum);
  total.reward_chosen = pp.all_reduce_scalar(total.reward_chosen, comm::ReduceOp::Sum);
  total.reward_rejected = pp.all_reduce_scalar(total.reward_rejected, comm::ReduceOp::Sum);
  total.correct = pp.all_reduce_scalar(total.correct, comm::ReduceOp::Sum);
  total.pairs = pp.all_reduce_scalar(total.pairs, comm::ReduceOp::Sum);
  return total;
}

StepResult Trainer::dpo_step() {
  const double t0 = now_seconds();
  StepResult r;
  r.step = step_;
  r.lr = sched_.at(step_);
  // The loss is a mean over the global batch's pairs (every DP rank's), as in one process.
  const int64_t pairs = int64_t(opt_.micro_batch) * opt_.grad_accum * pg_->dp().size();
  dp_->start_step(pipe_ ? 1 : static_cast<int>(micro_.size()));  // the pipeline: one "micro"
  DpoStats total;
  if (pipe_) {
    for (Batch& b : micro_) train_data_->next(b);
    dp_->start_micro(0);
    total = dpo_pipeline(micro_, true, pairs);
    dp_->finish_micro();
  }
  for (size_t j = 0; j < micro_.size() && !pipe_; ++j) {
    Batch& b = micro_[j];
    train_data_->next(b);
    dp_->start_micro(static_cast<int>(j));
    // The policy's forward-only pass and its backward draw the same dropout mask, so the
    // log-probabilities in the loss are those of the function differentiated.
    LoraDropoutScope drop(lora_.get(), global_micro(j));
    const DpoStats s = dpo_micro(b, true, pairs);
    dp_->finish_micro();
    total.loss += s.loss;
    total.reward_chosen += s.reward_chosen;
    total.reward_rejected += s.reward_rejected;
    total.correct += s.correct;
    total.pairs += s.pairs;
  }
  // The TP ranks of a DP group hold the same figures: sum over DP only.
  comm::Communicator& g = pg_->dp();
  total.loss = g.all_reduce_scalar(total.loss, comm::ReduceOp::Sum);
  total.reward_chosen = g.all_reduce_scalar(total.reward_chosen, comm::ReduceOp::Sum);
  total.reward_rejected = g.all_reduce_scalar(total.reward_rejected, comm::ReduceOp::Sum);
  total.correct = g.all_reduce_scalar(total.correct, comm::ReduceOp::Sum);
  total.pairs = g.all_reduce_scalar(total.pairs, comm::ReduceOp::Sum);
  const double sq = grad_sq();
  r.extra = {{"rewards_chosen", total.reward_chosen / total.pairs},
             {"rewards_rejected", total.reward_rejected / total.pairs},
             {"reward_margin", (total.reward_chosen - total.reward_rejected) / total.pairs},
             {"reward_accuracy", total.correct / total.pairs}};
  finish_step(r, total.loss, total.pairs, sq, 1.0);
  r.seconds = now_seconds() - t0;
  return r;
}

// DPO's reference is the run's starting weights. train.pretrained's and the seeded draw are in
// the model when the reference copies it (construction); a weights-only train.init_from (e.g.
// `loom ckpt import`) arrives later: its weights are taken here, from the model when the run
// starts from them, or from the checkpoint again when the run resumes its own checkpoint.
void Trainer::reference_from_init_weights(bool resumed) {
  if (!reference_ || !opt_.pretrained.empty() || opt_.init_from.empty()) return;
  const ckpt::Checkpoint c(opt_.init_from);
  if (c.state().extra.contains("optimizer_steps")) return;  // a run's checkpoint: see docs
  make_reference(resumed ? &c : nullptr);
}

// The DPO reference: a frozen Decoder in the policy's layout holding the policy's weights now
// (`from` null), or `from`'s weights. Under ZeRO-3 it holds what FrozenShards needs and no
// more (this rank's flat shard of the blocks, the same split as the policy's, and the
// parameters outside the blocks whole), so no rank ever holds the whole reference either.
void Trainer::make_reference(const ckpt::Checkpoint* from) {
  reference_shards_.reset();  // it points into the old reference
  reference_pipe_.reset();
  // On the policy's backend: on a device the reference's forward runs there too, and its
  // weights are copied and rounded by Backend ops (checkpoint reads staged through the host).
  reference_ = std::make_unique<Decoder>(mcfg_, *be_, Recompute::None, policy_.compute,
                                         model_->tensor_parallel(), ExpertParallel{},
                                         model_->pipeline_stage());
  // Under a pipeline the reference runs forward only through its own stages, with the policy's
  // schedule (a collective over the pipeline group: every rank makes it here).
  if (pipe_)
    reference_pipe_ =
        std::make_unique<parallel::PipelineRunner>(*reference_, pg_->pp(), pipe_->schedule());
  if (model_->context_parallel().size > 1)
    reference_->set_context_parallel(model_->context_parallel());
  ParamSet& R = reference_->params();
  const ParamSet& P = model_->params();
  LOOM_CHECK(R.total() == P.total(), "DPO reference layout mismatch");
  const bool sharded = dp_->zero() == 3;
  const auto round = [&](float* p, int64_t n) {  // backend memory
    if (policy_.compute != DType::F32 && n > 0) be_->round_to(policy_.compute, p, n, nullptr);
  };
  const auto copy = [&](float* dst, const float* src, int64_t n) {
    if (n > 0) be_->copy_d2d(dst, src, sizeof(float) * size_t(n));
  };
  if (!sharded && !from) {
    P.copy_values_to(R.data(), 0, P.total());  // whole (this rank's TP shard)
    return;
  }
  if (!sharded) {
    staged_.clear();
    const ckpt::TensorList host = stage(whole_views(R, pg_->dp().rank()));
    ckpt::fill_from_whole(*from, R, host, {});
    check_finite(host, from->dir());
    unstage();
    round(R.data(), R.total());
    return;
  }
  const int64_t lo = dp_->shard_begin(), hi = dp_->shard_end();
  if (from) {
    // The pieces this rank keeps, read from the checkpoint's whole tensors.
    ckpt::TensorList pieces;
    for (const ParamInfo& p : R.infos()) {
      ckpt::ShardInfo info;
      if (!in_block(p.name)) {
        info.replica_id = pg_->dp().rank();
        pieces.push_back({p.name, Tensor::view_of(R.data() + p.offset, p.shape, DType::F32), info});
        continue;
      }
      const int64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.numel, hi);
      if (a >= b) continue;
      info.global_shape = {p.numel};
      info.global_offset = {a - p.offset};
      pieces.push_back({p.name, Tensor::view_of(R.data() + a, {b - a}, DType::F32), info});
    }
    staged_.clear();
    const ckpt::TensorList host = stage(pieces);
    ckpt::fill_from_whole(*from, R, host, {});
    check_finite(host, from->dir());  // the rest of R is zeros
    unstage();
    for (const auto& piece : pieces) round(piece.tensor.data<float>(), piece.tensor.numel());
  } else {
    // The policy's master shard (its starting weights) and its gathered non-block parameters.
    for (const auto& sl : dp_->param_slices()) {
      float* dst = R.data() + R.info(sl.name).offset + sl.offset;
      copy(dst, sl.tensor.data<float>(), sl.tensor.numel());
      round(dst, sl.tensor.numel());
    }
    for (const ParamInfo& p : P.infos())
      if (!in_block(p.name)) copy(R.data() + p.offset, P.data() + p.offset, p.numel);
  }
  reference_shards_ = std::make_unique<parallel::FrozenShards>(*reference_, on_device(pg_->dp()));
  LOOM_CHECK(reference_shards_->shard_begin() == lo && reference_shards_->shard_end() == hi,
             "DPO reference: its ZeRO-3 shard differs from the policy's");
}

const int32_t* Trainer::cp_rows(const ModelInput& in) const {
  return in.cp ? in.cp->shards[size_t(pg_->cp().rank())].global_rows.data() : nullptr;
}

uint64_t Trainer::global_micro(size_t j) const {
  const int64_t dp = pg_->dp().size(), rank = pg_->dp().rank();
  return uint64_t((step_ * opt_.grad_accum + int64_t(j)) * dp + rank);
}

ParamSet& Trainer::trained_params() {
  return lora_ ? lora_->params() : model_->params();
}

// The model's parameters from a checkpoint of the same model (a one-process or consolidated
// checkpoint, or a Hugging Face import); nothing else of it is used.
void Trainer::load_pretrained(const std::string& path) {
  ckpt::Checkpoint c(path);
  LOOM_CHECK(!c.state().extra.contains("layout"), c.dir(),
             ": a rank's checkpoint of a distributed run; consolidate the run's checkpoints first "
             "(loom ckpt consolidate)");
  LOOM_CHECK(!c.state().extra.contains("lora"), c.dir(),
             ": a LoRA checkpoint holds adapters only; merge it first (loom ckpt merge)");
  if (base_shards_) {
    // LoRA at ZeRO-3: this rank's flat shard of the blocks (into the shards' own copy) and the
    // parameters outside the blocks (into the model, where they stay gathered), rounded to the
    // compute type as the model would hold them. The rest of the base is never written here.
    ParamSet& P = model_->params();
    const int64_t lo = base_shards_->shard_begin(), hi = base_shards_->shard_end();
    ckpt::TensorList pieces;
    for (const ParamInfo& p : P.infos()) {
      ckpt::ShardInfo info;
      if (!in_block(p.name)) {
        info.replica_id = pg_->dp().rank();
        pieces.push_back({p.name, Tensor::view_of(P.data() + p.offset, p.shape, DType::F32), info});
        continue;
      }
      const int64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.numel, hi);
      if (a >= b) continue;
      info.global_shape = {p.numel};
      info.global_offset = {a - p.offset};
      pieces.push_back(
          {p.name, Tensor::view_of(base_shards_->own() + (a - lo), {b - a}, DType::F32), info});
    }
    // Read into host memory (the buffers themselves on the CPU, staged copies on a device),
    // checked and rounded there, then uploaded.
    staged_.clear();
    const ckpt::TensorList host = stage(pieces);
    ckpt::fill_from_whole(c, P, host, {});
    check_finite(host, c.dir());
    for (const auto& piece : host)
      if (policy_.compute != DType::F32)
        round_to(policy_.compute, piece.tensor.data<float>(), size_t(piece.tensor.numel()));
    unstage();
    return;
  }
  // LoRA's base (before the engine exists, or under it) is whole on every rank (replicated).
  if ((!dp_ || lora_) && model_->tensor_parallel().size == 1 && model_->pipeline_stage().whole()) {
    // Under LoRA the base is whole (replicated) on every rank.
    staged_.clear();
    const ckpt::TensorList host = stage(whole_views(model_->params(), pg_->dp().rank()));
    c.restore_model(host);
    check_finite(host, c.dir());
    unstage();
  } else if (!dp_ || lora_) {
    // LoRA under TP or PP (before the engine exists): each rank's whole TP shard of every
    // parameter of its pipeline stage, placed by its ParamInfo.
    staged_.clear();
    const ckpt::TensorList host = stage(whole_views(model_->params(), pg_->dp().rank()));
    ckpt::fill_from_whole(c, model_->params(), host, {});
    check_finite(host, c.dir());
    unstage();
  } else {
    staged_.clear();
    const ckpt::TensorList slices = stage(shard_list(dp_->load_slices()));
    ckpt::fill_from_whole(c, model_->params(), slices, {});
    check_finite(slices, c.dir());
    unstage();
    dp_->sync_master_from_model();  // ZeRO-0: the slices are the model's weights
    dp_->sync_model_from_master();
  }
}

void Trainer::start_from_one_process(const std::string& path) {
  {
    // A checkpoint without training state (loom ckpt import, merge, or loom rl's output) has
    // only weights to give: they start the run at step 0, as train.pretrained would.
    ckpt::Checkpoint c(path);
    if (!c.state().extra.contains("optimizer_steps")) {
      load_pretrained(path);
      if (bf16_gemms_) bf16_gemms_->new_weights();
      if (fp8_) fp8_->new_weights();
      if (!opt_.quiet)
        log_info("started from the weights of ", c.dir(), " (it holds no training state)");
      return;
    }
  }
  ckpt::Checkpoint c(path);
  LOOM_CHECK(!c.state().extra.contains("layout"), c.dir(),
             ": a rank's checkpoint of a distributed run; consolidate the run's checkpoints first "
             "(loom ckpt consolidate)");
  const int64_t etp = cfg_.get_int("parallel.etp", 1);
  LOOM_CHECK(etp == 1, "train.init_from: parallel.etp = ", etp,
             " (expert tensor parallelism) cannot start from a one-process checkpoint yet");
  check_same_global_batch(c);
  if (whole_) {  // the checkpoint's own layout: a resume
    resume_from(path);
    return;
  }
  const int64_t optimizer_steps = restore_state(c, /*same_layout=*/false);
  staged_.clear();
  ckpt::fill_from_whole(c, trained_params(), stage(shard_list(dp_->load_slices())),
                        stage(optim_list()));
  unstage();
  dp_->sync_model_from_master();
  dp_->set_steps_taken(optimizer_steps);
  if (!opt_.quiet)
    log_info("started every rank from ", c.dir(), " at step ", step_, " (", layout_name(), ")");
}

}  // namespace loom
