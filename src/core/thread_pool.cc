#include "core/thread_pool.h"

#include <algorithm>
#include <system_error>

#include "core/error.h"

namespace woq {

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (num_threads > kMaxThreads) fail("{} threads requested; the limit is {}", num_threads, kMaxThreads);
  try {
    for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    start_cv_.notify_all();
    for (auto& t : workers_) t.join();
    fail("cannot start {} threads: {}", num_threads, e.what());
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_loop(int index) {
  std::uint64_t seen = 0;
  for (;;) {
    std::pair<std::int64_t, std::int64_t> chunk;
    const std::function<void(int, std::int64_t, std::int64_t)>* job = nullptr;
    {
      std::unique_lock lock(mutex_);
      start_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      chunk = chunks_[static_cast<std::size_t>(index)];
      job = job_;
    }
    std::exception_ptr err;
    if (chunk.first < chunk.second) {
      try {
        (*job)(index, chunk.first, chunk.second);
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard lock(mutex_);
      if (err && !error_) error_ = err;
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

void ThreadPool::parallel_for(std::int64_t n,
                              const std::function<void(std::int64_t, std::int64_t)>& fn,
                              std::int64_t grain) {
  parallel_for_threads(n, [&fn](int, std::int64_t begin, std::int64_t end) { fn(begin, end); }, grain);
}

void ThreadPool::parallel_for_threads(std::int64_t n,
                                      const std::function<void(int, std::int64_t, std::int64_t)>& fn,
                                      std::int64_t grain) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t blocks = (n + grain - 1) / grain;
  const int threads = static_cast<int>(std::min<std::int64_t>(size(), blocks));
  if (threads == 1) {
    fn(0, 0, n);
    return;
  }
  // Chunk i gets blocks [i*blocks/threads, (i+1)*blocks/threads).
  std::vector<std::pair<std::int64_t, std::int64_t>> chunks(static_cast<std::size_t>(size()));
  for (int i = 0; i < size(); ++i) {
    const std::int64_t b0 = i < threads ? i * blocks / threads : blocks;
    const std::int64_t b1 = i < threads ? (i + 1) * blocks / threads : blocks;
    chunks[static_cast<std::size_t>(i)] = {std::min(n, b0 * grain), std::min(n, b1 * grain)};
  }
  {
    std::lock_guard lock(mutex_);
    chunks_ = std::move(chunks);
    job_ = &fn;
    pending_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  start_cv_.notify_all();
  std::exception_ptr err;
  try {
    fn(0, chunks_[0].first, chunks_[0].second);
  } catch (...) {
    err = std::current_exception();
  }
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  if (!err) err = error_;
  job_ = nullptr;
  if (err) std::rethrow_exception(err);
}

}  // namespace woq
