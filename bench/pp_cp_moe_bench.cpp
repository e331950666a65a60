// Pipeline, context-parallel and MoE measurements, run as an MPI job on W ranks (e.g. mpirun -n 2 build/bench/bench_5d):
//  1. pipeline bubble: each rank's idle fraction over a step (PipelineRunner timestamps: time
//     not spent in forward/backward computations), averaged over ranks, for GPipe, 1F1B and
//     interleaved schedules with p = W; against the ideal (p-1)/(v*m) bubble (as a fraction of
//     the compute time; the idle fraction of the step is (p-1)/(v*m+p-1));
//  2. context-parallel ring attention (CP = W): the block transfers' duration when each is
//     waited before the computation (no overlap: the whole transfer exposed), against the wait
//     that remains when the transfer runs during the local block computation; hidden = 1 -
//     exposed/transfer;
//  3. MoE (EP = W, 8 experts, top-2, dropless): tokens per expert (max/mean, coefficient of
//     variation) and all-to-all bytes per step, at initialisation and after a few steps.
// Prints figures; asserts nothing. Timings on a shared 2-core machine vary by tens of percent.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/log.h"
#include "core/rng.h"
#include "parallel/data_parallel.h"
#include "parallel/pipeline.h"
#include "parallel/ring_attention.h"
#include "parallel/tensor_parallel.h"
#include "train/batch.h"

using namespace loom;
using namespace loom::parallel;

namespace {

ModelConfig model(int layers, int d, int vocab) {
  ModelConfig c = model_preset("tiny");
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = 4;
  c.n_kv_head = 4;
  c.head_dim = d / 4;
  c.d_ff = 4 * d;
  c.vocab = vocab;
  c.max_seq = 256;
  return c;
}

void bubble(comm::Communicator& w) {
  const int p = w.size();
  comm::ParallelDims dims;
  dims.pp = p;
  comm::ProcessGroups pg(w, dims);
  struct Case {
    pp::ScheduleKind kind;
    int v, m;
  };
  std::vector<Case> cases = {
      {pp::ScheduleKind::GPipe, 1, 2},          {pp::ScheduleKind::GPipe, 1, 8},
      {pp::ScheduleKind::OneFOneB, 1, 2},       {pp::ScheduleKind::OneFOneB, 1, 4},
      {pp::ScheduleKind::OneFOneB, 1, 8},       {pp::ScheduleKind::Interleaved, 2, 2 * p},
      {pp::ScheduleKind::Interleaved, 2, 4 * p}};
  if (w.rank() == 0)
    std::printf(
        "\n1. pipeline bubble, p = %d (d=256, 2 layers per stage chunk, 4 x 128 tokens per "
        "micro-batch)\n%-12s %3s %3s | %14s %14s | %14s %14s\n",
        p, "schedule", "v", "m", "idle measured", "idle ideal", "bubble/compute", "(p-1)/(v*m)");
  for (const Case& k : cases) {
    ModelConfig cfg = model(2 * p * k.v, 256, 512);
    pp::StageLayout layout = pp::assign_layers(cfg.n_layer, p, k.v);
    Decoder m(cfg, cpu_backend(), Recompute::None, DType::F32, {}, {},
              pipeline_stage_of(layout, pg.pp().rank()));
    m.params().init(1);
    PipelineRunner runner(m, pg.pp(), pp::make_schedule(k.kind, p, k.m, k.v));
    std::vector<Batch> mb;
    std::vector<ModelInput> in;
    for (int j = 0; j < k.m; ++j) mb.push_back(synthetic_batch(4, 128, cfg.vocab, 10 + j));
    for (auto& b : mb) in.push_back(b.input());
    double idle = 0;
    const int reps = 3;
    for (int r = 0; r <= reps; ++r) {
      w.barrier();
      runner.run(in, 1e-3f);
      if (r > 0) idle += runner.last_idle_fraction() / reps;  // first run: warm-up
    }
    idle = w.all_reduce_scalar(idle, comm::ReduceOp::Sum) / p;
    const double ideal_bubble = double(p - 1) / (k.v * k.m);
    const double ideal_idle = double(p - 1) / (k.v * k.m + p - 1);
    if (w.rank() == 0)
      std::printf("%-12s %3d %3d | %13.1f%% %13.1f%% | %14.3f %14.3f\n",
                  pp::schedule_kind_name(k.kind), k.v, k.m, 100 * idle, 100 * ideal_idle,
                  idle / (1 - idle), ideal_bubble);
  }
}

void ring(comm::Communicator& w, int tokens_per_rank) {
  const int cp = w.size(), Hq = 8, Hkv = 8, D = 64, ld = (Hq + 2 * Hkv) * D;
  comm::ParallelDims dims;
  dims.cp = cp;
  comm::ProcessGroups pg(w, dims);
  const int N = tokens_per_rank * cp;
  std::vector<int32_t> cu = {0, N};
  CpBatch batch = CpBatch::make(cu.data(), 1, cp);
  const int rows = batch.shards[size_t(pg.cp().rank())].rows();
  std::vector<float> qkv(size_t(rows) * ld), out(size_t(rows) * Hq * D), lse(size_t(rows) * Hq),
      dout(out.size()), dqkv(qkv.size());
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = float(uniform_at(3, pg.cp().rank(), i) - 0.5);
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = float(uniform_at(4, pg.cp().rank(), i) - 0.5);
  RingAttention ra({cp, pg.cp().rank(), &pg.cp()}, cpu_backend());
  const float scale = 1.f / std::sqrt(float(D));
  double res[2][3] = {};  // [overlap][compute, wait, bytes]
  for (int overlap = 0; overlap < 2; ++overlap) {
    ra.set_overlap(overlap == 1);
    const int reps = 3;
    for (int r = 0; r <= reps; ++r) {
      ra.stats() = {};
      w.barrier();
      ra.forward(out.data(), lse.data(), qkv.data(), ld, Hq, Hkv, D, scale, batch);
      ra.backward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), ld, Hq, Hkv, D,
                  scale, batch);
      if (r == 0) continue;  // warm-up
      res[overlap][0] += ra.stats().compute_s / reps;
      res[overlap][1] += ra.stats().wait_s / reps;
      res[overlap][2] = double(ra.stats().bytes_sent);
    }
    w.all_reduce_f64(res[overlap], 2, comm::ReduceOp::Max);
  }
  if (w.rank() == 0) {
    std::printf(
        "\n2. ring attention, cp = %d, %d tokens per rank (one causal sequence of %d), Hq=Hkv=%d, "
        "D=%d; forward + backward, max over ranks\n",
        cp, tokens_per_rank, N, Hq, D);
    std::printf(
        "   compute %.4f s; transfers waited before compute (no overlap): %.4f s; exposed "
        "with overlap: %.4f s; hidden %.0f%%; %.2f MB sent per rank\n",
        res[1][0], res[0][1], res[1][1], 100 * (1 - res[1][1] / std::max(1e-12, res[0][1])),
        res[1][2] / 1e6);
  }
}

