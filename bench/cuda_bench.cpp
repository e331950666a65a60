// Training-step throughput of the CUDA backend: the real Decoder (model/decoder.h) on one GPU
// with AdamW on the device (CudaBackend::adamw_multi, weight decay on matrices only, the
// gradient clipped to norm 1), GPT-2 124M at batch 16 x 1024 by default, GEMMs on bf16 tensor
// cores (fp32 storage and accumulation). Prints tokens/s, MFU against the card's dense bf16
// peak, the loss of every step, each op group's share of one profiled step's time (the Decoder
// runs on a forwarding backend, tests/kernels/tap_backend.h, that names each op: a CUDA event
// whenever the group changes; the head's GEMMs apart from the blocks' by the Decoder's block
// hooks), and the device memory per buffer class.
//
//   bench_cuda [--preset gpt2-124m] [--batch 16] [--seq 1024] [--steps 10] [--warmup 3]
//              [--math bf16|tf32|fp32|fp16|fp8|fp8-delayed|mxfp8] [--peak-tflops X]
//              [--act fp32|bf16] [--recompute none|selective|full] [--head-rows 4096]
//              [--no-profile]
//      fp8: the blocks' linear layers in fp8 with current scaling (hybrid e4m3/e5m2), the rest
//      as under bf16; fp8-delayed: delayed scaling (amax history 1024); mxfp8: MX blocks
//      dequantised to bf16 GEMMs (e4m3, hybrid gradients); MFU still against the dense bf16 peak.
//      --fp8-trace (fp8-delayed): after every step, the scales it used for x, W and dy (from
//      the amax histories of the steps before) in the first block's qkv and the last block's
//      MLP output layer (downloads: the step times are then not the recipe's);
//      --act: how the Decoder stores activations (bf16: half the activation memory, values
//      widened for the fp32-interface GEMMs); --head-rows: logit rows per head chunk.
//   bench_cuda --gemm-sweep [--preset P] [--batch B] [--seq T]
//      the preset's linear-layer GEMMs (M = B*T tokens) through gemm_ex with bf16 and fp8
//      (e4m3 x e4m3, per-tensor scales, bf16 output) operands, TFLOP/s each and fp8/bf16:
//      what the FP8 recipes can gain per GEMM on this card before quantisation costs.
//
// Baseline for the ratios: the same shape in PyTorch on the same card
// (bench/cuda_bench_torch.py prints eager and torch.compile figures in the same format).
// Without a CUDA device it says so and exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "core/error.h"
#include "kernels/buffer.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/tap_backend.h"
#include "model/decoder.h"
#include "precision/cuda_fp8_recipes.h"

namespace {

using namespace loom;

struct Args {
  std::string preset = "gpt2-124m", math = "bf16", act = "fp32", recompute = "none";
  int batch = 16, seq = 1024, steps = 10, warmup = 3, head_rows = 4096;
  double peak_tflops = 0;
  bool profile = true;
  bool gemm_sweep = false;
  bool fp8_trace = false;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto val = [&]() -> std::string {
      LOOM_CHECK(i + 1 < argc, "option ", k, " needs a value");
      return argv[++i];
    };
    if (k == "--preset")
      a.preset = val();
    else if (k == "--batch")
      a.batch = std::stoi(val());
    else if (k == "--seq")
      a.seq = std::stoi(val());
    else if (k == "--steps")
      a.steps = std::stoi(val());
    else if (k == "--warmup")
      a.warmup = std::stoi(val());
    else if (k == "--math")
      a.math = val();
    else if (k == "--peak-tflops")
      a.peak_tflops = std::stod(val());
    else if (k == "--act")
      a.act = val();
    else if (k == "--recompute")
      a.recompute = val();
    else if (k == "--head-rows")
      a.head_rows = std::stoi(val());
    else if (k == "--fp8-trace")
      a.fp8_trace = true;
    else if (k == "--no-profile")
      a.profile = false;
    else if (k == "--gemm-sweep")
      a.gemm_sweep = true;
    else
      fail("unknown option ", k, " (see the comment at the top of bench/cuda_bench.cpp)");
  }
  LOOM_CHECK(a.act == "fp32" || a.act == "bf16", "--act must be fp32 or bf16, got '", a.act, "'");
  LOOM_CHECK(a.batch > 0 && a.seq > 0 && a.steps > 0 && a.warmup >= 0 && a.head_rows > 0,
             "--batch, --seq, --steps and --head-rows must be positive, --warmup >= 0");
  return a;
}

