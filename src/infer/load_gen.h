// Load generation for serving benchmarks (`loom bench serve`), after `vllm bench serve`: a
// seeded random-prompt dataset, Poisson arrival times, per-request timing records, and their
// summary (request and token throughput, TTFT / TPOT / ITL / end-to-end percentiles). The
// drivers that send the requests (in-process to an Engine here; over HTTP in serve/) fill
// RequestRecords; summarize() is the same for both, so their figures compare.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/json.h"
#include "infer/engine_api.h"

namespace loom::infer {

struct LoadSpec {
  int num_prompts = 64;
  int input_len = 128, output_len = 64;
  int vocab = 256;  // prompt token ids are drawn uniformly from [0, vocab)
  double rate = std::numeric_limits<double>::infinity();  // requests/s; inf: all at once
  uint64_t seed = 0;
  double timeout_seconds = 600;  // the whole run; requests still open then count as failed
};

// Prompt i of the dataset (the same ids for a given seed, whatever the driver).
std::vector<int32_t> random_prompt(const LoadSpec& spec, int i);
// Send times (seconds from the start) of the num_prompts requests: cumulative exponential gaps
// of mean 1/rate (a Poisson process), drawn from Philox(seed); all 0 when rate is infinite.
std::vector<double> poisson_arrivals(const LoadSpec& spec);

// One request's life, in seconds from the run's start.
struct RequestRecord {
  double sent = 0, first = 0, done = 0;
  std::vector<double> chunk_times;  // each arrival of output (a streamed chunk, an engine step)
  int prompt_tokens = 0, output_tokens = 0;
  bool ok = false;
  std::string error;  // why it failed
};

struct LoadSummary {
  double duration = 0;
  int completed = 0, failed = 0;
  int64_t input_tokens = 0, output_tokens = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  // Milliseconds: mean, median, p99 (vllm's defaults), over completed requests.
  struct Stat {
    double mean = 0, median = 0, p99 = 0;
  } ttft, tpot, itl, e2e;
  std::string first_error;
  Json to_json() const;
  std::string table(const std::string& title) const;  // vllm-style text block
};

// TPOT of a request excludes the first token: (done - first) / (output_tokens - 1); ITL is every
// gap between consecutive output arrivals.
LoadSummary summarize(const std::vector<RequestRecord>& records, double duration);

// Percentile p (0..100) by linear interpolation between order statistics (numpy's default).
double percentile(std::vector<double> v, double p);

// Drives an engine in-process: request i is submitted at arrivals[i] (greedy, ignore_eos,
// max_tokens = output_len), every token event timestamped. Returns when all have finished or
// the spec's timeout has passed (those still open are cancelled and count as failed).
std::vector<RequestRecord> run_load_in_process(Engine& engine, const LoadSpec& spec,
                                               double* duration);

}  // namespace loom::infer
