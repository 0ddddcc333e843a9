#include "worker/kv/page_pool.h"

#include <vector>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

TEST(PagePool, AllocateUntilEmptyThenFree) {
  constexpr int kPages = 4;
  PagePool pool(kPages, 16);
  std::vector<int32_t> got;
  for (int i = 0; i < kPages; ++i) got.push_back(pool.Allocate());
  EXPECT_EQ(pool.available(), 0);
  EXPECT_EQ(pool.Allocate(), -1);  // pool exhausted
  for (int32_t p : got) pool.Unref(p);
  EXPECT_EQ(pool.available(), kPages);
  EXPECT_EQ(pool.num_used(), 0);
}

TEST(PagePool, SharedPageFreedAfterLastRef) {
  PagePool pool(2, 4);
  int32_t p = pool.Allocate();
  pool.Ref(p);
  pool.Unref(p);
  EXPECT_EQ(pool.available(), 1);
  pool.Unref(p);
  EXPECT_EQ(pool.available(), 2);
}

TEST(PagePool, PrefixCacheHitMissAndReclaim) {
  PagePool pool(2, 4);
  const int32_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
  const uint64_t ha = PagePool::BlockHash(0, a, 4);
  EXPECT_NE(ha, PagePool::BlockHash(0, b, 4));
  EXPECT_NE(ha, PagePool::BlockHash(ha, a, 4));  // chained: position matters
  int32_t p = pool.Allocate();
  pool.Register(p, ha, a);
  pool.Unref(p);  // becomes cached, still available
  EXPECT_EQ(pool.num_cached(), 1);
  EXPECT_EQ(pool.available(), 2);
  EXPECT_EQ(pool.Lookup(ha, b), -1);  // same hash slot, different tokens: miss
  EXPECT_EQ(pool.Lookup(ha, a), p);   // hit takes a reference
  EXPECT_EQ(pool.refcount(p), 1);
  pool.Unref(p);
  // Exhaust the pool: the cached page is reclaimed and forgotten.
  int32_t x = pool.Allocate(), y = pool.Allocate();
  EXPECT_NE(x, -1);
  EXPECT_NE(y, -1);
  EXPECT_EQ(pool.num_cached(), 0);
  pool.Unref(x);
  pool.Unref(y);
  EXPECT_EQ(pool.Lookup(ha, a), -1);
}

}  // namespace
}  // namespace tinyserve
