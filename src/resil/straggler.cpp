#include "resil/straggler.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace loom::resil {

void StragglerOptions::validate() const {
  LOOM_CHECK(std::isfinite(threshold) && threshold > 0 && threshold < 1,
             "--straggler-threshold must lie in (0, 1), got ", threshold);
  LOOM_CHECK(patience >= 1, "--straggler-patience must be >= 1, got ", patience);
  LOOM_CHECK(std::isfinite(min_excess) && min_excess >= 0,
             "the straggler noise margin must be >= 0 seconds");
}

StragglerDetector::StragglerDetector(int world, StragglerOptions o)
    : world_(world), o_(o), low_run_(size_t(std::max(world, 0)), 0) {}

void StragglerDetector::reset() {
  steps_.clear();
  std::fill(low_run_.begin(), low_run_.end(), 0);
}

void StragglerDetector::on_section(int rank, int64_t step, const std::string& name, double t) {
  if (world_ < 2 || rank < 0 || rank >= world_) return;
  StepRecord& rec = steps_[step];
  if (rec.ranks.empty()) rec.ranks.resize(size_t(world_));
  rec.ranks[size_t(rank)].sections.emplace_back(name, t);
  // A rank that died mid-step leaves its record unfinished: keep only the recent ones.
  while (steps_.size() > 64) steps_.erase(steps_.begin());
}

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<StragglerReport> StragglerDetector::on_step_end(int rank, int64_t step, double t) {
  if (world_ < 2 || rank < 0 || rank >= world_) return {};
  auto it = steps_.find(step);
  if (it == steps_.end()) return {};
  RankStep& rs = it->second.ranks[size_t(rank)];
  if (rs.end >= 0 || rs.sections.empty()) return {};
  rs.end = t;
  if (++it->second.ended < world_) return {};
  std::vector<StragglerReport> out = score(step, it->second);
  steps_.erase(steps_.begin(), std::next(it));
  return out;
}

std::vector<StragglerReport> StragglerDetector::score(int64_t step, const StepRecord& rec) {
  // When the last rank began each section (only sections every rank went through).
  std::map<std::string, double> last_begin;
  std::map<std::string, int> seen;
  for (const RankStep& rs : rec.ranks)
    for (const auto& [name, t] : rs.sections) {
      double& lb = last_begin[name];
      lb = seen[name]++ ? std::max(lb, t) : t;
    }
  // Each rank's work per section: from max(own begin, last rank's begin) to the section's end.
  std::vector<double> work(size_t(world_), 0);
  std::vector<std::map<std::string, double>> per(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    const RankStep& rs = rec.ranks[size_t(r)];
    for (size_t i = 0; i < rs.sections.size(); ++i) {
      const auto& [name, begin] = rs.sections[i];
      double end = i + 1 < rs.sections.size() ? rs.sections[i + 1].second : rs.end;
      double from = seen[name] == world_ ? std::max(begin, last_begin[name]) : begin;
      double d = std::max(0.0, end - from);
      per[size_t(r)][name] += d;
      work[size_t(r)] += d;
    }
  }
  double med = median(work);
  std::vector<StragglerReport> out;
  last_scores_.assign(size_t(world_), 1.0);
  for (int r = 0; r < world_; ++r) {
    double w = work[size_t(r)];
    double s = w > 0 ? std::min(1e6, med / w) : 1.0;
    last_scores_[size_t(r)] = s;
    bool low = s < o_.threshold && w - med >= o_.min_excess;
    int& run = low_run_[size_t(r)];
    bool was_flagged = run >= o_.patience;
    run = low ? run + 1 : 0;
    if (!low && !was_flagged) continue;
    if (low && run < o_.patience) continue;
    StragglerReport rep;
    rep.kind = !low                 ? StragglerReport::Recovered
               : run == o_.patience ? StragglerReport::Flagged
                                    : StragglerReport::Slow;
    rep.rank = r;
    rep.step = step;
    rep.score = s;
    rep.seconds = w;
    rep.median = med;
    // The section that explains it: the lowest score against that section's median.
    for (const auto& [name, d] : per[size_t(r)]) {
      std::vector<double> all;
      for (int q = 0; q < world_; ++q) {
        auto f = per[size_t(q)].find(name);
        all.push_back(f == per[size_t(q)].end() ? 0 : f->second);
      }
      double sm = median(all);
      double ss = d > 0 ? sm / d : 1.0;
      if (rep.section.empty() || ss < rep.section_score) {
        rep.section = name;
        rep.section_score = ss;
      }
    }
    out.push_back(rep);
  }
  return out;
}

}  // namespace loom::resil