void moe(comm::Communicator& w) {
  const int ep = w.size();
  comm::ParallelDims dims;
  dims.ep = ep;
  comm::ProcessGroups pg(w, dims);
  ModelConfig cfg = model(2, 128, 256);
  cfg.n_experts = 8;
  cfg.top_k = 2;
  cfg.aux_loss_coeff = 0.01f;
  cfg.d_ff = 256;
  Decoder m(cfg, cpu_backend(), Recompute::None, DType::F32, {}, expert_parallel_layout(pg));
  m.params().init(2);
  DataParallelOptions o;
  AdamWConfig ac;
  DataParallel ddp(m, pg.dp(), o, ac, DType::F32, cpu_backend(), &pg.edp());
  if (w.rank() == 0)
    std::printf(
        "\n3. MoE, ep = %d, 8 experts top-2 dropless, d=128, 2 layers (MoE every layer), "
        "%d x 4 x 64 tokens per step\n   %-5s %-5s | %-40s | %8s %6s | %s\n",
        ep, ep, "step", "layer", "tokens per expert (all ranks)", "max/mean", "CV",
        "all-to-all per rank per step (fwd + bwd)");
  for (int step = 0; step < 20; ++step) {
    Batch b = synthetic_batch(4, 64, cfg.vocab, 100 + step * ep + w.rank());
    ddp.start_step(1);
    ddp.start_micro(0);
    m.forward_backward(b.input(), 1.f / (4 * 64 * ep));
    ddp.finish_micro();
    if (step == 0 || step == 19) {
      for (int l = 0; l < cfg.n_layer; ++l) {
        const MoeStats& s = m.moe_layer(l)->stats();
        std::vector<double> a(s.assigned.begin(), s.assigned.end());
        w.all_reduce_f64(a.data(), int64_t(a.size()), comm::ReduceOp::Sum);
        double bytes = double(s.a2a_send_elems) * 4 * 2;  // backward repeats the exchange
        double mx_bytes = bytes;
        w.all_reduce_f64(&mx_bytes, 1, comm::ReduceOp::Max);
        double mean = 0, mx = 0, var = 0;
        for (double x : a) mean += x / a.size();
        for (double x : a) {
          mx = std::max(mx, x);
          var += (x - mean) * (x - mean) / a.size();
        }
        std::string counts;
        for (double x : a) counts += cat(int64_t(x), " ");
        if (w.rank() == 0)
          std::printf("   %-5d %-5d | %-40s | %8.2f %6.2f | %.3f MB (max over ranks)\n", step + 1,
                      l, counts.c_str(), mx / mean, std::sqrt(var) / mean, mx_bytes / 1e6);
      }
    }
    ddp.step(3e-3, 1.f);
  }
}

}  // namespace

int main(int argc, char** argv) {
  comm::Communicator& w = comm::world();
  int tokens = 1024;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--cp-tokens")) tokens = std::atoi(argv[i + 1]);
  try {
    if (w.rank() == 0)
      std::printf("bench_5d: %d ranks, %d threads each\n", w.size(), num_threads());
    bubble(w);
    ring(w, tokens);
    moe(w);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_5d: %s\n", e.what());
    comm::abort_job(e.what());
  }
  comm::finalize();
  return 0;
}
