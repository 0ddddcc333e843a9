#include "common/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

TEST(ThreadPool, CoversRangeOnceWithGrain) {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {1, 7, 64, 1000}) {
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(
          n,
          [&](int64_t b, int64_t e, int) {
            EXPECT_EQ(b % 4, 0);
            for (int64_t i = b; i < e; ++i) hits[i]++;
          },
          4);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1);
    }
  }
}

TEST(ThreadPool, ManySmallLoops) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int r = 0; r < 2000; ++r)
    pool.ParallelFor(10, [&](int64_t b, int64_t e, int) { sum += e - b; });
  EXPECT_EQ(sum.load(), 20000);
}

}  // namespace
}  // namespace tinyserve
