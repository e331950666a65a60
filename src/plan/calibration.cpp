#include "plan/calibration.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <set>

#include "core/error.h"

namespace loom::plan {

namespace {

std::string g6(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", v);
  return b;
}

}  // namespace

GemmCurve fit_gemm_curve(const std::vector<GemmSample>& s, double peak_gflops) {
  LOOM_CHECK(peak_gflops > 0, "fit_gemm_curve: peak must be positive, got ", peak_gflops);
  std::set<double> shapes;
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const GemmSample& g = s[i];
    LOOM_CHECK(g.m > 0 && g.n > 0 && g.k > 0 && g.gflops > 0, "GEMM sample ", i,
               ": M, N, K and gflops must be positive (got ", g.m, " x ", g.n, " x ", g.k, " at ",
               g.gflops, " GFLOP/s)");
    double x = 1 / g.m + 1 / g.n + 1 / g.k, y = peak_gflops / g.gflops;
    shapes.insert(x);
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  LOOM_CHECK(shapes.size() >= 2, "fit_gemm_curve: need samples of at least two shapes (got ",
             s.size(), " samples, ", shapes.size(), " distinct)");
  const double n = double(s.size());
  const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const double intercept = (sy - slope * sx) / n;
  // A flat curve (no measurable shape penalty: CPU sgemm kernels tile small blocks) or one
  // that is not physical (noise, e.g. a loaded machine): d0 = 0 and top = the harmonic mean
  // efficiency, i.e. the one constant that predicts the samples' total time.
  if (slope <= 0 || intercept <= 0) return {std::min(1.0, n / sy), 0};
  return {std::min(1.0, 1 / intercept), slope / intercept};
}

const char* name(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
  }
  return "?";
}

Collective parse_collective(const std::string& s) {
  for (Collective c : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter})
    if (s == name(c)) return c;
  fail("unknown collective '", s, "' (valid: all_reduce, all_gather, reduce_scatter)");
}

namespace {

// Weighted least squares t ~ sum_j p_j x_j over the parameters in `use` (rows scaled by 1/t,
// i.e. relative error); the others are 0. Returns false if the system is singular.
bool solve_ls(const std::vector<std::array<double, 4>>& x, const std::vector<double>& t,
              const std::array<bool, 4>& use, std::array<double, 4>& p) {
  std::vector<int> idx;
  for (int j = 0; j < 4; ++j)
    if (use[j]) idx.push_back(j);
  const size_t k = idx.size();
  std::vector<std::vector<double>> A(k, std::vector<double>(k + 1, 0));
  for (size_t i = 0; i < x.size(); ++i)
    for (size_t r = 0; r < k; ++r) {
      for (size_t c = 0; c < k; ++c) A[r][c] += x[i][idx[r]] * x[i][idx[c]] / (t[i] * t[i]);
      A[r][k] += x[i][idx[r]] / t[i];
    }
  for (size_t c = 0; c < k; ++c) {  // Gauss-Jordan with partial pivoting
    size_t piv = c;
    for (size_t r = c + 1; r < k; ++r)
      if (std::fabs(A[r][c]) > std::fabs(A[piv][c])) piv = r;
    std::swap(A[c], A[piv]);
    if (std::fabs(A[c][c]) < 1e-300) return false;
    for (size_t r = 0; r < k; ++r) {
      if (r == c) continue;
      double f = A[r][c] / A[c][c];
      for (size_t cc = c; cc <= k; ++cc) A[r][cc] -= f * A[c][cc];
    }
  }
  p = {0, 0, 0, 0};
  for (size_t r = 0; r < k; ++r) p[idx[r]] = A[r][k] / A[r][r];
  return true;
}

}  // namespace