// Dense bf16 tensor-core peak by device name (TFLOP/s), 0 if unknown (then pass --peak-tflops).
double known_peak(const std::string& name) {
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos)
    return name.find("PCIe") != std::string::npos ? 756.0 : 989.4;
  if (name.find("A100") != std::string::npos) return 312.0;
  return 0;
}

// Events at every op-group boundary of one step: time per group.
struct GroupTimer {
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  cudaStream_t st;
  void mark(const char* what) {
    if (!marks.empty() && marks.back().first == what) return;
    cudaEvent_t e;
    cudaEventCreate(&e);
    cudaEventRecord(e, st);
    marks.emplace_back(what, e);
  }
  void add_to(std::map<std::string, double>& ms) {
    cudaEventSynchronize(marks.back().second);
    for (size_t i = 0; i + 1 < marks.size(); ++i) {
      float t = 0;
      cudaEventElapsedTime(&t, marks[i].second, marks[i + 1].second);
      ms[marks[i].first] += t;
    }
    for (auto& m : marks) cudaEventDestroy(m.second);
    marks.clear();
  }
};

// The op group an op's time is counted in (`head`: between the last block's forward and the
// first block's backward, where the GEMMs are the output head's).
const char* op_group(const std::string& op, bool head) {
  auto has = [&](const char* s) { return op.find(s) != std::string::npos; };
  if (has("matmul") || has("gemm")) return head ? "head matmul" : "matmul";
  if (op == "fp8 linear") return "matmul (fp8)";
  if (op == "attention_forward") return "attention fwd";
  if (op == "attention_backward") return "attention bwd";
  if (has("norm")) return "norm";
  if (has("gelu") || has("swiglu")) return "activation";
  if (has("rope")) return "rope";
  if (has("cross_entropy")) return "cross-entropy";
  if (has("embedding")) return "embedding";
  if (op == "add" || op == "add_inplace" || op == "scale_inplace") return "residual";
  if (op == "round_to" || op == "convert") return "convert";
  return "other";  // copies, fills, the loss sum
}

