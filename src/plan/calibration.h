// Calibrating the planner to a measured machine: fit the GEMM-shape efficiency curve and the
// collective-communication line (bandwidth, latency) to measurements, and write them as a
// cluster file the planner reads (bench/plan_calibrate.sh measures; this file only does the
// arithmetic and the parsing, so it is tested without timing anything).
#pragma once

#include <string>
#include <vector>

#include "core/json.h"

namespace loom::plan {

// One timed GEMM: C[M,N] = A[M,K] B[K,N] at `gflops`.
struct GemmSample {
  double m = 0, n = 0, k = 0, gflops = 0;
};

// The planner's curve eff(M,N,K) = top / (1 + d0 (1/M + 1/N + 1/K)) against `peak`.
struct GemmCurve {
  double top = 0;  // efficiency of an infinitely large GEMM (may exceed 1 slightly on a CPU)
  double d0 = 0;
};
// Least squares of 1/eff on (1/M + 1/N + 1/K), which is linear in the curve's two constants.
// Needs at least two samples of different shape. A fit that is not physical (d0 <= 0: no shape
// penalty measurable; or 1/top <= 0: noise) gives d0 = 0 and top = the harmonic mean
// efficiency. top is capped at 1 (the peak is the best rate measured).
GemmCurve fit_gemm_curve(const std::vector<GemmSample>& s, double peak_gflops);

enum class Collective { all_reduce, all_gather, reduce_scatter };
const char* name(Collective c);
Collective parse_collective(const std::string& s);  // throws listing the valid names

// One timed collective: `bytes` is the full buffer on each rank (as in step_time.cpp).
struct CommSample {
  Collective op = Collective::all_reduce;
  int ranks = 2;
  double bytes = 0, seconds = 0;
};

// Bus bandwidth, per-hop latency and summing rate of the ring model the planner uses:
// all-reduce 2(g-1)/g B/bw + 2(g-1) lat + (g-1)/g B/reduce_bw; all-gather (g-1)/g B/bw +
// (g-1) lat; reduce-scatter as all-gather plus (g-1)/g B/reduce_scatter_bw.
struct LinkFit {
  double bw_gbs = 0, lat_us = 0;
  // Summing rates; 0: free (not separable, or below resolution). Two, because MPI libraries
  // implement all-reduce and reduce-scatter with different algorithms.
  double reduce_bw_gbs = 0, reduce_scatter_bw_gbs = 0;
};
// Least squares over every sample (weighted by 1/seconds, i.e. relative error, so small
// messages pin the latency and large ones the bandwidth). A summing rate is fitted only when
// there are all-gather samples next to that collective's. A negative latency or summing cost is
// dropped (0) and the rest refitted. Throws without two sizes.
LinkFit fit_link(const std::vector<CommSample>& s);

// {"samples": [{"op": "all_reduce", "ranks": 2, "bytes": ..., "seconds": ...}, ...]}, as
// written by `bench_plan_calibrate comm`. Errors name `where`, the sample index and the field.
std::vector<CommSample> parse_comm_samples(const Json& j, const std::string& where);
Json comm_samples_json(const std::vector<CommSample>& s);

// Everything a cluster file for this machine needs; one "GPU" is one rank with
// `threads_per_rank` cores.
struct Calibration {
  std::string name = "this-machine";
  int threads_per_rank = 1;
  int ranks_per_node = 1;  // cores / threads_per_rank: ranks that fit without sharing cores
  double peak_gflops = 0;  // large square sgemm, per rank
  GemmCurve gemm;
  double mem_bw_gbs = 0;    // per rank, all ranks streaming at once
  double mem_gb = 0;        // memory per rank
  double cache_mb = 0;      // last-level cache per rank (0: not measured)
  double cache_bw_gbs = 0;  // elementwise work in it, as the planner counts bytes, per rank
  LinkFit link;             // between ranks of the node
  double load_avg = -1;     // 1-minute load average when measured (-1: unknown)
  std::string measured_at;  // free text (date, host)
  std::vector<GemmSample> gemm_samples;
};

// A TOML [cluster] section the planner reads (`loom plan --config FILE`), with comments that
// keep the raw measurements next to the fitted figures.
std::string cluster_toml(const Calibration& c);

}  // namespace loom::plan
