// One mixture-of-experts layer (the MLP of a MoE block): router, top-k routing with an optional
// capacity, permutation into expert-grouped rows, the experts' MLPs as a grouped GEMM, and the
// weighted combination back into token order, each with its backward: Backend ops over backend
// buffers (kernels/backend.h, the MoE block; semantics of kernels/cpu/moe.h), so the layer runs
// on any backend. The one host read inside a step is the routing's counts per expert (2E
// integers per layer): the grouped GEMMs' sizes and the exchange's plan depend on them, as in
// Megatron's token dispatcher.
//
// Expert parallelism: with an EP group of P ranks, this rank holds experts
// [rank * E/P, (rank+1) * E/P). After the local permutation the rows for each rank's experts are
// contiguous; an ExpertExchange (model/parallel_ops.h) moves them to their owner and back:
// parallel/expert_parallel.cpp's all-to-alls under EP (and the ETP group's sums), a copy with
// P = 1, where the layer is the single-process computation. The layer does not know which.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "kernels/backend.h"
#include "kernels/buffer.h"
#include "model/model_config.h"
#include "model/parallel_ops.h"

namespace loom {

// Experts split over `size` ranks (the EP group); size 1 = every expert local.
// Expert tensor parallelism (Megatron's ETP): each expert's MLP split over `tp_size` ranks of
// the tensor-parallel group, w1 by rows of H (GeLU input, or SwiGLU gate and up alike) and w2
// by columns of F; the partial expert outputs (and input gradients) are all-reduced over that
// group. tp_size 1 = every rank of a TP group computes the experts whole (replicated).
struct ExpertParallel {
  int size = 1, rank = 0;
  comm::Communicator* comm = nullptr;  // the expert-parallel group (size > 1)
  int tp_size = 1, tp_rank = 0;
  comm::Communicator* tp_comm = nullptr;         // the expert-tensor-parallel group (tp_size > 1)
  std::shared_ptr<comm::Communicator> tp_owner;  // when that group was split off for the layout
  // The exchange of this layout, made for each MoE layer (parallel::expert_parallel_layout
  // fills it in). Without it, a layout of one rank (and etp 1) copies; a larger one holds its
  // experts' parameters but refuses to run.
  std::unique_ptr<ExpertExchange> (*make_exchange)(const ExpertParallel&, Backend&, int E,
                                                   int C) = nullptr;
  // Throws naming the values when the model's experts do not split over the group.
  void validate(const ModelConfig& cfg) const;
};

struct MoeWeights {
  float* router = nullptr;  // [E, C] (every expert: routing is replicated)
  float* w1 = nullptr;      // [E_local, H, C], H = fc_dim
  float* w2 = nullptr;      // [E_local, C, F]
};

// Routing statistics of the last forward (this rank's tokens).
struct MoeStats {
  std::vector<int64_t> assigned;  // [E] (token, slot) pairs per expert before dropping
  int64_t dropped = 0;
  int64_t a2a_send_elems = 0;  // floats this rank sent in the forward dispatch + combine
};

class MoeLayer {
 public:
  MoeLayer(const ModelConfig& cfg, const ExpertParallel& ep, Backend& backend);

  // y[N, C] (written) = MoE(x[N, C]); keeps what backward needs. Returns the auxiliary
  // load-balancing loss of these N tokens (coefficient included).
  double forward(float* y, const float* x, int N, const MoeWeights& w);
  // dx[N, C] (written) from dy[N, C]; weight gradients accumulate into g. aux_dloss is the
  // auxiliary loss's weight in the objective (its gradient scale).
  void backward(float* dx, const float* dy, const float* x, int N, const MoeWeights& w,
                const MoeWeights& g, float aux_dloss);

  // Context parallelism: this rank's N tokens are its share of the micro-batch, whose other
  // tokens live on the ranks of `group` (the CP group). The auxiliary loss's statistics (tokens
  // per expert f_e, mean router score P_e) are then summed over that group, so the loss and
  // its gradient are those of the whole micro-batch. nullptr = the tokens are the whole batch.
  void set_token_group(comm::Communicator* group) { token_group_ = group; }

  const MoeStats& stats() const { return stats_; }
  // [N, k] of the last forward, downloaded from the backend (tests and diagnostics).
  const std::vector<int32_t>& topk() const;

 private:
  // Rows of the local permuted buffer [rows, C] <-> expert-grouped rows of this rank's experts
  // [R, C] (gathered from every rank): forward sends the rows to their experts' owners.
  // The auxiliary loss of the micro-batch (forward: dscores null) or its gradient added into
  // dscores with weight aux_dloss; over the token group's statistics when there is one.
  double aux_loss(float* dscores, float aux_dloss);

  ModelConfig cfg_;
  ExpertParallel ep_;
  Backend& be_;
  int C_, E_, El_, k_, F_, H_;  // F_, H_: this rank's slice of the expert MLP width
  bool sigmoid_, swiglu_;
  // Saved between forward and backward (backend buffers).
  int N_ = 0, rows_ = 0;
  BackendBuffer scores_, topk_idx_, topk_w_, plan_, xp_, yp_, xe_, h_, a_, ye_;
  std::vector<int32_t> local_offsets_;  // [El + 1] expert-grouped rows of this rank's experts
  std::unique_ptr<ExpertExchange> xchg_;
  // Scratch.
  BackendBuffer logits_, dscores_, dlogits_, dtopk_w_, dyp_, dye_, dxe_, dxp_, da_, dh_, dxr_;
  BackendBuffer group_buf_;  // [2E + 1] the token group's statistics; [E] their gradient row
  MoeStats stats_;
  comm::Communicator* token_group_ = nullptr;
  std::vector<double> group_f_;  // [E] the token group's f_e (kept for backward)
  mutable std::vector<int32_t> topk_host_;
};

}  // namespace loom
