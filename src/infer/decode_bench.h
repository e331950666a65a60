// Decode speed against the memory-bandwidth roofline (`loom bench serve --decode`): single-stream
// decode is bound by the bytes read per token (every linear weight once, plus the KV cache of
// the context), so its ceiling is a measured streaming-read bandwidth divided by those bytes.
// Also the aggregate decode rate of many concurrent streams (continuous batching).
#pragma once

#include <string>

#include "core/json.h"
#include "infer/decode_profile.h"
#include "infer/engine.h"
#include "model/decoder.h"

namespace loom::infer {

// GB/s of a large streaming read (a buffer far past the caches, summed by every OpenMP
// thread; on AVX-512 CPUs also read with the decode GEMV's 512-bit loads and prefetches, the
// faster counting): what reading the weights once per token can at best achieve. Best of
// `passes`. The buffer is on huge pages (kernels/cpu/gemm_lowp_pages.h), as the serving weights
// and KV pool are; `huge_pages` false reads one on the default 4 KiB pages.
double measure_read_bandwidth_gbs(int passes = 3, bool huge_pages = true);

// Bytes read per decoded token besides the KV cache: every linear weight (the head included) at
// `bytes_per_weight`, plus `bytes_per_channel` per output channel (int8 scales), plus every other
// parameter once in fp32 (norms, biases), minus the embedding tables, of which one row is read.
double decode_weight_bytes(const Decoder& model, double bytes_per_weight,
                           double bytes_per_channel = 0);

struct DecodeBenchOptions {
  int input_len = 128, output_len = 64, streams = 16;
  uint64_t seed = 0;
};

struct DecodeBenchResult {
  std::string kv_cache_dtype;  // what the KV pool stored ("fp32", "bf16", "fp8")
  int kv_blocks = 0;           // blocks of the pool: what the memory budget bought
  double read_bandwidth_gbs = 0;
  double prefill_seconds = 0;
  double single_tokens_per_s = 0;  // one stream, after its first token
  double bytes_per_token = 0;      // weights + the KV cache at the mean decode context
  double roofline_tokens_per_s = 0, roofline_ratio = 0;
  int streams = 0;
  double batch_tokens_per_s = 0;  // all streams decoding: tokens after the last first token
  // Process CPU time over the same tokens, per token (steadier than the rate under load at one
  // thread; at more, waiting threads' spinning counts too).
  double batch_cpu_seconds_per_token = 0;
  // The single stream's decode steps (after the first token), part by part; the time between
  // steps (the engine loop, callbacks) is decode_seconds less the steps'.
  DecodeProfile profile;
  double decode_seconds = 0;
  // Process CPU time over the same decode: at one thread, time on the CPU whatever else the
  // machine runs (a load that takes the core away stretches decode_seconds, not this).
  double decode_cpu_seconds = 0;
  int decode_tokens = 0;
  // The many streams' decode steps once every stream is decoding, part by part, over
  // streams_seconds (wall clock; streams_cpu_seconds of process CPU time).
  DecodeProfile streams_profile;
  double streams_seconds = 0, streams_cpu_seconds = 0;
  Json to_json() const;
  // One line per part: milliseconds per token (the many streams': per step), share of the
  // token, and GB/s where bytes are read (the GEMV's weights, the attention's keys and values)
  // against read_bandwidth_gbs.
  std::string profile_text() const;
};

// Greedy, ignore_eos, random prompts of input_len; the engine is built here from `ec`.
DecodeBenchResult run_decode_bench(ModelRunner& runner, const EngineConfig& ec, double weight_bytes,
                                   const DecodeBenchOptions& o);

}  // namespace loom::infer
