// Data-parallel measurements, run as an MPI job (e.g. mpirun -n 4 build/bench_dp):
//  1. per-rank resident bytes of parameters, gradients and optimizer state for ZeRO 0/1/2/3,
//     measured with mincore() after a training step, against the theoretical bytes/param;
//  2. the fraction of the gradient all-reduce time hidden behind backward: the exposed wait
//     after backward with bucketed async reduction, against the same reduction started only
//     after backward (its whole duration exposed).
// Prints figures; asserts nothing.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/communicator.h"
#include "core/log.h"
#include "parallel/data_parallel.h"
#include "train/batch.h"

using namespace loom;
using namespace loom::parallel;

namespace {

int arg(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], name)) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  comm::Communicator& w = comm::world();
  const int D = w.size(), rank = w.rank();
  ModelConfig cfg = model_preset("tiny");
  cfg.n_layer = arg(argc, argv, "--layers", 4);
  cfg.d_model = arg(argc, argv, "--d", 256);
  cfg.n_head = cfg.n_kv_head = 4;
  cfg.head_dim = cfg.d_model / 4;
  cfg.d_ff = 4 * cfg.d_model;
  cfg.vocab = 256;
  cfg.max_seq = 64;
  const int steps = arg(argc, argv, "--steps", 4), rows = arg(argc, argv, "--rows", 4), T = 64;
  const double bucket_mb = arg(argc, argv, "--bucket-kb", 1024) / 1024.0;
  Batch batch = synthetic_batch(rows, T, cfg.vocab, 100 + rank);
  AdamWConfig ac;

  if (rank == 0)
    std::printf("model: %s, %lld parameters; DP = %d ranks; %d steps of %d x %d tokens per rank\n",
                cfg.fingerprint().c_str(), static_cast<long long>(cfg.num_params()), D, steps, rows,
                T);

  // 1. Memory per rank.
  if (rank == 0)
    std::printf(
        "\nper-rank resident bytes after a step (fp32 params/grads, AdamW m+v fp32)\n"
        "%-6s %12s %12s %12s %12s %10s %10s\n",
        "zero", "params", "grads", "optim", "total", "B/param", "theory");
  for (int zero = 0; zero <= 3; ++zero) {
    Decoder m(cfg, cpu_backend());
    m.params().init(1);
    DataParallelOptions o;
    o.zero = zero;
    o.bucket_elems = static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4);
    DataParallel dp(m, w, o, ac, DType::F32, cpu_backend());
    for (int s = 0; s < 2; ++s) {
      dp.start_step(1);
      dp.start_micro(0);
      m.forward_backward(batch.input(), 1.f / (rows * T * D));
      dp.finish_micro();
      dp.step(1e-3, 1.f);
    }
    MemoryUse u = dp.memory_use();
    double mx[4] = {double(u.params), double(u.grads), double(u.optim), double(u.total())};
    w.all_reduce_f64(mx, 4, comm::ReduceOp::Max);
    const double n = double(m.params().total());
    // Theory with 4-byte parameter storage (bf16 values are stored in fp32 on the CPU):
    // params 4, grads 4, Adam m+v 8 bytes per parameter; ZeRO divides what it shards by D.
    // ZeRO >= 1 reduce-scatters into a separate shard-sized gradient buffer (4/D).
    double theory = zero == 0   ? 16
                    : zero == 1 ? 4 + 4 + 12.0 / D
                    : zero == 2 ? 4 + 12.0 / D
                                : 16.0 / D;
    if (rank == 0)
      std::printf("%-6d %12.0f %12.0f %12.0f %12.0f %10.2f %10.2f\n", zero, mx[0], mx[1], mx[2],
                  mx[3], mx[3] / n, theory);
  }

  // 2. Communication hidden behind backward (ZeRO-0 all-reduce and ZeRO-2 reduce-scatter).
  if (rank == 0)
    std::printf(
        "\ngradient reduction exposed after backward (max over ranks, mean per step)\n"
        "%-6s %14s %14s %14s %10s\n",
        "zero", "backward s", "after-bwd s", "overlapped s", "hidden");
  for (int zero : {0, 2}) {
    double exposed[2] = {0, 0}, compute = 0;
    for (int overlap = 0; overlap < 2; ++overlap) {
      Decoder m(cfg, cpu_backend());
      m.params().init(1);
      DataParallelOptions o;
      o.zero = zero;
      o.overlap = overlap;
      o.bucket_elems = static_cast<int64_t>(bucket_mb * 1024 * 1024 / 4);
      DataParallel dp(m, w, o, ac, DType::F32, cpu_backend());
      double before = 0, fb = 0;
      for (int s = 0; s < steps + 1; ++s) {
        if (s == 1) before = dp.exposed_comm_seconds();  // step 0 warms up
        dp.start_step(1);
        dp.start_micro(0);
        w.barrier();
        double t0 = now_seconds();
        m.forward_backward(batch.input(), 1.f / (rows * T * D));
        if (s >= 1) fb += now_seconds() - t0;
        // Ranks finish backward at different times on a shared machine; waiting for the
        // slowest is not communication, so line the ranks up before measuring the wait.
        w.barrier();
        dp.finish_micro();
        dp.step(1e-3, 1.f);
      }
      double e[2] = {(dp.exposed_comm_seconds() - before) / steps, fb / steps};
      w.all_reduce_f64(e, 2, comm::ReduceOp::Max);
      exposed[overlap] = e[0];
      if (!overlap) compute = e[1];
    }
    if (rank == 0)
      std::printf("%-6d %14.4f %14.4f %14.4f %9.1f%%\n", zero, compute, exposed[0], exposed[1],
                  100.0 * (1.0 - exposed[1] / exposed[0]));
  }
  comm::finalize();
  return 0;
}
