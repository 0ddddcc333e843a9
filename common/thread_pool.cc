#include "common/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TS_CPU_RELAX() _mm_pause()
#else
#define TS_CPU_RELAX() ((void)0)
#endif

namespace tinyserve {

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(1, num_threads)) {
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_seq_cst);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int index) {
  uint32_t seen = 0;
  while (true) {
    // Spin first: the next loop usually follows within microseconds. The clock is read only
    // every 256 pauses.
    uint32_t gen = generation_.load(std::memory_order_acquire);
    if (gen == seen) {
      const auto deadline =
          std::chrono::steady_clock::now() + std::chrono::microseconds(kSpinMicros);
      for (int spins = 1; (gen = generation_.load(std::memory_order_acquire)) == seen; ++spins) {
        TS_CPU_RELAX();
        if ((spins & 255) == 0 && std::chrono::steady_clock::now() > deadline) break;
      }
    }
    while (gen == seen) {
      // Sleep. The seq_cst increment of sleepers_ before the re-check pairs with the caller's
      // seq_cst generation bump before it reads sleepers_: one of the two sees the other.
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      generation_.wait(seen, std::memory_order_seq_cst);
      sleepers_.fetch_sub(1, std::memory_order_relaxed);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    // Join only the loop of this generation, and only while it is open; otherwise the caller
    // has finished without us and job_ may already be gone.
    uint64_t w = join_.load(std::memory_order_acquire);
    bool joined = false;
    while ((w >> 32) == gen && (w & kOpen) != 0) {
      if (join_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) {
        joined = true;
        break;
      }
    }
    if (!joined) continue;
    (*job_)(index);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::Dispatch(const std::function<void(int)>& job, bool require_all) {
  job_ = &job;
  done_.store(0, std::memory_order_relaxed);
  const uint32_t gen = generation_.load(std::memory_order_relaxed) + 1;
  join_.store((uint64_t{gen} << 32) | kOpen, std::memory_order_relaxed);
  generation_.store(gen, std::memory_order_seq_cst);  // publishes job_, done_, join_
  if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  job(0);
  if (require_all) {
    while ((join_.load(std::memory_order_acquire) & (kOpen - 1)) <
           static_cast<uint64_t>(num_threads_ - 1)) {
      TS_CPU_RELAX();
    }
  }
  // Close the loop: late workers will not join; wait for those that did.
  const int joined =
      static_cast<int>(join_.fetch_and(~kOpen, std::memory_order_acq_rel) & (kOpen - 1));
  for (int spins = 1; done_.load(std::memory_order_acquire) != joined; ++spins) {
    TS_CPU_RELAX();
    if ((spins & 1023) == 0) std::this_thread::yield();
  }
}

void ThreadPool::RunOnAll(const std::function<void(int)>& fn) {
  if (num_threads_ == 1) {
    fn(0);
    return;
  }
  Dispatch(fn, /*require_all=*/true);
}

void ThreadPool::ParallelFor(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn,
                             int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t units = (n + grain - 1) / grain;
  if (num_threads_ == 1 || units <= 1) {
    fn(0, n, 0);
    return;
  }
  // A few chunks per thread: enough to balance uneven progress, few enough that claiming one
  // (an atomic add) and calling fn stay cheap.
  const int64_t chunks = std::min<int64_t>(units, 4 * num_threads_);
  next_chunk_.store(0, std::memory_order_relaxed);
  Dispatch(
      [&](int t) {
        for (int64_t c; (c = next_chunk_.fetch_add(1, std::memory_order_relaxed)) < chunks;) {
          const int64_t b = units * c / chunks * grain;
          const int64_t e = std::min(n, units * (c + 1) / chunks * grain);
          if (b < e) fn(b, e, t);
        }
      },
      /*require_all=*/false);
}

}  // namespace tinyserve
