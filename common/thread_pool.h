// File: common/thread_pool.h
// A fixed pool of worker threads for data-parallel loops on the engine thread.
//
// ParallelFor(n, fn) splits [0, n) into one contiguous range per thread (the caller's thread
// takes the first) and returns when all are done. Workers spin briefly before sleeping, because
// decode issues hundreds of small loops per token and a sleep/wake costs more than the work.
//
// Thread safety: one caller at a time (the engine thread owns the pool). A pool of size 1 runs
// everything inline on the caller.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace tinyserve {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint ranges covering [0, n). Ranges are aligned to
  // `grain` elements (except the last). Blocks until every range is done.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                   int64_t grain = 1);

  // Calls fn(thread_index) once on every thread.
  void RunOnAll(const std::function<void(int)>& fn);

 private:
  void WorkerLoop(int index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int)>* job_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tinyserve
