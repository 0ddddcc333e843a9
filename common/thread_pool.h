// File: common/thread_pool.h
// A fixed pool of worker threads for data-parallel loops on the engine thread.
//
// ParallelFor(n, fn) cuts [0, n) into a few chunks per thread that the caller and the workers
// claim from an atomic counter, and returns when all are done. Decode issues hundreds of small
// loops per token, so dispatch is spin-based: the caller bumps a generation counter that idle
// workers spin on (with pause). A worker takes part in a loop only if it arrives while the loop
// is still open; once every chunk is claimed the caller closes it and waits only for workers that
// joined. So a worker that the OS has descheduled (more runnable threads than cores) costs the
// caller nothing: it does the chunks itself, instead of spinning on a thread that is not
// running. A worker that has spun for kSpinMicros without work sleeps on the counter (futex via
// std::atomic::wait) and is woken by the next dispatch, so an idle engine does not burn cores.
//
// Thread safety: one caller at a time (the engine thread owns the pool). A pool of size 1 runs
// everything inline on the caller. fn must not call back into the same pool.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

namespace tinyserve {

class ThreadPool {
 public:
  // How long an idle worker spins before it sleeps.
  static constexpr int64_t kSpinMicros = 2000;

  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end, thread_index) on disjoint ranges covering [0, n). Ranges are aligned to
  // `grain` elements (except the last). Blocks until every range is done.
  void ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                   int64_t grain = 1);

  // Calls fn(thread_index) once on every thread (waits for every worker to arrive).
  void RunOnAll(const std::function<void(int)>& fn);

 private:
  // Runs job(thread_index) on the caller and on the workers that join; with require_all, waits
  // until every worker has joined.
  void Dispatch(const std::function<void(int)>& job, bool require_all);
  void WorkerLoop(int index);

  // join_ word: generation (high 32 bits) | kOpen | number of workers that joined.
  static constexpr uint64_t kOpen = uint64_t{1} << 31;

  const int num_threads_;
  std::vector<std::thread> workers_;
  // Written by the caller before the generation bump (release), read after it (acquire).
  const std::function<void(int)>* job_ = nullptr;
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<uint64_t> join_{0};
  alignas(64) std::atomic<int> done_{0};
  alignas(64) std::atomic<int64_t> next_chunk_{0};
  alignas(64) std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace tinyserve
