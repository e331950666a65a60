#include "plan/memory.h"

#include <algorithm>

namespace loom::plan {

StateBytes state_bytes(Precision p, Optimizer o, bool grad_fp32) {
  StateBytes s;
  s.weight = p == Precision::fp32 ? 4 : 2;  // fp8 training keeps bf16 weights
  s.grad = grad_fp32 ? 4 : s.weight;
  double master = p == Precision::fp32 ? 0 : 4;  // fp32 master copy for low-precision weights
  double moments = o == Optimizer::adam ? 8 : o == Optimizer::sgd ? 4 : 2;
  s.optimizer = master + moments;
  return s;
}

double bytes_per_param(const StateBytes& s, int zero_stage, double d) {
  switch (zero_stage) {
    case 0:
      return s.weight + s.grad + s.optimizer;
    case 1:
      return s.weight + s.grad + s.optimizer / d;
    case 2:
      return s.weight + (s.grad + s.optimizer) / d;
    default:
      return (s.weight + s.grad + s.optimizer) / d;
  }
}

StageParams stage_params(const ModelSpec& m, const TrainSpec& t, Stage which) {
  ParamCounts p = count_params(m);
  StageParams sp;
  int64_t per_stage = pipeline_slots(m, t) / t.pp;
  sp.has_embedding = which == Stage::first || t.pp == 1;
  sp.has_output = which == Stage::last || t.pp == 1;
  sp.layers = per_stage;
  if (t.pipeline_embedding_as_layer)
    sp.layers -= (sp.has_embedding ? 1 : 0) + (sp.has_output ? 1 : 0);
  const double tp = double(t.tp);
  // Norms and the router are replicated across TP ranks; everything else is split.
  double dense_layer = p.attn / tp + p.norms + p.router + (m.moe() ? 0 : p.mlp / tp);
  double expert_layer = m.moe() ? p.mlp * double(m.experts / t.ep) / tp : 0;
  sp.dense = sp.layers * dense_layer + (sp.has_embedding ? p.embedding / tp : 0) +
             (sp.has_output ? p.output / tp : 0);
  sp.experts = sp.layers * expert_layer;
  return sp;
}

double activation_bytes_per_token_layer(const ModelSpec& m, const TrainSpec& t, Recompute r) {
  const double h = m.hidden, q = double(m.heads) * m.hd(), kvd = double(m.kv()) * m.hd();
  const double tp = double(t.tp);
  const bool sp = t.sequence_parallel && t.tp > 1;
  const double k = m.moe() ? double(m.top_k) : 1.0;
  if (r == Recompute::Full) return 2 * h / (sp ? tp : 1);  // the layer input only
  // GEMM inputs saved for backward: bf16, or the fp8 copy FP8 training casts them to.
  const double gin = t.precision == Precision::fp8 ? 1 : t.precision == Precision::fp32 ? 4 : 2;
  const double act = t.precision == Precision::fp32 ? 4 : 2;
  // Not split by TP (unless sequence parallel): the inputs of both norms, of the QKV and of
  // the first MLP GEMM (k routed copies for MoE), and the two dropout masks (1 byte each).
  double replicated = act * h * 2 + gin * h + gin * h * k + (m.dropout ? 2 * h : 0);
  // Split by TP: Q, K, V, the attention output (out-projection input), and the MLP
  // activations (gated: gate and up outputs + their product, the fc2 input; else: the
  // activation input and the fc2 input).
  double mlp_act = ((m.gated_mlp ? 2.0 : 1.0) * act + gin) * m.ffn * k;
  double split = act * (q + 2 * kvd) + gin * q + mlp_act;
  // Per-token share of the s x s attention matrices: softmax output (2 bytes), and with
  // dropout its mask (1) and output (2). Flash attention keeps only a fp32 log-sum-exp.
  double quad =
      t.flash_attention ? 4.0 * m.heads : (2.0 + (m.dropout ? 3.0 : 0.0)) * m.heads * double(m.seq);
  if (r == Recompute::Selective) quad = 0;  // core attention recomputed in backward
  return sp ? (replicated + split + quad) / tp : replicated + (split + quad) / tp;
}

MemoryBreakdown memory_per_gpu(const ModelSpec& m, const ClusterSpec& c, const TrainSpec& t) {
  const StateBytes sb = state_bytes(t.precision, t.optimizer, t.grad_fp32);
  const double d_dense = double(t.dp * t.cp);
  const double d_expert = d_dense / double(t.ep);
  const double n = double(t.micro_batch) * m.seq / t.cp;  // tokens per micro-batch per GPU
  const double h = m.hidden, tp = double(t.tp);
  const bool sp = t.sequence_parallel && t.tp > 1;
  const int64_t mb = micro_batches(t);
  const int64_t chunks = t.pp * t.vp;

  MemoryBreakdown best;
  for (Stage which : {Stage::first, Stage::last}) {
    StageParams sp_params = stage_params(m, t, which);
    MemoryBreakdown mem;
    mem.capacity = c.gpu.hbm_gb * 1e9;
    mem.worst_stage = which == Stage::first ? "first" : "last";
    auto add_state = [&](double params, double d) {
      double w = t.zero_stage == 3 ? sb.weight / d : sb.weight;
      double g = t.zero_stage >= 2 ? sb.grad / d : sb.grad;
      double o = t.zero_stage >= 1 ? sb.optimizer / d : sb.optimizer;
      mem.weights += params * w;
      mem.grads += params * g;
      mem.optimizer += params * o;
    };
    add_state(sp_params.dense, d_dense);
    add_state(sp_params.experts, d_expert);

    // In-flight micro-batches: 1F1B keeps min(p, m) on the first stage; the interleaved
    // schedule keeps L/(p v) layers for (p v + p - 1) chunk-micro-batches (Korthikanti sec. 4.2.3).
    double per_layer = n * activation_bytes_per_token_layer(m, t, t.recompute);
    double layers_in_flight;
    if (which == Stage::last && t.pp > 1) {
      // The last stage runs each micro-batch's backward right after its forward; interleaved,
      // it still warms up (v - 1) p chunk-micro-batches.
      layers_in_flight =
          double(sp_params.layers) / t.vp * std::min<int64_t>((t.vp - 1) * t.pp + 1, mb * t.vp);
    } else if (t.vp == 1) {
      layers_in_flight = double(sp_params.layers) * std::min<int64_t>(t.pp, mb);
    } else {
      layers_in_flight =
          double(sp_params.layers) / t.vp * std::min<int64_t>(chunks + t.pp - 1, mb * t.vp);
    }
    mem.activations = per_layer * layers_in_flight;
    // Full recompute rebuilds one layer's complete activations during its backward.
    if (t.recompute == Recompute::Full)
      mem.activations += n * activation_bytes_per_token_layer(m, t, Recompute::None);
    if (sp_params.has_output)  // logits in bf16 plus the fp32 copy the loss works on
      mem.activations += n * double(m.vocab) / tp * 6;
    if (sp_params.has_embedding && m.dropout) mem.activations += n * h * 3 / (sp ? tp : 1);

    // Communication buffers: the gathered sequence-parallel activation, pipeline send/recv
    // buffers, one DP bucket (40M parameters), MoE dispatch buffers, ZeRO-3 gathered layers.
    double buffers = 0;
    if (t.tp > 1) buffers += n * h * 2;
    if (t.pp > 1) buffers += 4 * n * h * 2 / (sp ? tp : 1);
    if (t.dp * t.cp > 1) buffers += 40e6 * sb.grad;
    if (m.moe() && t.ep > 1) buffers += 2 * n * m.top_k * h * 2;
    if (t.zero_stage == 3) {
      ParamCounts pc = count_params(m);
      buffers += 2 * (pc.per_layer_dense() + pc.per_layer_experts(m) / t.ep) / tp * sb.weight;
    }
    mem.comm_buffers = buffers;
    mem.reserve = 1.5e9;  // CUDA context, cuBLAS and NCCL workspaces, allocator slack
    if (mem.total() > best.total()) best = mem;
  }
  return best;
}

}  // namespace loom::plan
