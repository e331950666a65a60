// Straggler detection: each rank's work time per step is scored against the median over the
// ranks (score = median / rank's time, as NVIDIA Resiliency Extension's relative scores); a
// rank whose score stays below the threshold for `patience` consecutive steps is a straggler.
//
// Times come from when the supervisor receives each rank's section begins and step end, on its
// one clock. Ranks in synchronous training wait for the slowest at every collective, so a raw
// section time would make the waiting ranks look slow: a rank's time in a section counts only
// from when the last rank began that section (time before that was, at best, spent waiting for
// it). The slow rank's extra time then shows in the section where it was spent (for example
// "data"), not in the one where its peers waited. Work hidden inside one section that ends in a
// collective (a slow GEMM between two gradient reductions) is not separated by this.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::resil {

struct StragglerOptions {
  double threshold = 0.75;   // flagged below this score
  int patience = 5;          // ... for this many consecutive steps
  double min_excess = 0.01;  // seconds over the median below which nobody is flagged (noise)
  void validate() const;
};

struct StragglerReport {
  enum Kind { Flagged, Slow, Recovered } kind = Slow;  // Flagged: the first step it is named
  int rank = -1;
  int64_t step = 0;
  double score = 1;
  double seconds = 0;   // the rank's work time in the step
  double median = 0;    // the median over ranks
  std::string section;  // the section with the lowest score
  double section_score = 1;
};

class StragglerDetector {
 public:
  StragglerDetector(int world, StragglerOptions o);
  // Arrival times (seconds, the supervisor's clock) of a rank's section begins and step ends.
  void on_section(int rank, int64_t step, const std::string& name, double t);
  // Returns what this completed step says (empty until every rank has ended `step`).
  std::vector<StragglerReport> on_step_end(int rank, int64_t step, double t);
  void reset();  // a new attempt: steps repeat, old records mean nothing
  // The scores of the last scored step (for tests and the log); empty before one.
  const std::vector<double>& last_scores() const { return last_scores_; }

 private:
  struct RankStep {
    std::vector<std::pair<std::string, double>> sections;  // name, begin
    double end = -1;
  };
  struct StepRecord {
    std::vector<RankStep> ranks;
    int ended = 0;
  };
  std::vector<StragglerReport> score(int64_t step, const StepRecord& rec);

  int world_;
  StragglerOptions o_;
  std::map<int64_t, StepRecord> steps_;
  std::vector<int> low_run_;  // consecutive steps below threshold, per rank
  std::vector<double> last_scores_;
};

}  // namespace loom::resil