int run(const Args& a) {
  if (cuda_device_count() == 0) {
    std::printf("bench_cuda: no CUDA device: skipped\n");
    return 0;
  }
  CudaOptions opt;
  // fp8: the blocks' linear layers in fp8 (current scaling, hybrid e4m3/e5m2: the recipe
  // `fp8_tensorwise_current` with fp8_format = "hybrid"), everything else as under bf16.
  const bool fp8 = a.math == "fp8" || a.math == "fp8-delayed" || a.math == "mxfp8";
  opt.gemm_math = gemm_math_from_name(fp8 ? "bf16" : a.math);
  CudaBackend be(opt);
  const ModelConfig cfg = model_preset(a.preset);
  LOOM_CHECK(a.seq <= cfg.max_seq, "--seq ", a.seq, " exceeds the preset's max_seq ", cfg.max_seq);
  const int N = a.batch * a.seq;
  std::printf(
      "bench_cuda: %s on %s (sm_%d, %d SMs), batch %d x %d = %d tokens, gemm math %s, "
      "activations %s, recompute %s (real Decoder)\n",
      a.preset.c_str(), be.device_name().c_str(), be.sm_version(), be.sm_count(), a.batch, a.seq, N,
      a.math.c_str(), a.act.c_str(), a.recompute.c_str());

  // The model on the device: parameters drawn on the host in chunks and copied over (init),
  // gradients, the activation arena and the inputs allocated through the backend.
  test::TapBackend tap(be);  // forwards to `be`; names each op while a step is profiled
  Decoder model(cfg, tap, recompute_from_name(a.recompute),
                a.act == "bf16" ? DType::BF16 : DType::F32);
  model.set_head_rows(std::min(N, a.head_rows));
  ParamSet& ps = model.params();
  ps.init(1);
  const int64_t P = ps.total();
  BackendBuffer mom = BackendBuffer::zeroed(be, size_t(P) * 4, "optimizer");
  BackendBuffer var = BackendBuffer::zeroed(be, size_t(P) * 4, "optimizer");
  std::vector<AdamWTensor> adam;
  for (const ParamInfo& p : ps.infos())
    adam.push_back({ps.data() + p.offset, ps.grad() + p.offset, mom.as<float>() + p.offset,
                    var.as<float>() + p.offset, p.numel, p.decay ? 0.1f : 0.f});

  std::vector<int32_t> tokens(N), targets(N), positions(N), cu(a.batch + 1);
  uint64_t s = 42;
  for (int i = 0; i < N; ++i) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    tokens[i] = static_cast<int32_t>((s >> 33) % cfg.vocab);
    positions[i] = i % a.seq;
  }
  for (int i = 0; i < N; ++i) targets[i] = tokens[(i + 1) % N];
  for (int b = 0; b <= a.batch; ++b) cu[b] = b * a.seq;
  const ModelInput in{tokens.data(), targets.data(), positions.data(), cu.data(), N, a.batch};

  std::unique_ptr<CudaFp8Recipes> fp8_recipes;
  if (fp8) {
    CudaFp8Options fo;
    fo.hybrid = true;
    fo.amax_history = a.math == "fp8-delayed" ? 1024 : 0;  // TE's default history
    fo.mx = a.math == "mxfp8";
    fp8_recipes = std::make_unique<CudaFp8Recipes>(model, be, fo, N);
  }
  auto stream = static_cast<cudaStream_t>(be.stream());
  GroupTimer timer{{}, stream};
  // One profiled step: every op the Decoder runs marks its group (the fp8 recipes call the
  // backend directly: they mark their layers themselves); the head's GEMMs are told apart by
  // the block hooks.
  bool in_head = false;
  const int L = cfg.n_layer;
  model.after_block.subscribe([&](int l, bool backward) {
    if (!backward && l == L - 1) in_head = true;
  });
  model.before_block.subscribe([&](int, bool backward) {
    if (backward) in_head = false;
  });
  auto profile_ops = [&](bool on) {
    test::TapBackend::Listener mark = nullptr;
    if (on) mark = [&](const char* op) { timer.mark(op_group(op, in_head)); };
    tap.set_listener(mark);
    if (fp8_recipes) fp8_recipes->mark = mark;
  };

  // The scales delayed scaling used in step t (set by its begin_step from the histories of the
  // steps before): a scale that collapses or lags growing activations shows here.
  auto trace_scales = [&](int t) {
    const std::string first = "blocks.0.attn.qkv", last = cat("blocks.", L - 1, ".mlp.proj");
    for (size_t i = 0; i < fp8_recipes->size(); ++i) {
      const std::string& n = fp8_recipes->name(i);
      if (n != first && n != last) continue;
      const CudaFp8Linear& l = fp8_recipes->linear(i);
      std::printf("fp8 step %d %s: scale x %.4g w %.4g dy %.4g\n", t, n.c_str(),
                  l.scale(CudaFp8Linear::X), l.scale(CudaFp8Linear::W), l.scale(CudaFp8Linear::DY));
    }
  };

  double loss = 0;
  auto step = [&](int t, bool profile) {
    profile_ops(profile);
    in_head = false;
    // Delayed scaling: the previous step's amaxes join the histories before this step.
    if (fp8_recipes) fp8_recipes->begin_step();
    ps.zero_grad();
    loss = model.forward_backward(in, 1.f / N);
    if (profile) timer.mark("optimizer");
    const double norm = std::sqrt(be.sum_squares(ps.grad(), P));
    const float clip = norm > 1.0 ? static_cast<float>(1.0 / norm) : 1.f;
    be.adamw_multi(adam, {6e-4f, 0.9f, 0.95f, 1e-8f, clip, t});
    if (profile) timer.mark("end");
    profile_ops(false);
    if (a.fp8_trace && fp8_recipes) trace_scales(t);
  };
  std::vector<double> curve;
  for (int t = 1; t <= a.warmup; ++t) {
    step(t, false);
    curve.push_back(loss / N);
  }
  be.sync();
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventRecord(t0, stream);
  for (int t = 1; t <= a.steps; ++t) {
    step(a.warmup + t, false);
    curve.push_back(loss / N);
  }
  cudaEventRecord(t1, stream);
  be.sync();
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  const double step_s = ms / 1e3 / a.steps;
  const double tok_s = N / step_s;
  const double flops = cfg.train_flops_per_token(a.seq) * N / step_s;
  double peak = a.peak_tflops > 0 ? a.peak_tflops : known_peak(be.device_name());
  std::printf("step %.2f ms, %.0f tokens/s, %.1f TFLOP/s (model FLOPs), loss %.4f\n", step_s * 1e3,
              tok_s, flops / 1e12, loss / N);
  if (peak > 0)
    std::printf("MFU %.1f%% of %.0f TFLOP/s dense bf16\n", 100.0 * flops / 1e12 / peak, peak);
  else
    std::printf("MFU: unknown card peak (pass --peak-tflops)\n");
  // The loss of every step: a recipe that trains wrongly (loss rising above ln V) shows here.
  std::printf("loss per step:");
  for (double l : curve) std::printf(" %.3f", l);
  std::printf("  (ln V = %.2f)\n", std::log(double(cfg.vocab)));

  if (a.profile) {
    std::map<std::string, double> group_ms;
    step(a.warmup + a.steps + 1, true);
    timer.add_to(group_ms);
    double total = 0;
    for (auto& [k, t] : group_ms) total += t;
    std::vector<std::pair<double, std::string>> rows;
    for (auto& [k, t] : group_ms) rows.push_back({t, k});
    std::sort(rows.rbegin(), rows.rend());
    std::printf("time share per op group (one profiled step, %.2f ms):\n", total);
    for (auto& [t, k] : rows)
      std::printf("  %-16s %8.3f ms  %5.1f%%\n", k.c_str(), t, 100 * t / total);
  }
  std::printf("activation arena %.1f MiB (head chunk %d rows)\n",
              model.activation_bytes() / 1048576.0, model.head_chunk());
  std::printf("%s", be.memory_report().c_str());
  std::printf("backend workspace peak: %.1f MiB\n", be.workspace_peak() / 1048576.0);
  std::printf("host load average %.2f\n", load_average());
  return 0;
}

