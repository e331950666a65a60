#include "infer/load_gen.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/rng.h"

namespace loom::infer {
namespace {

double clock_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Philox streams of the dataset, apart so that prompts and arrivals never share draws.
constexpr uint64_t kPromptKey = 0x70726f6d70740000ull, kArrivalKey = 0x6172726976616c00ull;

LoadSummary::Stat stat_ms(const std::vector<double>& seconds) {
  LoadSummary::Stat s;
  if (seconds.empty()) return s;
  double sum = 0;
  for (double v : seconds) sum += v;
  s.mean = 1e3 * sum / double(seconds.size());
  s.median = 1e3 * percentile(seconds, 50);
  s.p99 = 1e3 * percentile(seconds, 99);
  return s;
}

Json stat_json(const LoadSummary::Stat& s) {
  Json j = Json::object();
  j["mean_ms"] = s.mean;
  j["median_ms"] = s.median;
  j["p99_ms"] = s.p99;
  return j;
}

}  // namespace

std::vector<int32_t> random_prompt(const LoadSpec& spec, int i) {
  LOOM_CHECK(spec.vocab > 0, "a prompt vocabulary of ", spec.vocab, " tokens");
  std::vector<int32_t> p(size_t(spec.input_len));
  for (int k = 0; k < spec.input_len; ++k) {
    const float u = uniform_at(spec.seed, kPromptKey + uint64_t(i), uint64_t(k));
    p[size_t(k)] = std::min(spec.vocab - 1, int32_t(u * float(spec.vocab)));
  }
  return p;
}

std::vector<double> poisson_arrivals(const LoadSpec& spec) {
  LOOM_CHECK(spec.rate > 0, "a request rate of ", spec.rate, " per second (must be > 0)");
  std::vector<double> t(size_t(spec.num_prompts), 0.0);
  if (std::isinf(spec.rate)) return t;
  double at = 0;
  for (int i = 0; i < spec.num_prompts; ++i) {
    // Inverse-CDF of the exponential; u in [0, 1), so 1 - u never reaches 0.
    const double u = uniform_at(spec.seed, kArrivalKey, uint64_t(i));
    at += -std::log(1.0 - u) / spec.rate;
    t[size_t(i)] = at;
  }
  return t;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

LoadSummary summarize(const std::vector<RequestRecord>& records, double duration) {
  LoadSummary s;
  s.duration = duration;
  std::vector<double> ttft, tpot, itl, e2e;
  for (const RequestRecord& r : records) {
    if (!r.ok) {
      ++s.failed;
      if (s.first_error.empty()) s.first_error = r.error;
      continue;
    }
    ++s.completed;
    s.input_tokens += r.prompt_tokens;
    s.output_tokens += r.output_tokens;
    ttft.push_back(r.first - r.sent);
    e2e.push_back(r.done - r.sent);
    if (r.output_tokens > 1) tpot.push_back((r.done - r.first) / double(r.output_tokens - 1));
    for (size_t k = 1; k < r.chunk_times.size(); ++k)
      itl.push_back(r.chunk_times[k] - r.chunk_times[k - 1]);
  }
  if (duration > 0) {
    s.request_throughput = s.completed / duration;
    s.output_throughput = double(s.output_tokens) / duration;
    s.total_token_throughput = double(s.input_tokens + s.output_tokens) / duration;
  }
  s.ttft = stat_ms(ttft);
  s.tpot = stat_ms(tpot);
  s.itl = stat_ms(itl);
  s.e2e = stat_ms(e2e);
  return s;
}

Json LoadSummary::to_json() const {
  Json j = Json::object();
  j["duration_s"] = duration;
  j["completed"] = completed;
  j["failed"] = failed;
  j["total_input_tokens"] = input_tokens;
  j["total_output_tokens"] = output_tokens;
  j["request_throughput"] = request_throughput;
  j["output_throughput"] = output_throughput;
  j["total_token_throughput"] = total_token_throughput;
  j["ttft"] = stat_json(ttft);
  j["tpot"] = stat_json(tpot);
  j["itl"] = stat_json(itl);
  j["e2e_latency"] = stat_json(e2e);
  if (!first_error.empty()) j["first_error"] = first_error;
  return j;
}

std::string LoadSummary::table(const std::string& title) const {
  std::string out;
  char line[160];
  auto row = [&](const char* name, double v, const char* fmt) {
    char val[64];
    std::snprintf(val, sizeof val, fmt, v);
    std::snprintf(line, sizeof line, "%-40s %12s\n", name, val);
    out += line;
  };
  auto head = [&](const std::string& t) {
    const int pad = std::max(0, int(53 - t.size() - 2) / 2);
    out += std::string(size_t(pad), '-') + " " + t + " " +
           std::string(size_t(std::max(0, 53 - pad - int(t.size()) - 2)), '-') + "\n";
  };
  head(title);
  row("Successful requests:", completed, "%.0f");
  row("Failed requests:", failed, "%.0f");
  row("Benchmark duration (s):", duration, "%.2f");
  row("Total input tokens:", double(input_tokens), "%.0f");
  row("Total generated tokens:", double(output_tokens), "%.0f");
  row("Request throughput (req/s):", request_throughput, "%.2f");
  row("Output token throughput (tok/s):", output_throughput, "%.2f");
  row("Total Token throughput (tok/s):", total_token_throughput, "%.2f");
  auto block = [&](const char* title2, const char* name, const Stat& s) {
    head(title2);
    std::string n = name;
    row(("Mean " + n + " (ms):").c_str(), s.mean, "%.2f");
    row(("Median " + n + " (ms):").c_str(), s.median, "%.2f");
    row(("P99 " + n + " (ms):").c_str(), s.p99, "%.2f");
  };
  block("Time to First Token", "TTFT", ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", tpot);
  block("Inter-token Latency", "ITL", itl);
  block("End-to-end Latency", "E2EL", e2e);
  out += std::string(53, '=') + "\n";
  return out;
}

std::vector<RequestRecord> run_load_in_process(Engine& engine, const LoadSpec& spec,
                                               double* duration) {
  const std::vector<double> arrivals = poisson_arrivals(spec);
  std::vector<RequestRecord> rec(size_t(spec.num_prompts));
  std::vector<int64_t> ids(rec.size(), -1);
  std::mutex mu;
  std::condition_variable cv;
  int open = 0;
  SamplingParams sp;
  sp.temperature = 0;
  sp.max_tokens = spec.output_len;
  sp.ignore_eos = true;
  const double t0 = clock_now();
  for (size_t i = 0; i < rec.size(); ++i) {
    const double wait = arrivals[i] - (clock_now() - t0);
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    std::vector<int32_t> p = random_prompt(spec, int(i));
    RequestRecord& r = rec[i];
    {
      std::lock_guard<std::mutex> lock(mu);
      r.sent = clock_now() - t0;
      r.prompt_tokens = static_cast<int>(p.size());
      ++open;
    }
    try {
      const int64_t id = engine.submit(std::move(p), sp, [&, i](const TokenEvent& ev) {
        const double t = clock_now() - t0;
        std::lock_guard<std::mutex> lock(mu);
        RequestRecord& q = rec[i];
        if (!ev.tokens.empty()) {
          if (q.chunk_times.empty()) q.first = t;
          q.chunk_times.push_back(t);
          q.output_tokens += static_cast<int>(ev.tokens.size());
        }
        if (ev.finished) {
          q.done = t;
          q.ok = ev.finish_reason != "abort" && q.output_tokens > 0;
          if (!q.ok)
            q.error = "finished with '" + ev.finish_reason + "' after " +
                      std::to_string(q.output_tokens) + " tokens";
          --open;
          cv.notify_all();
        }
      });
      std::lock_guard<std::mutex> lock(mu);
      ids[i] = id;
    } catch (const RequestRejected& e) {
      std::lock_guard<std::mutex> lock(mu);
      r.error = cat("rejected (", e.http_status, "): ", e.message);
      --open;
    }
  }
  std::unique_lock<std::mutex> lock(mu);
  const double deadline = spec.timeout_seconds;
  while (open > 0 && clock_now() - t0 < deadline) cv.wait_for(lock, std::chrono::milliseconds(100));
  if (open > 0) {
    lock.unlock();
    for (size_t i = 0; i < ids.size(); ++i)
      if (ids[i] >= 0) engine.cancel(ids[i]);
    lock.lock();
    // The cancellations end with "abort" events; wait for them so no callback outlives rec.
    const double grace = clock_now() - t0 + 30;
    while (open > 0 && clock_now() - t0 < grace) cv.wait_for(lock, std::chrono::milliseconds(100));
    LOOM_CHECK(open == 0, open, " requests did not end 30 s after being cancelled");
    for (RequestRecord& r : rec)
      if (r.ok == false && r.error.empty()) r.error = "timed out";
  }
  *duration = clock_now() - t0;
  return rec;
}

}  // namespace loom::infer
