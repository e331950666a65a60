#include "infer/decode_bench.h"

#include <immintrin.h>
#include <omp.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include "core/error.h"
#include "infer/load_gen.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_lowp_pages.h"

namespace loom::infer {
namespace {

double clock_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds of every thread of the process (OpenMP workers' spinning included).
double process_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

}  // namespace

// One thread's streaming read of [p, p + bytes) with 512-bit loads into four independent sums,
// prefetching 16 KB ahead: what the decode GEMV's loads and prefetches look like. On this
// workplace's machine (AMD EPYC, one thread) it reads 10-20% faster than the integer sum.
__attribute__((target("avx512f"))) uint64_t read_avx512(const char* p, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 256 <= bytes; i += 256) {
    // (As an integer: near the end the address is past the buffer, only a hint.)
    for (int j = 0; j < 4; ++j)
      _mm_prefetch(
          reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + i + 16384 + 64 * j),
          _MM_HINT_T0);
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(p + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(p + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(p + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(p + i + 192));
  }
  alignas(64) uint64_t lane[8];
  _mm512_store_si512(lane, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (uint64_t v : lane) sum += v;
  return sum;
}

double measure_read_bandwidth_gbs(int passes, bool huge_pages) {
  // 512 MiB: well past any last-level cache, about the size of gpt2-124m's fp32 weights.
  const size_t n = size_t(64) << 20;
  cpu::HugeBuffer mem(n * sizeof(uint64_t), huge_pages);
  uint64_t* const buf = mem.as<uint64_t>();
  // Written (by every thread, as the read will be) so the pages exist before timing.
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) buf[i] = i;
  double best = 0;
  volatile uint64_t sink = 0;
  const bool avx512 = cpu::cpu_features().avx512f;
  for (int p = 0; p < passes; ++p) {
    uint64_t sum = 0;
    double t = clock_now();
    // Integer sums: the compiler vectorises them freely (no reassociation concerns), so the
    // loop is bound by the loads, like a weight-streaming GEMV.
#pragma omp parallel for schedule(static) reduction(+ : sum)
    for (size_t i = 0; i < n; ++i) sum += buf[i];
    best = std::max(best, double(n * sizeof(uint64_t)) / (clock_now() - t) / 1e9);
    if (!avx512) continue;
    // The same bytes read as the GEMV reads weights: the faster of the two is the ceiling (a
    // ceiling the kernel beat would make the roofline ratio above 100%).
    t = clock_now();
#pragma omp parallel reduction(+ : sum)
    {
      const int th = omp_get_thread_num(), nt = omp_get_num_threads();
      const size_t b0 = n * size_t(th) / size_t(nt), b1 = n * size_t(th + 1) / size_t(nt);
      sum += read_avx512(reinterpret_cast<const char*>(buf + b0), (b1 - b0) * 8);
    }
    best = std::max(best, double(n * sizeof(uint64_t)) / (clock_now() - t) / 1e9);
    sink = sink + sum;
  }
  return best;
}

double decode_weight_bytes(const Decoder& model, double bytes_per_weight,
                           double bytes_per_channel) {
  double linear_elems = 0, channels = 0;
  for (const Decoder::LinearInfo& l : model.linears()) {
    linear_elems += double(l.in) * l.out;
    channels += l.out;
  }
  double other = 0;
  for (const ParamInfo& p : model.params().infos()) {
    if (p.name == "embed.wte" || p.name == "embed.wpe" || p.name == "head.weight") continue;
    if (p.name.size() > 7 && p.name.compare(p.name.size() - 7, 7, ".weight") == 0 &&
        p.shape.size() == 2)
      continue;  // a linear weight, counted above
    other += double(p.numel) * 4;
  }
  return linear_elems * bytes_per_weight + channels * bytes_per_channel + other;
}

DecodeBenchResult run_decode_bench(ModelRunner& runner, const EngineConfig& ec, double weight_bytes,
                                   const DecodeBenchOptions& o) {
  LOOM_CHECK(o.output_len >= 2, "decode needs at least 2 output tokens (got ", o.output_len, ")");
  DecodeBenchResult r;
  r.streams = o.streams;
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = o.output_len;
  greedy.ignore_eos = true;
  LoadSpec spec;
  spec.input_len = o.input_len;
  spec.vocab = runner.vocab();
  spec.seed = o.seed;
  // The read bandwidth is measured just before and just after the single stream and the
  // faster taken: on a shared machine one probe taken at another moment than the decode (as
  // the only one, after the streams, was) gave ratios of 50% and 101% for the same kernel.
  r.read_bandwidth_gbs = measure_read_bandwidth_gbs();
  {
    // One stream: prefill, then decode, profiled from the step after the first token's (the
    // profile is installed inside that step, after its scopes began: none of it is counted).
    LoomEngine e(runner, ec);
    double t_first = 0, cpu_first = 0;
    int tokens = 0;
    const double t0 = clock_now();
    e.submit(random_prompt(spec, 0), greedy, [&](const TokenEvent& ev) {
      if (!ev.tokens.empty() && t_first == 0) {
        t_first = clock_now();
        cpu_first = process_cpu_seconds();
        set_decode_profile(&r.profile);
      }
      tokens += int(ev.tokens.size());
    });
    e.run_until_idle();
    const double t1 = clock_now();
    r.decode_cpu_seconds = process_cpu_seconds() - cpu_first;
    set_decode_profile(nullptr);
    r.decode_seconds = t1 - t_first;
    r.decode_tokens = tokens - 1;
    LOOM_CHECK(tokens == o.output_len, "the single stream produced ", tokens, " of ", o.output_len,
               " tokens");
    r.prefill_seconds = t_first - t0;
    r.single_tokens_per_s = (tokens - 1) / (t1 - t_first);
  }
  r.read_bandwidth_gbs = std::max(r.read_bandwidth_gbs, measure_read_bandwidth_gbs());
  if (o.streams > 0) {
    // Many streams at once; the rate counts what is produced once every stream is decoding.
    LoomEngine e(runner, ec);
    // (Wall clock and process CPU time at every token.)
    std::vector<std::vector<std::pair<double, double>>> times(size_t(o.streams));
    // Profiled from the step after the one that gave the last stream its first token (as the
    // single stream's: installed inside that step, none of it counted).
    int decoding = 0;
    for (int s = 0; s < o.streams; ++s)
      e.submit(random_prompt(spec, 1 + s), greedy, [&, s](const TokenEvent& ev) {
        if (!ev.tokens.empty() && times[size_t(s)].empty() && ++decoding == o.streams)
          set_decode_profile(&r.streams_profile);
        for (size_t k = 0; k < ev.tokens.size(); ++k)
          times[size_t(s)].emplace_back(clock_now(), process_cpu_seconds());
      });
    e.run_until_idle();
    set_decode_profile(nullptr);
    std::pair<double, double> last_first{0, 0}, end{0, 0};
    for (const auto& t : times) {
      LOOM_CHECK(!t.empty(), "a stream produced no tokens");
      last_first = std::max(last_first, t.front());
      end = std::max(end, t.back());
    }
    int64_t after = 0;
    for (const auto& t : times)
      after += std::count_if(t.begin(), t.end(), [&](const auto& x) { return x > last_first; });
    if (end.first > last_first.first && after > 0) {
      r.batch_tokens_per_s = double(after) / (end.first - last_first.first);
      r.batch_cpu_seconds_per_token = (end.second - last_first.second) / double(after);
      r.streams_seconds = end.first - last_first.first;
      r.streams_cpu_seconds = end.second - last_first.second;
    }
  }
  const KvSpec kv = kv_spec_with(runner.kv_spec(), ec.kv_cache_dtype);
  r.kv_cache_dtype = kv_stored_name(kv.dtype);
  r.kv_blocks = ec.num_blocks > 0 ? ec.num_blocks
                                  : KvCache::blocks_for_bytes(kv, ec.block_size, ec.kv_cache_bytes);
  const double kv_per_pos = double(KvCache::bytes_per_block(kv, 1));
  const double mean_context = o.input_len + o.output_len / 2.0;
  r.bytes_per_token = weight_bytes + kv_per_pos * mean_context;
  r.roofline_tokens_per_s = r.read_bandwidth_gbs * 1e9 / r.bytes_per_token;
  r.roofline_ratio = r.single_tokens_per_s / r.roofline_tokens_per_s;
  return r;
}

Json DecodeBenchResult::to_json() const {
  Json j = Json::object();
  j["kv_cache_dtype"] = kv_cache_dtype;
  j["kv_blocks"] = kv_blocks;
  j["read_bandwidth_gb_s"] = read_bandwidth_gbs;
  j["prefill_seconds"] = prefill_seconds;
  j["single_stream_tokens_per_s"] = single_tokens_per_s;
  j["bytes_per_token"] = bytes_per_token;
  j["roofline_tokens_per_s"] = roofline_tokens_per_s;
  j["roofline_ratio"] = roofline_ratio;
  j["streams"] = streams;
  j["streams_aggregate_tokens_per_s"] = batch_tokens_per_s;
  j["streams_cpu_ms_per_token"] = batch_cpu_seconds_per_token * 1e3;
  if (decode_tokens > 0) {
    // Milliseconds per decoded token, part by part (what profile_text prints).
    const auto& p = profile;
    const double per = 1e3 / decode_tokens;
    using P = DecodeProfile;
    Json t = Json::object();
    t["token"] = decode_seconds * per;
    t["token_cpu"] = decode_cpu_seconds * per;
    t["gemv"] = p.seconds[P::kGemv] * per;
    t["gemv_gb_s"] = p.seconds[P::kGemv] > 0 ? p.bytes[P::kGemv] / p.seconds[P::kGemv] / 1e9 : 0;
    t["attention"] = p.seconds[P::kAttention] * per;
    t["attention_gb_s"] =
        p.seconds[P::kAttention] > 0 ? p.bytes[P::kAttention] / p.seconds[P::kAttention] / 1e9 : 0;
    t["other_forward"] =
        (p.seconds[P::kForward] - p.seconds[P::kGemv] - p.seconds[P::kAttention]) * per;
    t["sample"] = p.seconds[P::kSample] * per;
    t["engine_step"] = (p.seconds[P::kStep] - p.seconds[P::kForward] - p.seconds[P::kSample]) * per;
    t["between_steps"] = (decode_seconds - p.seconds[P::kStep]) * per;
    j["single_stream_ms_per_token"] = t;
  }
  if (streams_seconds > 0) {
    // Shares of the many streams' wall clock: where a step's time goes.
    using P = DecodeProfile;
    j["streams_attention_share"] = streams_profile.seconds[P::kAttention] / streams_seconds;
    j["streams_gemv_share"] = streams_profile.seconds[P::kGemv] / streams_seconds;
  }
  return j;
}

namespace {

// One line per part of `p` over `count` tokens or steps taking `seconds` in all (wall clock) and
// `cpu_seconds` of process CPU time.
std::string parts_text(const DecodeProfile& p, double seconds, double cpu_seconds, int count,
                       const char* title, const char* unit, double read_gbs) {
  using P = DecodeProfile;
  const double per = seconds / count;
  std::string out;
  char line[200];
  auto row = [&](const char* name, double part_seconds, double bytes) {
    const double s = part_seconds / count;
    int n =
        std::snprintf(line, sizeof line, "  %-34s %8.3f ms %5.1f%%", name, s * 1e3, 100 * s / per);
    if (bytes > 0 && part_seconds > 0) {
      const double gbs = bytes / part_seconds / 1e9;
      std::snprintf(line + n, sizeof line - size_t(n), "  %6.1f MB  %5.1f GB/s = %5.1f%% of read",
                    bytes / count / 1e6, gbs, 100 * gbs / read_gbs);
    }
    out += line;
    out += "\n";
  };
  std::snprintf(line, sizeof line, "%s, per %s (%d %ss):\n", title, unit, count, unit);
  out += line;
  row("linear layers (GEMV)", p.seconds[P::kGemv], p.bytes[P::kGemv]);
  row("attention (paged KV, incl. write)", p.seconds[P::kAttention], p.bytes[P::kAttention]);
  row("rest of forward (norms, GELU, ...)",
      p.seconds[P::kForward] - p.seconds[P::kGemv] - p.seconds[P::kAttention], 0);
  row("sampling", p.seconds[P::kSample], 0);
  row("engine step (scheduler, events)",
      p.seconds[P::kStep] - p.seconds[P::kForward] - p.seconds[P::kSample], 0);
  row("between steps", seconds - p.seconds[P::kStep], 0);
  row(unit, seconds, p.bytes[P::kGemv] + p.bytes[P::kAttention]);
  const std::string cpu = std::string("CPU time per ") + unit + " (all threads)";
  std::snprintf(line, sizeof line, "  %-34s %8.3f ms\n", cpu.c_str(), cpu_seconds / count * 1e3);
  out += line;
  return out;
}

}  // namespace

std::string DecodeBenchResult::profile_text() const {
  std::string out;
  if (decode_tokens > 0)
    out = parts_text(profile, decode_seconds, decode_cpu_seconds, decode_tokens,
                     "single-stream decode", "token", read_bandwidth_gbs);
  const int steps = int(streams_profile.calls[DecodeProfile::kStep]);
  if (steps > 0) {
    const std::string title = std::to_string(streams) + "-stream decode";
    out += parts_text(streams_profile, streams_seconds, streams_cpu_seconds, steps, title.c_str(),
                      "step", read_bandwidth_gbs);
  }
  return out;
}

}  // namespace loom::infer
