#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "router/admission.h"
#include "router/circuit_breaker.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace tinyserve {
namespace {

TEST(CircuitBreaker, OpensAfterFailuresAndProbesAfterCooldown) {
  CircuitBreaker b(/*failure_threshold=*/2, /*cooldown_seconds=*/10);
  EXPECT_TRUE(b.Available(0));
  b.RecordFailure(0);
  EXPECT_TRUE(b.Available(0));
  b.RecordFailure(1);
  EXPECT_TRUE(b.open());
  EXPECT_FALSE(b.Available(5));
  EXPECT_TRUE(b.Available(11));  // half-open
  b.OnDispatch(11);              // the probe
  EXPECT_FALSE(b.Available(11));
  b.RecordFailure(12);  // probe failed: open again
  EXPECT_FALSE(b.Available(20));
  EXPECT_TRUE(b.Available(23));
  b.OnDispatch(23);
  b.RecordSuccess();
  EXPECT_FALSE(b.open());
  EXPECT_TRUE(b.Available(23));
}

TEST(Admission, BoundsInflightAndQueue) {
  RouterMetrics metrics("test", "round_robin");
  Admission a(/*max_inflight=*/1, /*max_queue=*/1, &metrics.waiting(), &metrics.running());
  int admitted = 0;
  int t1, t2, t3;
  EXPECT_EQ(a.Acquire(&t1, [&] { ++admitted; }), Admission::Result::kAdmitted);
  EXPECT_EQ(a.Acquire(&t2, [&] { ++admitted; }), Admission::Result::kQueued);
  EXPECT_EQ(a.Acquire(&t3, [&] { ++admitted; }), Admission::Result::kRejected);
  EXPECT_EQ(a.waiting(), 1);
  EXPECT_EQ(metrics.running().Value(), 1);
  EXPECT_EQ(metrics.waiting().Value(), 1);
  a.Release();  // t2 gets the slot
  EXPECT_EQ(admitted, 1);
  EXPECT_EQ(a.inflight(), 1);
  EXPECT_EQ(metrics.running().Value(), 1);
  EXPECT_EQ(metrics.waiting().Value(), 0);
  EXPECT_EQ(a.Acquire(&t3, [&] { ++admitted; }), Admission::Result::kQueued);
  EXPECT_TRUE(a.Cancel(&t3));
  EXPECT_FALSE(a.Cancel(&t3));
  a.Release();
  EXPECT_EQ(a.inflight(), 0);
  EXPECT_EQ(metrics.running().Value(), 0);
}

TEST(Admission, QueueIsByPriorityThenFifo) {
  RouterMetrics metrics("test", "round_robin");
  Admission a(/*max_inflight=*/1, /*max_queue=*/8, &metrics.waiting(), &metrics.running());
  std::vector<char> order;
  char holder = 'h', w1 = '1', w2 = '2', w3 = '3', w4 = '4';
  EXPECT_EQ(a.Acquire(&holder, [] {}), Admission::Result::kAdmitted);
  for (auto [token, priority] : {std::pair{&w1, 0}, {&w2, 5}, {&w3, -1}, {&w4, 0}}) {
    char name = *token;
    EXPECT_EQ(a.Acquire(
                  token, [&order, name] { order.push_back(name); }, priority),
              Admission::Result::kQueued);
  }
  for (int i = 0; i < 4; ++i) a.Release();
  EXPECT_EQ(order, (std::vector<char>{'3', '1', '4', '2'}));
}

TEST(AdmissionTicket, HoldsQueuesCancelsAndReleasesOnce) {
  RouterMetrics metrics("test", "round_robin");
  Admission a(/*max_inflight=*/1, /*max_queue=*/2, &metrics.waiting(), &metrics.running());
  AdmissionTicket first(&a), second(&a), third(&a);
  int admitted = 0;
  EXPECT_EQ(first.Acquire([&] { ++admitted; }, 0), Admission::Result::kAdmitted);
  EXPECT_FALSE(first.Cancel());  // holds a slot: not queued
  EXPECT_EQ(second.Acquire([&] { ++admitted; }, 0), Admission::Result::kQueued);
  EXPECT_EQ(third.Acquire([&] { ++admitted; }, 0), Admission::Result::kQueued);
  EXPECT_TRUE(third.Cancel());
  EXPECT_FALSE(third.Cancel());
  third.Release();  // held nothing: frees nothing
  EXPECT_EQ(a.inflight(), 1);
  first.Release();  // the slot passes to `second`
  first.Release();  // once only
  EXPECT_EQ(admitted, 1);
  EXPECT_EQ(a.inflight(), 1);
  EXPECT_FALSE(second.Cancel());  // admitted already
  second.Release();
  EXPECT_EQ(a.inflight(), 0);
  EXPECT_EQ(a.waiting(), 0);
}

class RoutingPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* addr : {"127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"}) {
      workers_.push_back(
          std::make_shared<WorkerHandle>(addr, options_, metrics_.AddWorker(addr)));
    }
  }
  RegistryOptions options_;
  RouterMetrics metrics_{"test", "cache_aware"};
  std::vector<WorkerPtr> workers_;
};

TEST_F(RoutingPolicyTest, RoundRobinCycles) {
  RoutingPolicy p({RoutingPolicyKind::kRoundRobin});
  EXPECT_EQ(p.Pick(workers_, {}).worker, workers_[0]);
  EXPECT_EQ(p.Pick(workers_, {}).worker, workers_[1]);
  EXPECT_EQ(p.Pick(workers_, {}).worker, workers_[2]);
  EXPECT_EQ(p.Pick({workers_[1]}, {}).reason, RouteReason::kOnlyChoice);
  EXPECT_EQ(p.Pick({}, {}).worker, nullptr);
}

TEST_F(RoutingPolicyTest, LeastLoadCountsInflight) {
  RoutingPolicy p({RoutingPolicyKind::kLeastLoad});
  workers_[0]->AddInflight();
  workers_[1]->AddInflight();
  EXPECT_EQ(p.Pick(workers_, {}).worker, workers_[2]);
  workers_[2]->AddInflight();
  workers_[2]->AddInflight();
  workers_[0]->RemoveInflight();
  EXPECT_EQ(p.Pick(workers_, {}).worker, workers_[0]);
}

TEST_F(RoutingPolicyTest, CacheAwarePrefersPrefixUnlessOverloaded) {
  RoutingPolicy p({RoutingPolicyKind::kCacheAware, /*cache_beta=*/0.5, /*cache_min_match=*/0.2});
  const std::vector<uint64_t> blocks = {11, 12, 13, 14};
  workers_[1]->prefixes().Insert({11, 12, 13});
  RouteChoice c = p.Pick(workers_, blocks);
  EXPECT_EQ(c.worker, workers_[1]);
  EXPECT_EQ(c.reason, RouteReason::kPrefixHit);
  // A small prefix on a busy worker loses to an idle one.
  workers_[2]->prefixes().Insert({11});
  workers_[1]->prefixes().Clear();
  workers_[1]->prefixes().Insert({11});
  workers_[1]->AddInflight();
  workers_[1]->AddInflight();
  c = p.Pick(workers_, blocks);
  EXPECT_EQ(c.worker, workers_[2]);
  // No match: power of two choices.
  EXPECT_EQ(p.Pick(workers_, {99, 98}).reason, RouteReason::kPowerOfTwo);
}

}  // namespace
}  // namespace tinyserve
