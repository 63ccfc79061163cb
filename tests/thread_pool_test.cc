#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/scratch_arena.h"

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

// parallel_for_threads: each chunk learns its thread, no two chunks of a call share one, and thread 0 is the caller.
TEST(ThreadPool, ParallelForThreadsNamesEachChunksThread) {
  for (const int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (const std::int64_t n : {1, 2, 5, 100}) {
      std::vector<std::atomic<int>> used(static_cast<std::size_t>(threads));
      std::atomic<std::int64_t> covered = 0;
      const auto caller = std::this_thread::get_id();
      pool.parallel_for_threads(n, [&](int thread, std::int64_t b, std::int64_t e) {
        ASSERT_GE(thread, 0);
        ASSERT_LT(thread, pool.size());
        EXPECT_EQ(used[static_cast<std::size_t>(thread)]++, 0) << "thread " << thread << " got two chunks";
        EXPECT_EQ(thread == 0, std::this_thread::get_id() == caller);
        covered += e - b;
      });
      EXPECT_EQ(covered.load(), n);
    }
  }
}

TEST(ThreadPool, RefusesAbsurdThreadCounts) {
  EXPECT_THROW(ThreadPool(ThreadPool::kMaxThreads + 1), Error);
  EXPECT_EQ(ThreadPool(3).size(), 3);
}

TEST(ScratchArena, GrowsAlignedKeepsItsBufferAndRefusesBadRequests) {
  ScratchArena arena;
  EXPECT_EQ(arena.bytes(), 0);
  float* a = arena.get<float>(1, 100);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(a) % 64, 0u);
  for (int i = 0; i < 100; ++i) a[i] = static_cast<float>(i);
  EXPECT_EQ(arena.get<float>(1, 50), a);  // a smaller request keeps the buffer and its contents
  EXPECT_EQ(a[99], 99.0f);
  auto* b = arena.get<std::int64_t>(2, 3);  // another slot: another buffer
  EXPECT_NE(static_cast<void*>(b), static_cast<void*>(a));
  EXPECT_GE(arena.bytes(), 400 + 24);
  float* c = arena.get<float>(1, 100000);  // a larger one may move it
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(c) % 64, 0u);
  c[99999] = 1.0f;
  EXPECT_GE(arena.bytes(), 400000);
  EXPECT_THROW(arena.get<float>(ScratchArena::kSlots, 1), Error);
  EXPECT_THROW(arena.get<float>(-1, 1), Error);
  EXPECT_THROW(arena.get<float>(0, -1), Error);
  EXPECT_THROW(arena.get<double>(0, std::numeric_limits<std::int64_t>::max() / 2), Error);
}

}  // namespace
}  // namespace woq