LinkFit fit_link(const std::vector<CommSample>& s) {
  std::set<double> sizes;
  bool reducing = false, scattering = false, moving = false;
  // t = x0 / bw + x1 lat + x2 / reduce_bw + x3 / reduce_scatter_bw: ring hops of bytes, hops,
  // bytes summed by an all-reduce, bytes summed by a reduce-scatter (MPI libraries implement
  // the two differently, so each has its own summing rate).
  std::vector<std::array<double, 4>> x;
  std::vector<double> t;
  for (size_t i = 0; i < s.size(); ++i) {
    const CommSample& c = s[i];
    LOOM_CHECK(c.ranks >= 2 && c.bytes > 0 && c.seconds > 0, "communication sample ", i,
               ": ranks must be >= 2 and bytes, seconds positive (got ranks=", c.ranks,
               " bytes=", c.bytes, " seconds=", c.seconds, ")");
    double g = c.ranks, hops = c.op == Collective::all_reduce ? 2 * (g - 1) : g - 1;
    const bool ar = c.op == Collective::all_reduce, rs = c.op == Collective::reduce_scatter;
    (ar ? reducing : rs ? scattering : moving) = true;
    const double summed = (g - 1) / g * c.bytes;
    x.push_back({hops / g * c.bytes, hops, ar ? summed : 0.0, rs ? summed : 0.0});
    t.push_back(c.seconds);
    sizes.insert(c.bytes);
  }
  LOOM_CHECK(sizes.size() >= 2, "fit_link: need samples of at least two message sizes (got ",
             sizes.size(), ")");
  // The summing rate is separable from the link only with samples that move data without
  // summing it (all-gather) next to ones that sum (all-reduce, reduce-scatter).
  std::array<bool, 4> use = {true, true, reducing && moving, scattering && moving};
  std::array<double, 4> p{};
  for (int round = 0; round < 4; ++round) {
    LOOM_CHECK(solve_ls(x, t, use, p), "fit_link: degenerate samples; measure again");
    bool changed = false;
    for (int j = 1; j < 4; ++j)  // a negative latency or summing cost: below resolution
      if (use[j] && p[j] < 0) use[j] = false, changed = true;
    if (!changed) break;
  }
  LOOM_CHECK(p[0] > 0, "fit_link: time does not grow with message size; measure again");
  return {1 / p[0] / 1e9, p[1] * 1e6, p[2] > 0 ? 1 / p[2] / 1e9 : 0, p[3] > 0 ? 1 / p[3] / 1e9 : 0};
}

std::vector<CommSample> parse_comm_samples(const Json& j, const std::string& where) {
  LOOM_CHECK(j.is_object() && j.contains("samples") && j.at("samples").is_array(), where,
             ": expected an object with a 'samples' array");
  std::vector<CommSample> out;
  const Json::Array& a = j.at("samples").as_array();
  for (size_t i = 0; i < a.size(); ++i) {
    auto field = [&](const char* f) -> const Json& {
      LOOM_CHECK(a[i].is_object() && a[i].contains(f), where, ": samples[", i, "]: missing field '",
                 f, "'");
      return a[i].at(f);
    };
    auto number = [&](const char* f) {
      const Json& v = field(f);
      LOOM_CHECK(v.is_number(), where, ": samples[", i, "].", f, ": expected a number");
      double d = v.as_double();
      LOOM_CHECK(d > 0, where, ": samples[", i, "].", f, " must be positive, got ", d);
      return d;
    };
    CommSample c;
    const Json& op = field("op");
    LOOM_CHECK(op.is_string(), where, ": samples[", i, "].op: expected a string");
    try {
      c.op = parse_collective(op.as_string());
    } catch (const Error& e) {
      fail(where, ": samples[", i, "].op: ", e.what());
    }
    c.ranks = int(number("ranks"));
    LOOM_CHECK(c.ranks >= 2, where, ": samples[", i, "].ranks must be >= 2, got ", c.ranks);
    c.bytes = number("bytes");
    c.seconds = number("seconds");
    out.push_back(c);
  }
  LOOM_CHECK(!out.empty(), where, ": 'samples' is empty");
  return out;
}

