#include "train/checkpointer.h"

#include <algorithm>

#include "ckpt/consolidate.h"
#include "ckpt/global_commit.h"
#include "ckpt/model_loader.h"
#include "ckpt/reshard.h"
#include "ckpt/tokenizer_copy.h"
#include "core/error.h"
#include "core/log.h"
#include "resil/heartbeat.h"

namespace loom {
namespace {

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

// Checkpoints hold the engine's slices (StateSlice: its weights and optimizer state), placed by
// the layout. One rank holding every whole tensor (TrainSetup::whole): the one-process layout, each
// slice a whole tensor shaped like its parameter, in name order, under <out_dir>/checkpoints (what
// `loom ckpt consolidate` writes and every reader takes). Otherwise every rank writes its own
// step directory under <out_dir>/checkpoints/rank_NNNNN with the tensors it holds, each with
// its placement (ShardInfo): ZeRO-0 whole parameters (replica = DP rank), ZeRO >= 1 the rank's
// slice of each flattened parameter and of its optimizer state; resuming needs the same layout.
ckpt::TensorList shard_list(const TrainSetup& setup, const std::vector<StateSlice>& slices) {
  ckpt::TensorList out;
  if (setup.whole) {
    const ParamSet& T = setup.lora ? setup.lora->params() : setup.model->params();
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
    if (setup.dp->zero() == 0) {
      info.replica_id =
          setup.grad_group().rank();  // every DP rank holds the whole (TP-local) tensor
    } else {
      info.global_shape = {sl.global_numel};
      info.global_offset = {sl.offset};
    }
    out.push_back({sl.name, sl.tensor, info, sl.fill});
  }
  return out;
}

}  // namespace

// What a checkpoint holds besides tensors, in one process and distributed alike.
ckpt::TrainerState Checkpointer::checkpoint_state(int64_t optimizer_steps) const {
  ckpt::TrainerState st;
  st.step = step_;
  st.seed = s_.opt.seed;
  st.data = data_.state();
  st.config_text = config_text_;
  st.extra["model_fingerprint"] = s_.model_cfg.fingerprint();
  st.extra["optimizer_steps"] = optimizer_steps;
  st.extra["precision"] = s_.policy.name;
  if (!s_.whole) {
    st.extra["layout"] = s_.layout_name();
    st.extra["rank"] = s_.rank;
  }
  if (s_.engine->loss_scaling()) st.extra["loss_scaler"] = s_.engine->scaler().state();
  if (s_.lora) st.extra["lora"] = s_.lora->config().describe();
  // Delayed scaling's histories, in one format from either recipe (a checkpoint moves between
  // CPU and GPU runs).
  const Json f = s_.recipes.state();
  if (!f.is_null()) st.extra["fp8"] = f;
  return st;
}

// Refuses a checkpoint of another model, precision or (distributed) layout, then restores
// what checkpoint_state() recorded; returns the optimizer's step count.
int64_t Checkpointer::restore_state(const ckpt::Checkpoint& c, bool same_layout) {
  const Json& extra = c.state().extra;
  auto recorded = [&](const char* key) {
    return extra.contains(key) ? extra.at(key).as_string() : std::string();
  };
  LOOM_CHECK(recorded("model_fingerprint") == s_.model_cfg.fingerprint(), c.dir(),
             ": checkpoint is for model '", recorded("model_fingerprint"),
             "', but this run's model is '", s_.model_cfg.fingerprint(), "'");
  if (!s_.whole && same_layout)
    LOOM_CHECK(recorded("layout") == s_.layout_name(), c.dir(), ": checkpoint layout '",
               recorded("layout"), "' differs from this run's '", s_.layout_name(), "'");
  LOOM_CHECK(recorded("precision") == s_.policy.name, c.dir(),
             ": checkpoint was trained with precision '", recorded("precision"),
             "', this run uses '", s_.policy.name, "'");
  if (s_.engine->loss_scaling()) s_.engine->scaler().restore(extra.at("loss_scaler"));
  const Json* fp8_state = extra.contains("fp8") ? &extra.at("fp8") : nullptr;
  s_.recipes.restore(fp8_state, c.dir());
  try {
    data_.restore(c.state().data);
  } catch (const Error& e) {
    fail(c.dir(), "/state.json: field 'data' (the data position): ", e.what());
  }
  step_ = c.state().step;
  return extra.at("optimizer_steps").as_int();
}

void Checkpointer::save() {
  // Never write non-finite weights (rotation would then delete good checkpoints).
  resil::heartbeat_section(resil::Section::Checkpoint, step_);
  check_finite(s_.model->params(), cat("step ", step_, " checkpoint"));
  if (s_.lora) check_finite(s_.lora->params(), cat("step ", step_, " checkpoint"));
  if (!writer_) {
    ckpt::CheckpointWriterOptions wo;
    wo.async = s_.opt.ckpt_async;
    wo.keep_last = s_.whole ? s_.opt.keep_last : 0;  // per-rank parts: after the global commit
    wo.timeout_s = s_.opt.ckpt_timeout;
    wo.quiet = s_.opt.quiet;
    writer_ = std::make_unique<ckpt::CheckpointWriter>(s_.checkpoint_root(), wo);
  }
  ckpt::TrainerState st = checkpoint_state(s_.dp->steps_taken());
  if (s_.rank == 0) ckpt::copy_tokenizer_in(s_.opt.out_dir, config_text_);  // served from anywhere
  // Per-rank parts: the previous step's global commit first (asynchronous: its parts are
  // durable by now), this one's after a synchronous write.
  if (!s_.whole) commit_distributed();
  // Under LoRA only the adapters: the base is train.pretrained, named in the saved config.
  // On a device the writer gets host copies (staged here, copied again by an asynchronous
  // writer's snapshot); on the CPU the buffers themselves.
  s_.staging->clear();
  writer_->save(st, s_.staging->stage(shard_list(s_, s_.dp->save_slices())),
                s_.staging->stage(optim_list()));
  s_.staging->clear();  // (nothing to upload: the writer only read them)
  if (!s_.whole && !s_.opt.ckpt_async) commit_distributed();
  if (s_.opt.quiet) return;
  if (s_.opt.ckpt_async)
    log_info("checkpoint step ", step_, ": snapshot in ", writer_->last_stall_seconds(),
             " s, writing in the background");
  else if (s_.whole)
    log_info("saved checkpoint ", s_.checkpoint_root(), "/", ckpt::step_dir_name(step_), " (",
             writer_->last_stall_seconds(), " s)");
}

void Checkpointer::finish() {
  if (!writer_) return;
  if (s_.whole)
    writer_->wait();
  else
    commit_distributed();
}

double Checkpointer::last_stall() const {
  return writer_ ? writer_->last_stall_seconds() : 0.0;
}

bool Checkpointer::resume_from(const std::string& path) {
  LOOM_CHECK(s_.whole, "a run over several ranks or a sharded layout resumes from its own ",
             "per-rank checkpoints");
  ckpt::Checkpoint c(path);
  restore(c);
  if (!s_.opt.quiet) log_info("resumed from ", c.dir(), " at step ", step_);
  return true;
}

// What every resume does once the checkpoint is chosen: the state, then this rank's weights
// and optimizer state placed as the engine holds them, and the model re-derived from them.
// Weights that are not finite are refused, naming the parameter, before anything else is read.
void Checkpointer::restore(const ckpt::Checkpoint& c) {
  check_same_global_batch(c);  // the data position means the same place only then
  const int64_t optimizer_steps = restore_state(c);
  // Read into host memory (the buffers themselves on the CPU, staged copies on a device),
  // checked, then uploaded. (A failed read before left copies behind: not uploaded now.)
  s_.staging->clear();
  const ckpt::TensorList model = s_.staging->stage(shard_list(s_, s_.dp->load_slices()));
  c.restore_model(model);
  ckpt::require_finite(model, c.dir());
  c.restore_optim(s_.staging->stage(optim_list()));
  s_.staging->upload();
  s_.dp->sync_model_from_master();
  s_.dp->set_steps_taken(optimizer_steps);
}

// The optimizer's state as a checkpoint holds it (Optimizer::state_slices(), placed by
// shard_list).
ckpt::TensorList Checkpointer::optim_list() const {
  return shard_list(s_, s_.dp->state_slices());
}

// A step counts as committed only once every rank's part is durable: the ranks exchange their
// parts' commit digests, rank 0 writes the global commit record (ckpt/global_commit.h), and only
// after that does any rank rotate older parts away, so the newest committed step always stays.
void Checkpointer::commit_distributed() {
  auto done = writer_->wait();  // this rank's write error ends the job (run())
  comm::Communicator& w = s_.pg->world();
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
  const std::string shared = s_.opt.out_dir + "/checkpoints";
  if (s_.rank == 0) {
    ckpt::GlobalCommit gc;
    gc.step = step;
    gc.layout = s_.layout_name();
    for (int r = 0; r < n; ++r) gc.parts.push_back(static_cast<uint64_t>(all[size_t(2 * r + 1)]));
    ckpt::write_global_commit(shared, gc);
  }
  w.barrier();  // the record is durable before any rank deletes an older part
  if (s_.opt.keep_last > 0) ckpt::prune_checkpoints(s_.checkpoint_root(), step, s_.opt.keep_last);
  if (s_.rank == 0) ckpt::prune_global_commits(shared, s_.checkpoint_root(), step);
  if (!s_.opt.quiet)
    log_info("checkpoint step ", step, " committed on every rank (",
             ckpt::global_commit_dir(shared), ")");
}

// The newest step that rank 0 holds a global commit record for and whose part verifies on every
// rank; parts without a record (a rank killed during the save) are ignored, and a step that
// fails verification anywhere is skipped for the one before, on every rank alike.
bool Checkpointer::resume_distributed() {
  comm::Communicator& w = s_.pg->world();
  const std::string shared = s_.opt.out_dir + "/checkpoints";
  const bool mine = ckpt::has_checkpoints(s_.checkpoint_root());
  if (w.all_reduce_scalar(int64_t(mine ? 1 : 0), comm::ReduceOp::Max) == 0) return false;
  std::vector<int64_t> committed;
  if (s_.rank == 0) committed = ckpt::list_global_commits(shared);
  int64_t below = INT64_MAX;
  for (;;) {
    // Rank 0 names the candidate and each part's digest: [step, world size, digests...].
    std::vector<int64_t> rec(size_t(2 + w.size()), -1);
    if (s_.rank == 0) {
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
      if (s_.rank == 0)
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
    const std::string dir = s_.checkpoint_root() + "/" + ckpt::step_dir_name(step);
    std::unique_ptr<ckpt::Checkpoint> c;
    try {
      c = std::make_unique<ckpt::Checkpoint>(dir);
      LOOM_CHECK(ckpt::commit_digest(dir) == static_cast<uint64_t>(rec[2 + s_.rank]), dir,
                 ": differs from the part that the global commit record of step ", step,
                 " lists (replaced after the commit)");
    } catch (const Error& e) {
      log_warn("checkpoint step ", step, " skipped on rank ", s_.rank, ": ", e.what());
      c.reset();
    }
    if (w.all_reduce_scalar(int64_t(c ? 0 : 1), comm::ReduceOp::Max) == 0) {  // all verified
      restore(*c);
      if (!s_.opt.quiet)
        log_info("resumed every rank from step ", step_, " (", s_.layout_name(), ")");
      return true;
    }
    below = step;
  }
}

// The data position is a global sample count: it means the same place in the data only under
// the same global batch (micro_batch * grad_accum * dp) and sequence length as the checkpoint's
// run, whose dp is that of the layout it was written under or consolidated from (1 for a
// one-process run). Every resume and train.init_from checks it.
void Checkpointer::check_same_global_batch(const ckpt::Checkpoint& c) const {
  const Config saved = Config::parse(c.state().config_text, c.dir() + "/state.json");
  const TrainOptions theirs_opt = train_options_from(saved);
  const int64_t micro = theirs_opt.micro_batch, accum = theirs_opt.grad_accum;
  const int64_t seq = theirs_opt.seq_len;
  int64_t dp = 1;
  const Json& extra = c.state().extra;
  if (extra.contains("consolidated_from"))
    dp = ckpt::DistributedLayout::parse(extra.at("consolidated_from").as_string()).dp;
  else if (extra.contains("layout"))  // a rank's part of a distributed run
    dp = ckpt::DistributedLayout::parse(extra.at("layout").as_string()).dp;
  const int64_t theirs = micro * accum * dp;
  const int our_dp = s_.pg->dp().size();
  const int64_t ours = int64_t(s_.opt.micro_batch) * s_.opt.grad_accum * our_dp;
  LOOM_CHECK(theirs == ours && seq == s_.opt.seq_len, c.dir(), ": trained with a global batch of ",
             theirs, " samples (micro_batch ", micro, " x grad_accum ", accum, " x dp ", dp,
             ") of ", seq, " tokens; this run's is ", ours, " (", s_.opt.micro_batch, " x ",
             s_.opt.grad_accum, " x ", our_dp, ") of ", s_.opt.seq_len,
             ": set train.micro_batch and train.grad_accum so that the products match");
}

// train.init_from: every rank reads the whole tensors of a one-process checkpoint (mapped, only
// the rows it needs) and extracts its pieces by the placement consolidation uses
// (ckpt/reshard.h), then continues the run's step, optimizer, loss scale and data position.
void Checkpointer::start_from(const std::string& path) {
  {
    // A checkpoint without training state (loom ckpt import, merge, or loom rl's output) has
    // only weights to give: they start the run at step 0, as train.pretrained would.
    ckpt::Checkpoint c(path);
    if (!c.state().extra.contains("optimizer_steps")) {
      load_pretrained(s_, path);
      s_.recipes.new_weights();
      if (!s_.opt.quiet)
        log_info("started from the weights of ", c.dir(), " (it holds no training state)");
      return;
    }
  }
  ckpt::Checkpoint c(path);
  ckpt::require_one_process(c);
  const int etp = s_.etp;
  LOOM_CHECK(etp == 1, "train.init_from: parallel.etp = ", etp,
             " (expert tensor parallelism) cannot start from a one-process checkpoint yet");
  check_same_global_batch(c);
  if (s_.whole) {  // the checkpoint's own layout: a resume
    resume_from(path);
    return;
  }
  const int64_t optimizer_steps = restore_state(c, /*same_layout=*/false);
  s_.staging->clear();
  ckpt::fill_from_whole(c, s_.trained_params(),
                        s_.staging->stage(shard_list(s_, s_.dp->load_slices())),
                        s_.staging->stage(optim_list()));
  s_.staging->upload();
  s_.dp->sync_model_from_master();
  s_.dp->set_steps_taken(optimizer_steps);
  if (!s_.opt.quiet)
    log_info("started every rank from ", c.dir(), " at step ", step_, " (", s_.layout_name(), ")");
}

bool Checkpointer::resume() {
  if (resume_across_layouts()) return true;  // the newest is another layout's
  return !s_.whole
             ? resume_distributed()
             : ckpt::has_checkpoints(s_.checkpoint_root()) && resume_from(s_.checkpoint_root());
}

// The model's parameters from a checkpoint of the same model (a one-process or consolidated
// checkpoint, or a Hugging Face import); nothing else of it is used.
// A reward model started from a language model's checkpoint: its value head (score.weight)
// is not there and keeps its seeded draw; everything else is read.
static ckpt::TensorList without_missing_head(const ckpt::Checkpoint& c, ckpt::TensorList list) {
  if (c.model().contains("score.weight")) return list;
  list.erase(std::remove_if(list.begin(), list.end(),
                            [](const ckpt::NamedTensor& t) { return t.name == "score.weight"; }),
             list.end());
  return list;
}

void load_pretrained(TrainSetup& s, const std::string& path) {
  ckpt::Checkpoint c(path);
  ckpt::require_full_model(c);
  if (s.base_shards) {
    // LoRA at ZeRO-3: this rank's flat shard of the blocks (into the shards' own copy) and the
    // parameters outside the blocks (into the model, where they stay gathered), rounded to the
    // compute type as the model would hold them. The rest of the base is never written here.
    ParamSet& P = s.model->params();
    const int64_t lo = s.base_shards->shard_begin(), hi = s.base_shards->shard_end();
    ckpt::TensorList pieces;
    for (const ParamInfo& p : P.infos()) {
      ckpt::ShardInfo info;
      if (!in_block(p.name)) {
        info.replica_id = s.pg->dp().rank();
        pieces.push_back({p.name, Tensor::view_of(P.data() + p.offset, p.shape, DType::F32), info});
        continue;
      }
      const int64_t a = std::max(p.offset, lo), b = std::min(p.offset + p.numel, hi);
      if (a >= b) continue;
      info.global_shape = {p.numel};
      info.global_offset = {a - p.offset};
      pieces.push_back(
          {p.name, Tensor::view_of(s.base_shards->own() + (a - lo), {b - a}, DType::F32), info});
    }
    // Read into host memory (the buffers themselves on the CPU, staged copies on a device),
    // checked and rounded there, then uploaded.
    s.staging->clear();
    const ckpt::TensorList host = s.staging->stage(pieces);
    ckpt::fill_from_whole(c, P, host, {});
    ckpt::require_finite(host, c.dir());
    for (const auto& piece : host)
      if (s.policy.compute != DType::F32)
        round_to(s.policy.compute, piece.tensor.data<float>(), size_t(piece.tensor.numel()));
    s.staging->upload();
    return;
  }
  // LoRA's base (before the engine exists, or under it) is whole on every rank (replicated).
  if ((!s.dp || s.lora) && s.model->tensor_parallel().size == 1 &&
      s.model->pipeline_stage().whole()) {
    // Under LoRA the base is whole (replicated) on every rank.
    s.staging->clear();
    const ckpt::TensorList host = s.staging->stage(
        without_missing_head(c, whole_views(s.model->params(), s.pg->dp().rank())));
    c.restore_model(host);
    ckpt::require_finite(host, c.dir());
    s.staging->upload();
  } else if (!s.dp || s.lora) {
    // LoRA under TP or PP (before the engine exists): each rank's whole TP shard of every
    // parameter of its pipeline stage, placed by its ParamInfo.
    s.staging->clear();
    const ckpt::TensorList host =
        s.staging->stage(whole_views(s.model->params(), s.pg->dp().rank()));
    ckpt::fill_from_whole(c, s.model->params(), host, {});
    ckpt::require_finite(host, c.dir());
    s.staging->upload();
  } else {
    s.staging->clear();
    const ckpt::TensorList slices =
        s.staging->stage(without_missing_head(c, shard_list(s, s.dp->load_slices())));
    ckpt::fill_from_whole(c, s.model->params(), slices, {});
    ckpt::require_finite(slices, c.dir());
    s.staging->upload();
    s.dp->sync_master_from_model();  // ZeRO-0: the slices are the model's weights
    s.dp->sync_model_from_master();
  }
}

}  // namespace loom
