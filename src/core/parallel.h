// Worker threads for coarse host-side jobs (curation shards, tokenizer blocks, BPE counting):
// one place that starts, joins and carries a worker's exception back to the caller, instead
// of each job hand-rolling std::thread vectors. Not for numeric kernels (those use OpenMP).
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace loom {

// Runs fn(i) exactly once for every i in [0, n) on at most max(1, workers) threads, the
// caller's thread being one of them; indices are handed out one at a time, so uneven items
// balance. After the first exception no new index starts; the others finish what they hold,
// and that first exception is rethrown here.
void parallel_for(size_t n, int workers, const std::function<void(size_t)>& fn);

// N long-lived worker loops (each usually waiting on a queue the caller feeds): loop(t) runs on
// its own thread for t in [0, n). When a loop throws, on_error runs on that thread (it should
// wake the caller and make the other loops end: set a stop flag, notify the condition
// variables) and join() rethrows the first such exception.
class WorkerGroup {
 public:
  WorkerGroup(int n, std::function<void(int)> loop, std::function<void()> on_error = {});
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  // Joins what is still running (the caller must have made the loops end); never throws.
  ~WorkerGroup();

  // Waits for every loop to return, then rethrows the first exception a loop threw.
  void join();
  // Waits for every loop to return, dropping any loop's exception: for a caller that is already
  // unwinding from an error of its own.
  void join_quietly() noexcept;
  // True once some loop has thrown.
  bool failed() const;

 private:
  std::vector<std::thread> threads_;
  mutable std::mutex mu_;
  std::exception_ptr error_;
};

}  // namespace loom