Json comm_samples_json(const std::vector<CommSample>& s) {
  Json a = Json::array();
  for (const CommSample& c : s)
    a.push_back(Json(Json::Object{
        {"op", name(c.op)}, {"ranks", c.ranks}, {"bytes", c.bytes}, {"seconds", c.seconds}}));
  return Json(Json::Object{{"samples", a}});
}

std::string cluster_toml(const Calibration& c) {
  LOOM_CHECK(c.peak_gflops > 0 && c.gemm.top > 0 && c.mem_bw_gbs > 0 && c.mem_gb > 0 &&
                 c.link.bw_gbs > 0 && c.threads_per_rank >= 1 && c.ranks_per_node >= 1,
             "cluster_toml: incomplete calibration of '", c.name, "'");
  std::string o;
  o += "# " + c.name + ": this machine measured by bench/plan_calibrate.sh (do not edit by hand;\n";
  o += "# rerun the script). One planner \"GPU\" is one rank of " +
       std::to_string(c.threads_per_rank) + " thread(s), fp32 training.\n";
  if (!c.measured_at.empty()) o += "# measured: " + c.measured_at + "\n";
  o += "# 1-minute load average when measured: " +
       (c.load_avg >= 0 ? g6(c.load_avg) : std::string("unknown")) + "\n";
  o += "# sgemm samples (M x N x K: GFLOP/s measured, fitted curve):\n";
  for (const GemmSample& g : c.gemm_samples) {
    double fit = c.peak_gflops * c.gemm.top / (1 + c.gemm.d0 * (1 / g.m + 1 / g.n + 1 / g.k));
    o += "#   " + g6(g.m) + " x " + g6(g.n) + " x " + g6(g.k) + ": " + g6(g.gflops) + ", " +
         g6(fit) + "\n";
  }
  o += "[cluster]\n";
  o += "name = \"" + c.name + "\"\n";
  o += "gpu = \"custom\"\n";
  o += "gpus_per_node = " + std::to_string(c.ranks_per_node) + "\n";
  o += "nodes = 1\n";
  o +=
      "peak_fp32_tflops = " + g6(c.peak_gflops / 1e3) + "   # best sgemm rate measured, per rank\n";
  o += "peak_bf16_tflops = " + g6(c.peak_gflops / 1e3) + "   # no faster bf16 GEMM: same\n";
  o += "gemm_eff_bf16 = " + g6(c.gemm.top) + "   # fitted curve (also used for fp32)\n";
  o += "gemm_dim0 = " + g6(c.gemm.d0) + "\n";
  o += "hbm_gb = " + g6(c.mem_gb) + "\n";
  o += "hbm_bw_gbs = " + g6(c.mem_bw_gbs) + "   # stream triad, every rank at once\n";
  if (c.cache_mb > 0 && c.cache_bw_gbs > 0) {
    o += "cache_mb = " + g6(c.cache_mb) + "   # last-level cache per rank\n";
    o += "cache_bw_gbs = " + g6(c.cache_bw_gbs) + "   # Loom's elementwise kernels in it\n";
  }
  o += "intra_bw_gbs = " + g6(c.link.bw_gbs) + "   # MPI bus bandwidth between local ranks\n";
  o += "intra_lat_us = " + g6(c.link.lat_us) + "\n";
  if (c.link.reduce_bw_gbs > 0)
    o += "reduce_bw_gbs = " + g6(c.link.reduce_bw_gbs) +
         "   # summing received data in an all-reduce\n";
  if (c.link.reduce_scatter_bw_gbs > 0)
    o += "reduce_scatter_bw_gbs = " + g6(c.link.reduce_scatter_bw_gbs) +
         "   # summing received data in a reduce-scatter\n";
  o += "inter_bw_gbs = " + g6(c.link.bw_gbs) + "   # one node: unused\n";
  o += "inter_lat_us = " + g6(c.link.lat_us) + "\n";
  o += "link_eff = 1   # the bandwidths above are measured, not nominal\n";
  o += "comm_overlaps_compute = false   # shared-memory MPI copies run on the ranks' cores\n";
  return o;
}

}  // namespace loom::plan
