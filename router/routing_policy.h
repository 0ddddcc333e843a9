// File: router/routing_policy.h
// Chooses a worker for a request among the routable ones (healthy, breaker allowing).
//
//   round_robin   in turn.
//   least_load    fewest requests in flight from this router (counted at dispatch, so a burst
//                 does not pile onto one worker before any of it reports back); ties go to
//                 the worker that has been sent fewer requests, then the first.
//   power_of_two  two distinct workers at random, the less loaded one.
//   cache_aware   (default) for each worker w: match(w) = matched leading prompt blocks in w's
//                 approximate prefix index / prompt blocks, load(w) = inflight(w) / max
//                 inflight over the candidates; score = match - beta * load; the best score
//                 wins if its match >= min_match, otherwise power_of_two decides. Load is a
//                 per-candidate term (no fleet-wide switch), so a hot worker loses only the
//                 requests whose prefix advantage does not cover its extra load.
//
// Threading: Pick is thread-safe.
#pragma once

#include <atomic>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "router/router_metrics.h"
#include "router/worker_registry.h"

namespace tinyserve {

enum class RoutingPolicyKind { kRoundRobin, kLeastLoad, kPowerOfTwo, kCacheAware };

absl::StatusOr<RoutingPolicyKind> ParseRoutingPolicy(const std::string& name);
const char* RoutingPolicyName(RoutingPolicyKind kind);

struct RoutingOptions {
  RoutingPolicyKind kind = RoutingPolicyKind::kCacheAware;
  double cache_beta = 0.5;       // weight of relative load against match ratio
  double cache_min_match = 0.2;  // below this best match: power_of_two
};

struct RouteChoice {
  WorkerPtr worker;  // null when no candidate
  RouteReason reason = RouteReason::kOnlyChoice;
};

class RoutingPolicy {
 public:
  explicit RoutingPolicy(const RoutingOptions& options) : options_(options) {}

  // candidates: routable workers (non-empty for a non-null choice). prompt_blocks: the
  // request's chained block hashes (worker/server/block_hash.h).
  RouteChoice Pick(const std::vector<WorkerPtr>& candidates,
                   const std::vector<uint64_t>& prompt_blocks);

 private:
  RouteChoice PowerOfTwo(const std::vector<WorkerPtr>& candidates);

  RoutingOptions options_;
  std::atomic<uint64_t> next_{0};
  std::mutex rng_mu_;
  std::mt19937_64 rng_{0x7157u};  // GUARDED_BY(rng_mu_)
};

}  // namespace tinyserve
