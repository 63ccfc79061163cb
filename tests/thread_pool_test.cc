#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <stdexcept>
#include <vector>

#include "core/error.h"

namespace woq {
namespace {

TEST(ThreadPool, CoversRangeOnceWithGrain) {
  for (const int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (const std::int64_t n : {1, 2, 7, 100, 1001}) {
      for (const std::int64_t grain : {1, 4, 16}) {
        std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
        pool.parallel_for(n, [&](std::int64_t b, std::int64_t e) {
          EXPECT_EQ(b % grain, 0);
          for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
        }, grain);
        for (const auto& h : hits) ASSERT_EQ(h.load(), 1);
      }
    }
  }
}

TEST(ThreadPool, RethrowsWorkerException) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(100, [](std::int64_t b, std::int64_t) {
    if (b > 0) throw Error("boom");
  }), Error);
  // The pool stays usable.
  std::atomic<std::int64_t> sum = 0;
  pool.parallel_for(10, [&](std::int64_t b, std::int64_t e) { sum += e - b; });
  EXPECT_EQ(sum.load(), 10);
}

TEST(ThreadPool, RefusesAbsurdThreadCounts) {
  EXPECT_THROW(ThreadPool(ThreadPool::kMaxThreads + 1), Error);
  EXPECT_EQ(ThreadPool(3).size(), 3);
}

}  // namespace
}  // namespace woq
