#include "core/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <set>
#include <stdexcept>
#include <thread>

#include "core/error.h"

using namespace loom;

// Counts how often each index ran and on how many distinct threads.
struct Tally {
  explicit Tally(size_t n) : runs(n) {}
  std::vector<std::atomic<int>> runs;
  std::mutex mu;
  std::set<std::thread::id> threads;
  void hit(size_t i) {
    ++runs[i];
    std::lock_guard<std::mutex> l(mu);
    threads.insert(std::this_thread::get_id());
  }
};

TEST(ParallelFor, EveryIndexRunsExactlyOnce) {
  for (int workers : {1, 2, 3, 8}) {
    Tally t(1000);
    parallel_for(1000, workers, [&](size_t i) { t.hit(i); });
    for (size_t i = 0; i < 1000; ++i) ASSERT_EQ(t.runs[i].load(), 1) << i << " workers " << workers;
    EXPECT_LE(t.threads.size(), static_cast<size_t>(workers));
  }
}

TEST(ParallelFor, ZeroItemsRunsNothing) {
  std::atomic<int> calls{0};
  parallel_for(0, 4, [&](size_t) { ++calls; });
  EXPECT_EQ(calls.load(), 0);
}

TEST(ParallelFor, MoreWorkersThanItemsStartsNoIdleThreads) {
  Tally t(3);
  parallel_for(3, 64, [&](size_t i) {
    // Hold each item a little so that idle extra threads, were they started, would show up.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    t.hit(i);
  });
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t.runs[i].load(), 1);
  EXPECT_LE(t.threads.size(), 3u);
}

TEST(ParallelFor, NonPositiveWorkersRunOnTheCaller) {
  Tally t(5);
  parallel_for(5, 0, [&](size_t i) { t.hit(i); });
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(t.runs[i].load(), 1);
  ASSERT_EQ(t.threads.size(), 1u);
  EXPECT_EQ(*t.threads.begin(), std::this_thread::get_id());
}

TEST(ParallelFor, FirstExceptionPropagatesAndStopsNewItems) {
  std::atomic<int> started{0};
  try {
    parallel_for(10000, 2, [&](size_t i) {
      ++started;
      if (i == 3) throw Error("item 3 failed");
      // Slow enough that the other thread cannot run through all items while item 3 throws.
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    });
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "item 3 failed");
  }
  // Items already handed out may finish, but the job stops well short of all 10000.
  EXPECT_LT(started.load(), 10000);
  // A non-loom exception keeps its type.
  EXPECT_THROW(parallel_for(4, 2, [](size_t) { throw std::out_of_range("x"); }), std::out_of_range);
}

// A queue fed by the caller and drained by long-lived loops, as the tokenizer job does.
TEST(WorkerGroup, LoopsDrainAQueueAndJoin) {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<int> queue;
  bool stop = false;
  std::vector<std::atomic<int>> seen(100);
  std::set<int> loop_ids;
  WorkerGroup g(3, [&](int t) {
    {
      std::lock_guard<std::mutex> l(mu);
      loop_ids.insert(t);
    }
    for (;;) {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return !queue.empty() || stop; });
      if (queue.empty()) return;
      int v = queue.front();
      queue.pop_front();
      l.unlock();
      ++seen[static_cast<size_t>(v)];
    }
  });
  for (int v = 0; v < 100; ++v) {
    std::lock_guard<std::mutex> l(mu);
    queue.push_back(v);
    cv.notify_one();
  }
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
  }
  cv.notify_all();
  g.join();
  EXPECT_FALSE(g.failed());
  EXPECT_EQ(loop_ids, (std::set<int>{0, 1, 2}));
  for (auto& s : seen) EXPECT_EQ(s.load(), 1);
}

TEST(WorkerGroup, ExceptionRunsOnErrorAndJoinRethrows) {
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::atomic<int> on_error_calls{0};
  WorkerGroup g(
      4,
      [&](int t) {
        if (t == 2) throw Error("loop 2 failed");
        // The other loops wait until on_error releases them: without it join() would hang.
        std::unique_lock<std::mutex> l(mu);
        cv.wait(l, [&] { return stop; });
      },
      [&] {
        ++on_error_calls;
        {
          std::lock_guard<std::mutex> l(mu);
          stop = true;
        }
        cv.notify_all();
      });
  try {
    g.join();
    FAIL() << "no exception";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "loop 2 failed");
  }
  EXPECT_TRUE(g.failed());
  EXPECT_EQ(on_error_calls.load(), 1);
  EXPECT_NO_THROW(g.join_quietly());
}
