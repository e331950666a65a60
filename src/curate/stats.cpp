#include "curate/stats.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::curate {

void Histogram::add(double v) {
  if (bins.empty()) bins.assign(kBins, 0);
  if (!std::isfinite(v)) return;
  double t = hi > lo ? (v - lo) / (hi - lo) : 0;
  int b = static_cast<int>(std::floor(t * kBins));
  b = std::clamp(b, 0, kBins - 1);
  ++bins[b];
  ++count;
  sum += v;
}

void Histogram::merge(const Histogram& o) {
  if (bins.empty()) {
    *this = o;
    return;
  }
  if (o.bins.empty()) return;
  LOOM_CHECK(o.lo == lo && o.hi == hi && o.bins.size() == bins.size(),
             "histograms with different ranges cannot be merged");
  for (size_t i = 0; i < bins.size(); ++i) bins[i] += o.bins[i];
  count += o.count;
  sum += o.sum;
}

Json Histogram::to_json() const {
  Json j = Json::object();
  j["lo"] = lo;
  j["hi"] = hi;
  Json b = Json::array();
  for (int64_t v : bins) b.push_back(v);
  j["bins"] = b;
  j["count"] = count;
  j["mean"] = count ? sum / static_cast<double>(count) : 0.0;
  j["sum"] = sum;
  return j;
}

Histogram Histogram::from_json(const Json& j) {
  Histogram h;
  h.lo = j.at("lo").as_double();
  h.hi = j.at("hi").as_double();
  for (auto& v : j.at("bins").as_array()) h.bins.push_back(v.as_int());
  h.count = j.at("count").as_int();
  h.sum = j.at("sum").as_double();
  return h;
}

void StageStats::merge(const StageStats& o) {
  docs_in += o.docs_in;
  docs_out += o.docs_out;
  bytes_in += o.bytes_in;
  bytes_out += o.bytes_out;
  for (auto& [k, v] : o.reasons) reasons[k] += v;
  for (auto& [k, v] : o.counters) counters[k] += v;
  for (auto& [k, h] : o.histograms) histograms[k].merge(h);
}

Json StageStats::to_json() const {
  Json j = Json::object();
  j["docs_in"] = docs_in;
  j["docs_out"] = docs_out;
  j["bytes_in"] = bytes_in;
  j["bytes_out"] = bytes_out;
  Json r = Json::object();
  for (auto& [k, v] : reasons) r[k] = v;
  j["reasons"] = r;
  Json c = Json::object();
  for (auto& [k, v] : counters) c[k] = v;
  j["counters"] = c;
  Json h = Json::object();
  for (auto& [k, v] : histograms) h[k] = v.to_json();
  j["histograms"] = h;
  return j;
}

StageStats StageStats::from_json(const Json& j) {
  StageStats s;
  s.docs_in = j.at("docs_in").as_int();
  s.docs_out = j.at("docs_out").as_int();
  s.bytes_in = j.at("bytes_in").as_int();
  s.bytes_out = j.at("bytes_out").as_int();
  for (auto& [k, v] : j.at("reasons").as_object()) s.reasons[k] = v.as_int();
  for (auto& [k, v] : j.at("counters").as_object()) s.counters[k] = v.as_int();
  for (auto& [k, v] : j.at("histograms").as_object()) s.histograms[k] = Histogram::from_json(v);
  return s;
}

}  // namespace loom::curate
