// A fixed pool of worker threads running parallel-for loops.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace woq {

/// Runs `fn(begin, end)` over a range split into one contiguous chunk per
/// thread. The calling thread takes part, so a pool of N threads starts N-1
/// workers. Not reentrant: call parallel_for from one thread at a time.
class ThreadPool {
 public:
  /// Most threads a pool may have.
  static constexpr int kMaxThreads = 1024;

  /// `num_threads` <= 0 means std::thread::hardware_concurrency(). Throws
  /// woq::Error above kMaxThreads or when the system cannot start a thread.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  /// Splits [0, n) into at most size() chunks whose boundaries are multiples
  /// of `grain` (except the last) and runs fn on each; returns when all are
  /// done. An exception thrown by fn is rethrown here (the first one).
  void parallel_for(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fn,
                    std::int64_t grain = 1);
  /// parallel_for whose fn(thread, begin, end) also learns which thread runs
  /// the chunk: thread in [0, size()), 0 the caller's, no two chunks of one
  /// call on the same thread (an index into per-thread buffers, Workspace).
  void parallel_for_threads(std::int64_t n,
                            const std::function<void(int, std::int64_t, std::int64_t)>& fn,
                            std::int64_t grain = 1);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int, std::int64_t, std::int64_t)>* job_ = nullptr;
  std::vector<std::pair<std::int64_t, std::int64_t>> chunks_;
  std::uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace woq
