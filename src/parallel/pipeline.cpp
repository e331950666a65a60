#include "parallel/pipeline.h"

#include <algorithm>

#include "core/error.h"
#include "core/log.h"

namespace loom::parallel {

PipelineStage pipeline_stage_of(const pp::StageLayout& layout, int rank) {
  PipelineStage st;
  for (int c = 0; c < layout.v; ++c) {
    const pp::LayerRange& r = layout.of(rank, c);
    st.chunks.push_back({r.begin, r.end});
  }
  st.first = rank == 0;
  st.last = rank == layout.p - 1;
  return st;
}

PipelineRunner::PipelineRunner(Decoder& model, comm::Communicator& pp, pp::Schedule schedule)
    : model_(model), stage_(model), pp_(pp), schedule_(std::move(schedule)) {
  LOOM_CHECK(schedule_.p == pp.size(), "a schedule for ", schedule_.p,
             " pipeline ranks on a group of ", pp.size());
  LOOM_CHECK(stage_.num_chunks() == schedule_.v, "the model stage has ", stage_.num_chunks(),
             " chunks but the schedule ", schedule_.v, " per rank");
  const int p = pp.size(), r = pp.rank();
  if (p > 1 && model.config().tied) {
    const bool end = r == 0 || r == p - 1;
    tied_ = pp.split(end ? 0 : 1, r, "pp-tied-embedding");
    if (!end) tied_.reset();
  }
}

int PipelineRunner::tag(int microbatch, int stage, int kind) const {
  return (microbatch * schedule_.num_stages() + stage) * 2 + kind;
}

float* PipelineRunner::buffer(Buffers& m, int mb, int chunk) {
  return m[{mb, chunk}].ensure_n<float>(model_.backend(), size_t(std::max<int64_t>(n_, 1)),
                                        "pipeline");
}

void PipelineRunner::copy_local(Buffers& to, const Buffers& from, int mb, int to_chunk,
                                int from_chunk) {
  float* dst = buffer(to, mb, to_chunk);
  model_.backend().copy_d2d(dst, from.at({mb, from_chunk}).data(), size_t(n_) * sizeof(float));
}

double PipelineRunner::run(const std::vector<ModelInput>& micro, float dloss) {
  LOOM_CHECK(static_cast<int>(micro.size()) == schedule_.m, "the schedule runs ", schedule_.m,
             " micro-batches per step, got ", micro.size());
  n_ = stage_.act_elems(micro[0].N);
  for (const auto& in : micro)
    LOOM_CHECK(stage_.act_elems(in.N) == n_,
               "pipeline micro-batches must all have the same number of tokens");
  const int p = schedule_.p, me = pp_.rank();
  std::map<std::pair<int, int>, comm::Work> recv_act, recv_grad;
  std::vector<comm::Work> sends;
  double loss = 0, busy = 0;
  aux_ = 0;
  const double t_start = now_seconds();
  for (const pp::Action& a : schedule_.ranks[me]) {
    const int mb = a.microbatch, c = a.chunk, stage = schedule_.stage_of(me, c);
    const ModelInput& in = micro[mb];
    switch (a.op) {
      case pp::Op::RecvAct:  // from stage - 1
        recv_act[{mb, c}] =
            pp_.recv_async(buffer(act_in_, mb, c), n_, DType::F32, a.peer, tag(mb, stage, 0));
        break;
      case pp::Op::RecvGrad:  // from stage + 1
        recv_grad[{mb, c}] =
            pp_.recv_async(buffer(grad_in_, mb, c), n_, DType::F32, a.peer, tag(mb, stage, 1));
        break;
      case pp::Op::SendAct:
        sends.push_back(pp_.send_async(act_out_.at({mb, c}).as<float>(), n_, DType::F32, a.peer,
                                       tag(mb, stage + 1, 0)));
        break;
      case pp::Op::SendGrad:
        sends.push_back(pp_.send_async(grad_out_.at({mb, c}).as<float>(), n_, DType::F32, a.peer,
                                       tag(mb, stage - 1, 1)));
        break;
      case pp::Op::Forward: {
        const float* x_in = nullptr;
        if (!stage_.is_first_stage(c)) {
          // Stage s-1 on this rank (p = 1 with v > 1): its output is local.
          if (p == 1) copy_local(act_in_, act_out_, mb, c, c - 1);
          auto it = recv_act.find({mb, c});
          if (it != recv_act.end()) it->second.wait();
          x_in = act_in_.at({mb, c}).as<float>();
        }
        if (!stage_.is_last_stage(c)) {
          float* out = buffer(act_out_, mb, c);
          if (before_micro) before_micro(mb);
          const double t = now_seconds();
          stage_.forward(c, in, x_in, out);
          busy += now_seconds() - t;
        }
        break;
      }
      case pp::Op::Backward: {
        const float* x_in = stage_.is_first_stage(c) ? nullptr : act_in_.at({mb, c}).as<float>();
        const float* dx_out = nullptr;
        if (!stage_.is_last_stage(c)) {
          if (p == 1) copy_local(grad_in_, grad_out_, mb, c, c + 1);
          auto it = recv_grad.find({mb, c});
          if (it != recv_grad.end()) it->second.wait();
          dx_out = grad_in_.at({mb, c}).as<float>();
        }
        float* dx_in = stage_.is_first_stage(c) ? nullptr : buffer(grad_out_, mb, c);
        if (before_micro) before_micro(mb);
        const double t = now_seconds();
        loss += stage_.backward(c, in, x_in, dx_out, dx_in, dloss);
        busy += now_seconds() - t;
        aux_ += model_.last_aux_loss();
        break;
      }
    }
  }
  for (auto& w : sends) w.wait();
  const double total = now_seconds() - t_start;
  idle_ = total > 0 ? std::max(0.0, 1.0 - busy / total) : 0.0;
  // (A frozen embedding, LoRA's base, has no gradient to keep equal.)
  // Every micro-batch's backward is done: lazily zeroed gradients nobody wrote are zeros now
  // (a stage without the embedding never ran Decoder::embed_backward, which settles).
  model_.params().settle_grads();
  if (tied_ && model_.params().info("embed.wte").trainable) {
    ParamSet& P = model_.params();
    const ParamInfo& e = P.info("embed.wte");
    tied_->all_reduce(P.grad() + e.offset, e.numel, DType::F32, comm::ReduceOp::Sum);
  }
  return loss;
}

double PipelineRunner::forward_only(const std::vector<ModelInput>& micro,
                                    std::vector<StepOutputs>* outs) {
  // Windows of m micro-batches hold at most the activation buffers of a training step.
  const size_t window = size_t(schedule_.m);
  if (outs) {
    outs->assign(micro.size(), StepOutputs{});
    if (!model_.pipeline_stage().last) outs = nullptr;  // the head is elsewhere
  }
  double loss = 0;
  for (size_t j = 0; j < micro.size(); j += window)
    loss += forward_window(micro.data() + j, static_cast<int>(std::min(window, micro.size() - j)),
                           static_cast<int>(j), outs);
  return loss;
}

// Chunk by chunk, micro-batch by micro-batch within a chunk: the forward of (chunk c,
// micro-batch j) on rank r waits only for (c, j, r-1), or (c-1, j, p-1) on rank 0, and for this
// rank's earlier (c', j') -- all earlier in the order (c, j, r), so the ranks never wait on each
// other in a cycle, and stage s+1 runs micro-batch j while stage s runs j+1. Every receive is
// posted up front; the sends are waited at the end of the window, so every message of the window
// is matched inside it.
double PipelineRunner::forward_window(const ModelInput* micro, int m, int first,
                                      std::vector<StepOutputs>* outs) {
  const int p = schedule_.p, v = schedule_.v, me = pp_.rank();
  const int from = (me + p - 1) % p, to = (me + 1) % p;
  n_ = stage_.act_elems(micro[0].N);
  for (int j = 0; j < m; ++j)
    LOOM_CHECK(stage_.act_elems(micro[j].N) == n_,
               "pipeline micro-batches must all have the same number of tokens");
  std::map<std::pair<int, int>, comm::Work> recv_act;
  if (p > 1)
    for (int c = 0; c < v; ++c)
      for (int j = 0; j < m && !stage_.is_first_stage(c); ++j)
        recv_act[{j, c}] = pp_.recv_async(buffer(act_in_, j, c), n_, DType::F32, from,
                                          tag(j, schedule_.stage_of(me, c), 0));
  std::vector<comm::Work> sends;
  double loss = 0;
  for (int c = 0; c < v; ++c) {
    const int stage = schedule_.stage_of(me, c);
    for (int j = 0; j < m; ++j) {
      const float* x_in = nullptr;
      if (!stage_.is_first_stage(c)) {
        if (p == 1)  // stage s-1 is this rank's previous chunk
          copy_local(act_in_, act_out_, j, c, c - 1);
        else
          recv_act.at({j, c}).wait();
        x_in = act_in_.at({j, c}).as<float>();
      }
      float* x_out = stage_.is_last_stage(c) ? nullptr : buffer(act_out_, j, c);
      if (before_micro) before_micro(first + j);
      StepOutputs* out = outs && stage_.is_last_stage(c) ? &(*outs)[size_t(first + j)] : nullptr;
      loss += stage_.forward_loss(c, micro[j], x_in, x_out, out);
      if (x_out && p > 1)
        sends.push_back(pp_.send_async(x_out, n_, DType::F32, to, tag(j, stage + 1, 0)));
    }
  }
  for (auto& w : sends) w.wait();
  return loss;
}

std::vector<double> PipelineRunner::grad_norm_weights() const {
  std::vector<double> w;
  const bool last_only = tied_ && pp_.rank() != 0;
  for (const ParamInfo& p : model_.params().infos())
    w.push_back(last_only && p.name == "embed.wte" ? 0.0 : 1.0);
  return w;
}

}  // namespace loom::parallel
