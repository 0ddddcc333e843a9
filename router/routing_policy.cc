#include "router/routing_policy.h"

#include "absl/strings/str_cat.h"

namespace tinyserve {

absl::StatusOr<RoutingPolicyKind> ParseRoutingPolicy(const std::string& name) {
  if (name == "round_robin") return RoutingPolicyKind::kRoundRobin;
  if (name == "least_load") return RoutingPolicyKind::kLeastLoad;
  if (name == "power_of_two") return RoutingPolicyKind::kPowerOfTwo;
  if (name == "cache_aware") return RoutingPolicyKind::kCacheAware;
  return absl::InvalidArgumentError(absl::StrCat(
      "policy: unknown routing policy '", name,
      "' (round_robin, least_load, power_of_two, cache_aware)"));
}

const char* RoutingPolicyName(RoutingPolicyKind kind) {
  switch (kind) {
    case RoutingPolicyKind::kRoundRobin: return "round_robin";
    case RoutingPolicyKind::kLeastLoad: return "least_load";
    case RoutingPolicyKind::kPowerOfTwo: return "power_of_two";
    case RoutingPolicyKind::kCacheAware: return "cache_aware";
  }
  return "unknown";
}

namespace {

// True if a is less loaded than b: in flight, then requests sent so far.
bool Lighter(const WorkerPtr& a, const WorkerPtr& b) {
  if (a->inflight() != b->inflight()) return a->inflight() < b->inflight();
  return a->dispatched() < b->dispatched();
}

}  // namespace

RouteChoice RoutingPolicy::PowerOfTwo(const std::vector<WorkerPtr>& c) {
  size_t i, j;
  {
    std::lock_guard<std::mutex> lock(rng_mu_);
    i = rng_() % c.size();
    j = rng_() % (c.size() - 1);
  }
  if (j >= i) ++j;
  return {Lighter(c[j], c[i]) ? c[j] : c[i], RouteReason::kPowerOfTwo};
}

RouteChoice RoutingPolicy::Pick(const std::vector<WorkerPtr>& c,
                                const std::vector<uint64_t>& blocks) {
  if (c.empty()) return {};
  if (c.size() == 1) return {c[0], RouteReason::kOnlyChoice};
  switch (options_.kind) {
    case RoutingPolicyKind::kRoundRobin:
      return {c[next_.fetch_add(1) % c.size()], RouteReason::kRoundRobin};
    case RoutingPolicyKind::kLeastLoad: {
      WorkerPtr best = c[0];
      for (const WorkerPtr& w : c) {
        if (Lighter(w, best)) best = w;
      }
      return {best, RouteReason::kLeastLoad};
    }
    case RoutingPolicyKind::kPowerOfTwo:
      return PowerOfTwo(c);
    case RoutingPolicyKind::kCacheAware: {
      if (blocks.empty()) return PowerOfTwo(c);
      int max_inflight = 0;
      for (const WorkerPtr& w : c) max_inflight = std::max(max_inflight, w->inflight());
      WorkerPtr best;
      double best_score = -1e9, best_match = 0;
      for (const WorkerPtr& w : c) {
        const double match = static_cast<double>(w->prefixes().MatchLength(blocks)) /
                             static_cast<double>(blocks.size());
        const double load =
            max_inflight > 0 ? static_cast<double>(w->inflight()) / max_inflight : 0.0;
        const double score = match - options_.cache_beta * load;
        if (best == nullptr || score > best_score ||
            (score == best_score && Lighter(w, best))) {
          best = w;
          best_score = score;
          best_match = match;
        }
      }
      if (best_match < options_.cache_min_match) return PowerOfTwo(c);
      return {best, RouteReason::kPrefixHit};
    }
  }
  return {};
}

}  // namespace tinyserve
