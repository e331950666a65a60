// Serving throughput of the engine (paged KV cache, continuous batching) on gpt2-124m with
// random weights, next to the baseline it replaces: re-running the whole window for every new
// token (no cache), and the memory-bandwidth bound of single-stream decode (every weight read
// once per token). Figures, not assertions.
//   build/bench_serve [--prompt 128] [--tokens 64] [--streams 16] [--dtype fp32|bf16]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/bench_util.h"
#include "core/json.h"
#include "core/log.h"
#include "core/rng.h"
#include "infer/engine.h"
#include "infer/generator.h"
#include "infer/model_runner.h"
#include "model/decoder.h"

using namespace loom;

namespace {

// Streaming copy rate of this machine (GB/s): the bound for reading weights once per token.
double copy_bandwidth_gbs() {
  std::vector<float> a(size_t(64) << 20, 1.f), b(a.size());
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    const double t = now_seconds();
    std::memcpy(b.data(), a.data(), a.size() * 4);
    best = std::max(best, 2.0 * a.size() * 4 / (now_seconds() - t) / 1e9);
  }
  return best;
}

std::vector<int32_t> prompt(int n, uint64_t seed, int vocab) {
  std::vector<int32_t> p;
  for (int i = 0; i < n; ++i) p.push_back(int32_t(uniform_at(seed, 1, uint64_t(i)) * vocab));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int prompt_len = 128, tokens = 64, streams = 16;
  std::string dtype = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--prompt") prompt_len = std::stoi(argv[i + 1]);
    if (k == "--tokens") tokens = std::stoi(argv[i + 1]);
    if (k == "--streams") streams = std::stoi(argv[i + 1]);
    if (k == "--dtype") dtype = argv[i + 1];
  }
  const double load_before = load_average();
  ModelConfig cfg = model_preset("gpt2-124m");
  Decoder model(cfg, cpu_backend(), Recompute::None, dtype_from_name(dtype));
  model.params().init(1);
  infer::DecoderRunner runner(model);
  infer::SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = tokens;
  greedy.ignore_eos = true;

  // 1. One stream through the engine: prefill, then decode tokens/s.
  double prefill_s = 0, decode_tps = 0;
  {
    infer::LoomEngine e(runner, infer::EngineConfig{});
    double t_first = 0;
    const double t0 = now_seconds();
    e.submit(prompt(prompt_len, 1, cfg.vocab), greedy, [&](const infer::TokenEvent& ev) {
      if (!ev.tokens.empty() && t_first == 0) t_first = now_seconds();
    });
    e.run_until_idle();
    const double t1 = now_seconds();
    prefill_s = t_first - t0;
    decode_tps = (tokens - 1) / (t1 - t_first);
  }
  // 2. The baseline: no cache, the whole window re-run per token (fewer tokens: it is slow).
  const int base_tokens = std::min(tokens, 8);
  double nocache_tps = 0;
  {
    std::vector<int32_t> p = prompt(prompt_len, 1, cfg.vocab);
    SamplingOptions o;
    o.temperature = 0;
    const double t0 = now_seconds();
    generate(model, p, base_tokens, o);
    nocache_tps = base_tokens / (now_seconds() - t0);
  }
  // 3. Many streams at once (continuous batching).
  double batch_tps = 0;
  {
    infer::LoomEngine e(runner, infer::EngineConfig{});
    int64_t generated = 0;
    for (int s = 0; s < streams; ++s)
      e.submit(prompt(prompt_len, 10 + s, cfg.vocab), greedy,
               [&](const infer::TokenEvent& ev) { generated += int64_t(ev.tokens.size()); });
    const double t0 = now_seconds();
    e.run_until_idle();
    batch_tps = generated / (now_seconds() - t0);
  }
  const double bw = copy_bandwidth_gbs();
  const double weight_bytes = double(cfg.num_params()) * (dtype == "bf16" ? 4 : 4);
  const double bound_tps = bw * 1e9 / weight_bytes;
  Json j = Json::object();
  j["model"] = "gpt2-124m";
  j["dtype"] = dtype;
  j["threads"] = num_threads();
  j["prompt_tokens"] = prompt_len;
  j["prefill_seconds"] = prefill_s;
  j["decode_tokens_per_s"] = decode_tps;
  j["no_cache_tokens_per_s"] = nocache_tps;
  j["speedup_vs_no_cache"] = decode_tps / nocache_tps;
  j["copy_bandwidth_gb_s"] = bw;
  j["decode_bound_tokens_per_s"] = bound_tps;
  j["fraction_of_bound"] = decode_tps / bound_tps;
  j["streams"] = streams;
  j["batched_tokens_per_s"] = batch_tps;
  j["load_average_before"] = load_before;
  j["load_average_after"] = load_average();
  std::printf("%s\n", j.dump(2).c_str());
  return 0;
}
