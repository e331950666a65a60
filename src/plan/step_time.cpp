#include "plan/step_time.h"

#include <algorithm>
#include <cmath>

#include "plan/memory.h"

namespace loom::plan {

const Efficiency& default_efficiency() {
  static const Efficiency e;
  return e;
}

double gemm_efficiency(const ClusterSpec& c, Precision p, double M, double N, double K,
                       const Efficiency& e) {
  double top = p == Precision::fp8 ? c.gpu.gemm_eff_fp8 : c.gpu.gemm_eff_bf16;
  double d0 = c.gpu.gemm_dim0 > 0 ? c.gpu.gemm_dim0 : e.gemm_dim0;
  return top / (1 + d0 * (1 / M + 1 / N + 1 / K));
}

namespace {

// A process group of `size` ranks whose members are `stride` ranks apart (Megatron's order:
// TP innermost, then CP, then DP (EP inside it), PP outermost). It stays on NVLink when all
// its members fit in one node.
struct Link {
  double bw = 0, lat = 0;
  std::string name;
  double reduce = 0, reduce_scatter = 0;  // bytes/s at which received data is summed; 0: free
};
Link link_for(const ClusterSpec& c, const Efficiency& e, int64_t stride, int64_t size) {
  if (size <= 1) return {1e30, 0, "none", 0, 0};
  const double sum = c.reduce_bw_gbs * 1e9;
  const double rs_sum = c.reduce_scatter_bw_gbs > 0 ? c.reduce_scatter_bw_gbs * 1e9 : sum;
  double intra = c.link_eff > 0 ? c.link_eff : e.link_eff_intra;
  double inter = c.link_eff > 0 ? c.link_eff : e.link_eff_inter;
  if (stride * size <= c.gpus_per_node)
    return {c.intra_bw_gbs * 1e9 * intra, c.intra_lat_us * 1e-6, "nvlink", sum, rs_sum};
  return {c.inter_bw_gbs * 1e9 * inter, c.inter_lat_us * 1e-6, "network", sum, rs_sum};
}

// Ring collectives: bytes is the full buffer size on each rank. Summing (all-reduce,
// reduce-scatter) costs (g-1)/g of the buffer at the link's summing rate where it has one.
double summing(double bytes, int64_t g, double rate) {
  return rate > 0 ? double(g - 1) / g * bytes / rate : 0;
}
double all_reduce(double bytes, int64_t g, const Link& l) {
  if (g <= 1) return 0;
  return 2.0 * (g - 1) / g * bytes / l.bw + 2.0 * (g - 1) * l.lat + summing(bytes, g, l.reduce);
}
double gather_or_scatter(double bytes, int64_t g, const Link& l) {
  if (g <= 1) return 0;
  return double(g - 1) / g * bytes / l.bw + double(g - 1) * l.lat;
}

struct LayerTime {
  double compute_fwd = 0, compute_bwd = 0, recompute = 0;
  double tp_fwd = 0, cp_fwd = 0, cp_bwd = 0, ep = 0;
  double attn_fwd = 0;
};

}  // namespace

StepBreakdown step_time(const ModelSpec& m, const ClusterSpec& c, const TrainSpec& t,
                        const Efficiency& e) {
  StepBreakdown r;
  const double h = m.hidden, f = m.ffn, q = double(m.heads) * m.hd(), kvd = double(m.kv()) * m.hd(),
               V = m.vocab;
  const double tp = double(t.tp);
  const bool sp = t.sequence_parallel && t.tp > 1;
  const double n = double(t.micro_batch) * m.seq / t.cp;  // tokens per micro-batch per GPU
  const double k = m.moe() ? double(m.top_k) : 1.0;
  const double hbm = c.gpu.hbm_bw_gbs * 1e9;
  const double peak_bf16 = c.gpu.peak_bf16_tflops * 1e12;
  const double peak_fp32 =
      c.gpu.peak_fp32_tflops > 0 ? c.gpu.peak_fp32_tflops * 1e12 : peak_bf16 / 2;  // TF32
  const double peak_gemm = t.precision == Precision::fp8    ? c.gpu.peak_fp8_tflops * 1e12
                           : t.precision == Precision::fp32 ? peak_fp32
                                                            : peak_bf16;
  // Attention runs in bf16 under bf16/fp16/fp8 training, in fp32 under fp32.
  const double peak_attn = t.precision == Precision::fp32 ? peak_fp32 : peak_bf16;
  // Bytes of one activation element (elementwise traffic, TP/SP and pipeline messages).
  const double act = t.precision == Precision::fp32 ? 4 : 2;
  const bool overlap_ok = c.comm_overlaps_compute;
  auto gemm = [&](double M, double N, double K) {
    return 2 * M * N * K / (peak_gemm * gemm_efficiency(c, t.precision, M, N, K, e));
  };

  Link tp_link = link_for(c, e, 1, t.tp);
  Link cp_link = link_for(c, e, t.tp, t.cp);
  Link ep_link = link_for(c, e, t.tp, t.ep);
  Link dp_link = link_for(c, e, t.tp * t.cp, t.dp);
  Link pp_link = link_for(c, e, t.tp * t.cp * t.dp, t.pp);
  r.tp_link = tp_link.name;
  r.cp_link = cp_link.name;
  r.ep_link = ep_link.name;
  r.dp_link = dp_link.name;
  r.pp_link = pp_link.name;

  // ---- one transformer layer, one micro-batch, one GPU ----
  LayerTime L;
  const double up = m.gated_mlp ? 2 * f : f;
  double g = gemm(n, (q + 2 * kvd) / tp, h) + gemm(n, h, q / tp);
  if (m.moe()) {
    double per_expert_tokens = n * k * t.ep / m.experts;  // tokens one local expert sees
    double local_experts = double(m.experts / t.ep);
    g += local_experts * (gemm(per_expert_tokens, up / tp, h) + gemm(per_expert_tokens, h, f / tp));
  } else {
    g += gemm(n, up / tp, h) + gemm(n, h, f / tp);
  }
  // Attention core: flash attention skips the masked half of causal attention; the unfused
  // kernels compute all of s x s and stream it through HBM (QK^T write, softmax read/write,
  // dropout mask and output, AV read: ~13 bytes per score).
  double attn_flops = attention_flops_per_token(m, m.seq) * n / tp * (t.flash_attention ? 0.5 : 1);
  double attn_eff = c.gpu.gemm_eff_bf16 * e.attention_rel;
  double attn_f = attn_flops / (peak_attn * attn_eff);
  double attn_b = attn_f * (t.flash_attention ? 2.5 : 2.0);  // flash bwd: 5 GEMMs vs 2
  if (!t.flash_attention) {
    double scores = n * m.seq * double(m.heads) / tp;
    attn_f += scores * 13 / hbm;
    attn_b += scores * 26 / hbm;
  }
  // elementwise_bytes is counted for 2-byte activations.
  // Its tensors stream from the cache instead of HBM when one layer's fit there.
  const double elem_elems = n * (h / (sp ? tp : 1) + k * up / tp);
  const double elem_bw = c.gpu.cache_bw_gbs > 0 && elem_elems * act <= c.gpu.cache_mb * 1e6
                             ? c.gpu.cache_bw_gbs * 1e9
                             : hbm;
  double elem = e.elementwise_bytes * act / 2 * elem_elems / elem_bw;
  L.attn_fwd = attn_f;
  L.compute_fwd = g + attn_f + elem;
  L.compute_bwd = 2 * g + attn_b + 2 * elem;
  // FP8 recipes' own costs (issue 18): a quantisation pass over every block GEMM input, x in
  // forward and dy in backward (no fusion into the producing kernel assumed). Bytes per
  // element: read bf16 (2) + write fp8 (1) + the transposed fp8 copy for the other GEMM (1);
  // current scaling reads the tensor once more for its amax (2); MXFP8 writes its row- and
  // column-blocked copies plus a scale byte per 32. Current scaling also max-reduces each
  // amax over TP (one latency-bound all-reduce per quantised tensor); the weights' pass and
  // delayed scaling's one amax all-reduce are per step (below, with the optimizer).
  const bool fp8 = t.precision == Precision::fp8;
  if (fp8) {
    const double qb = t.fp8_recipe == Fp8Recipe::current ? 6
                      : t.fp8_recipe == Fp8Recipe::mxfp8 ? 4 + 2.0 / 32
                                                         : 4;
    const double x_elems = n * (2 * h / (sp ? tp : 1) + q / tp + f / tp);
    const double dy_elems = n * ((q + 2 * kvd) / tp + 2 * h / (sp ? tp : 1) + up / tp);
    L.compute_fwd += qb * x_elems / hbm;
    L.compute_bwd += qb * dy_elems / hbm;
    if (t.fp8_recipe == Fp8Recipe::current && t.tp > 1) {
      L.compute_fwd += 4 * all_reduce(4, t.tp, tp_link);
      L.compute_bwd += 4 * all_reduce(4, t.tp, tp_link);
    }
  }

  // TP: two all-reduces per layer per pass (or all-gather + reduce-scatter with SP: same bytes).
  if (t.tp > 1) {
    double per_pass = 2 * all_reduce(n * h * act, t.tp, tp_link);
    L.tp_fwd = per_pass * (t.tp_comm_overlap && overlap_ok ? 1 - e.tp_overlap : 1);
  }
  // CP: ring exchange of K and V chunks, hidden behind the attention it feeds.
  if (t.cp > 1) {
    double kv_bytes = n * 2 * kvd / std::min<double>(tp, double(m.kv())) * act;
    double ring = double(t.cp - 1) * (kv_bytes / cp_link.bw + cp_link.lat);
    L.cp_fwd = std::max(0.0, ring - attn_f);
    L.cp_bwd = std::max(0.0, 2 * ring - attn_b);
  }
  // EP: dispatch and combine all-to-alls of the k routed copies, forward and backward.
  // Each rank sends its n k routed token copies, (ep-1)/ep of them leave the rank.
  if (m.moe() && t.ep > 1) L.ep = 2 * gather_or_scatter(n * k * h * act, t.ep, ep_link);
  double layer_fwd = L.compute_fwd + L.tp_fwd + L.cp_fwd + L.ep;
  double layer_bwd = L.compute_bwd + L.tp_fwd + L.cp_bwd + L.ep;
  double layer_recompute = t.recompute == Recompute::Full        ? layer_fwd
                           : t.recompute == Recompute::Selective ? attn_f
                                                                 : 0;

  // ---- stages ----
  const double logit_bw = c.gpu.cache_bw_gbs > 0 && n * V / tp * act <= c.gpu.cache_mb * 1e6
                              ? c.gpu.cache_bw_gbs * 1e9
                              : hbm;
  double logits = 3 * gemm(n, V / tp, h) + 8 * act * n * V / tp / logit_bw;
  StageParams first = stage_params(m, t, Stage::first), last = stage_params(m, t, Stage::last);
  int64_t middle_layers = pipeline_slots(m, t) / t.pp;
  double per_layer = layer_fwd + layer_bwd + layer_recompute;
  double t_first = first.layers * per_layer + (first.has_output ? logits : 0);
  double t_last = last.layers * per_layer + logits;
  double t_mid = t.pp > 2 ? middle_layers * per_layer : 0;
  r.stage_time = std::max({t_first, t_last, t_mid});
  int64_t bottleneck_layers = r.stage_time == t_last    ? last.layers
                              : r.stage_time == t_first ? first.layers
                                                        : middle_layers;
  r.stage_tp_comm = bottleneck_layers * L.tp_fwd * (2 + (t.recompute == Recompute::Full ? 1 : 0));
  r.stage_cp_comm = bottleneck_layers * (L.cp_fwd + L.cp_bwd);
  r.stage_ep_comm = bottleneck_layers * 2 * L.ep;
  r.stage_compute = r.stage_time - r.stage_tp_comm - r.stage_cp_comm - r.stage_ep_comm;

  const int64_t mb = micro_batches(t);
  r.bubble = double(t.pp - 1) / t.vp * r.stage_time;
  r.pipeline = mb * r.stage_time + r.bubble;
  if (t.pp > 1) {
    double bytes = n * h * act / tp;  // activations cross stages split over TP ranks
    r.p2p = double(mb) * 2 * t.vp * (bytes / pp_link.bw + pp_link.lat);
  }

  // ---- data parallel / ZeRO ----
  const StateBytes sb = state_bytes(t.precision, t.optimizer, t.grad_fp32);
  StageParams heavy = first.total() >= last.total() ? first : last;
  auto dp_time = [&](double params, int64_t d) {
    if (d <= 1 || params <= 0) return std::pair<double, double>{0, 0};
    double grads = params * sb.grad, weights = params * sb.weight;
    if (t.zero_stage == 0) return std::pair<double, double>{all_reduce(grads, d, dp_link), 0};
    double rs = gather_or_scatter(grads, d, dp_link) + summing(grads, d, dp_link.reduce_scatter),
           ag = gather_or_scatter(weights, d, dp_link);
    if (t.zero_stage == 3) return std::pair<double, double>{rs * mb, 2 * ag * mb};
    return std::pair<double, double>{rs, ag};
  };
  auto [rs_dense, ag_dense] = dp_time(heavy.dense, t.dp * t.cp);
  auto [rs_exp, ag_exp] = dp_time(heavy.experts, t.dp * t.cp / t.ep);
  double reduce = rs_dense + rs_exp, gather = ag_dense + ag_exp;
  r.dp_comm = reduce + gather;
  double bwd_window = heavy.layers * (layer_bwd + layer_recompute);
  double fwd_window = heavy.layers * layer_fwd;
  if (t.zero_stage == 3) {  // per-micro-batch gathers overlap the whole pipeline
    bwd_window *= double(mb);
    fwd_window *= double(mb);
  }
  auto exposed = [&](double comm, double window, bool overlap) {
    if (!overlap || !overlap_ok) return comm;
    return std::max(comm * (1 - e.dp_overlap), comm - window);
  };
  r.dp_exposed = exposed(reduce, bwd_window, t.overlap_grad_reduce) +
                 exposed(gather, fwd_window, t.overlap_param_gather);

  // ---- optimizer: streams grads, master weights and moments through HBM ----
  double local = heavy.dense / (t.zero_stage >= 1 ? double(t.dp * t.cp) : 1.0) +
                 heavy.experts / (t.zero_stage >= 1 ? double(t.dp * t.cp / t.ep) : 1.0);
  double master = sb.optimizer - (t.optimizer == Optimizer::adam  ? 8
                                  : t.optimizer == Optimizer::sgd ? 4
                                                                  : 2);
  double touched = sb.grad + 2 * (sb.optimizer - master) + 2 * master + sb.weight;
  r.optimizer = local * touched / hbm;
  if (fp8) {  // the weights' quantisation once per step: read, write, transposed copy (+ amax)
    const double wq = t.fp8_recipe == Fp8Recipe::current ? 6 : 4;
    r.optimizer +=
        heavy.dense * wq / hbm;  // per-rank parameters (embedding included: an upper bound)
    if (t.fp8_recipe == Fp8Recipe::delayed)  // every amax of the stage in one all-reduce
      r.optimizer +=
          all_reduce(heavy.layers * 12 * 4.0, t.dp * t.tp, link_for(c, e, 1, t.dp * t.tp));
  }

  r.step = r.pipeline + r.p2p + r.dp_exposed + r.optimizer;

  // ---- rates ----
  const double tokens = double(t.global_batch) * m.seq;
  const double attn_reported = attention_flops_per_token(m, m.seq) * (t.causal_flops ? 0.5 : 1);
  const double layer_tok = layer_gemm_flops_per_token(m) + attn_reported;
  r.model_flops_per_step = 3 * tokens * (m.layers * layer_tok + logits_flops_per_token(m));
  double recompute_tok = t.recompute == Recompute::Full        ? layer_tok
                         : t.recompute == Recompute::Selective ? attn_reported
                                                               : 0;
  r.hardware_flops_per_step = r.model_flops_per_step + tokens * m.layers * recompute_tok;
  const double world = double(world_size(t));
  r.tokens_per_s = tokens / r.step;
  r.tflops_per_gpu = r.model_flops_per_step / r.step / world / 1e12;
  r.hw_tflops_per_gpu = r.hardware_flops_per_step / r.step / world / 1e12;
  r.mfu =
      r.tflops_per_gpu * 1e12 / peak_bf16;  // against the dense bf16 peak, whatever the precision
  return r;
}

}  // namespace loom::plan