// Mean ms of `launch` over `reps` launches after warm-up.
template <typename Fn>
double time_gemm(CudaBackend& be, Fn&& launch, int reps) {
  auto st = static_cast<cudaStream_t>(be.stream());
  for (int i = 0; i < 3; ++i) launch();
  cudaEvent_t t0, t1;
  cudaEventCreate(&t0);
  cudaEventCreate(&t1);
  cudaEventRecord(t0, st);
  for (int i = 0; i < reps; ++i) launch();
  cudaEventRecord(t1, st);
  be.sync();
  float ms = 0;
  cudaEventElapsedTime(&ms, t0, t1);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
  return ms / reps;
}

// Forward GEMMs of one block and the head: y[M,N] = x[M,K] W[N,K]^T, the layout cuBLASLt needs
// for fp8 (B stored [N,K], trans_b), used for both types so only the operand type differs.
int gemm_sweep(const Args& a) {
  if (cuda_device_count() == 0) {
    std::printf("bench_cuda: no CUDA device: skipped\n");
    return 0;
  }
  CudaBackend be{CudaOptions{}};
  const ModelConfig cfg = model_preset(a.preset);
  const int M = a.batch * a.seq;
  struct Shape {
    const char* name;
    int K, N;
  };
  const Shape shapes[] = {{"qkv", cfg.d_model, cfg.qkv_dim()},
                          {"attn-out", cfg.n_head * cfg.head_dim, cfg.d_model},
                          {"fc", cfg.d_model, cfg.fc_dim()},
                          {"mlp-out", cfg.d_ff, cfg.d_model},
                          {"head", cfg.d_model, cfg.vocab}};
  const bool fp8_ok = be.sm_version() >= 89;
  std::printf("bench_cuda --gemm-sweep: %s on %s (sm_%d), M = %d tokens%s\n", cfg.name.c_str(),
              be.device_name().c_str(), be.sm_version(), M,
              fp8_ok ? "" : " (no fp8 tensor cores before sm_89: fp8 skipped)");
  // tf32 and f32>bf16: fp32 operands through the fp32 Backend GEMM (what the Decoder's
  // Linears run) on tf32 or bf16 tensor cores; bf16 and fp8: stored narrow operands.
  std::printf("%-9s %6s %6s | %9s %9s %9s %9s | %s\n", "gemm", "K", "N", "tf32", "f32>bf16", "bf16",
              "fp8", "fp8/bf16 (TFLOP/s)");
  size_t max_x = 0, max_w = 0, max_y = 0;
  for (const auto& sh : shapes) {
    max_x = std::max(max_x, size_t(M) * sh.K);
    max_w = std::max(max_w, size_t(sh.N) * sh.K);
    max_y = std::max(max_y, size_t(M) * sh.N);
  }
  DeviceArena& arena = be.arena();
  BumpRegion& buf = arena.create("sweep", (max_x + max_w + max_y) * 4 * 2 + (4u << 20));
  float* x32 = buf.take_n<float>(max_x);
  float* w32 = buf.take_n<float>(max_w);
  void* x16 = buf.take_n<uint16_t>(max_x);
  void* w16 = buf.take_n<uint16_t>(max_w);
  void* x8 = buf.take_n<uint8_t>(max_x);
  void* w8 = buf.take_n<uint8_t>(max_w);
  float* y = buf.take_n<float>(max_y);
  float* scales = buf.take_n<float>(64);
  {
    std::vector<float> h(std::max(max_x, max_w));
    uint64_t s = 7;
    for (auto& v : h) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>((s >> 40) % 2001) / 1000.f - 1.f;
    }
    be.upload(x32, h.data(), max_x * 4);
    be.upload(w32, h.data(), max_w * 4);
    const std::vector<float> one(64, 1.f);
    be.upload(scales, one.data(), one.size() * 4);
  }
  be.convert(x16, DType::BF16, x32, DType::F32, int64_t(max_x));
  be.convert(w16, DType::BF16, w32, DType::F32, int64_t(max_w));
  be.convert(x8, DType::F8E4M3, x32, DType::F32, int64_t(max_x));
  be.convert(w8, DType::F8E4M3, w32, DType::F32, int64_t(max_w));
  double tot[4] = {0, 0, 0, 0}, flops_all = 0;
  for (const auto& sh : shapes) {
    GemmEx g;
    g.trans_b = true;
    g.M = M;
    g.N = sh.N;
    g.K = sh.K;
    g.lda = sh.K;
    g.ldb = sh.K;
    g.ldc = sh.N;
    g.C = y;
    const double flops = 2.0 * M * sh.N * sh.K;
    const int reps = std::max(3, int(2e12 / flops));  // ~2 TFLOP per measurement
    double ms[4] = {0, 0, 0, 0};
    // fp32 operands on tf32 tensor cores: the backend's fp32-interface GEMM.
    be.set_gemm_math(GemmMath::TF32);
    auto fp32_gemm = [&] {
      be.gemm(false, true, M, sh.N, sh.K, 1.f, x32, sh.K, w32, sh.K, 0.f, y, sh.N);
    };
    ms[0] = time_gemm(be, fp32_gemm, reps);
    be.set_gemm_math(GemmMath::BF16);
    ms[1] = time_gemm(be, fp32_gemm, reps);
    g.a_type = g.b_type = DType::BF16;
    g.c_type = DType::BF16;
    g.A = x16;
    g.B = w16;
    ms[2] = time_gemm(
        be, [&] { be.gemm_ex(g); }, reps);
    if (fp8_ok) {
      g.a_type = g.b_type = DType::F8E4M3;
      g.A = x8;
      g.B = w8;
      g.a_scale = scales;
      g.b_scale = scales + 16;  // each scale on its own 64-byte line
      try {
        ms[3] = time_gemm(
            be, [&] { be.gemm_ex(g); }, reps);
      } catch (const std::exception& e) {
        std::printf("  fp8 refused: %s\n", e.what());
      }
    }
    auto tf = [&](double t) { return t > 0 ? flops / (t * 1e-3) / 1e12 : 0.0; };
    std::printf("%-9s %6d %6d | %9.1f %9.1f %9.1f %9.1f | %.2fx\n", sh.name, sh.K, sh.N, tf(ms[0]),
                tf(ms[1]), tf(ms[2]), tf(ms[3]), ms[3] > 0 ? ms[2] / ms[3] : 0.0);
    for (int i = 0; i < 4; ++i) tot[i] += ms[i];
    flops_all += flops;
  }
  auto tf = [&](double t) { return t > 0 ? flops_all / (t * 1e-3) / 1e12 : 0.0; };
  std::printf("%-9s %6s %6s | %9.1f %9.1f %9.1f %9.1f | %.2fx (one block's GEMMs + head)\n",
              "total", "", "", tf(tot[0]), tf(tot[1]), tf(tot[2]), tf(tot[3]),
              tot[3] > 0 ? tot[2] / tot[3] : 0.0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    return a.gemm_sweep ? gemm_sweep(a) : run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cuda: %s\n", e.what());
    return 1;
  }
}
