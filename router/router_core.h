// File: router/router_core.h
// What the router's RPC handlers share: options, metrics, the worker registry, the routing
// policy and the admission bound. Owned by RouterServer; outlives every call.
#pragma once

#include <atomic>
#include <string>
#include <vector>

#include "router/admission.h"
#include "router/router_metrics.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"

namespace tinyserve {

class Tracer;

struct RouterCore {
  RouterMetrics* metrics = nullptr;
  WorkerRegistry* registry = nullptr;
  RoutingPolicy* policy = nullptr;
  Admission* admission = nullptr;
  int max_attempts = 3;  // 1 + retries on other workers before the first token
  std::string version;
  std::string api_key;  // non-empty: every call needs "authorization: Bearer <key>"
  Tracer* tracer = nullptr;  // OpenTelemetry spans (worker/server/tracing.h); null: off
  double start_time = 0;
  std::atomic<bool> draining{false};
  std::atomic<uint64_t> next_id{1};

  // Routable workers (healthy, breaker allowing) not in `exclude`. A request naming a LoRA
  // adapter goes to the routable workers that serve it, if any does (else to any: the
  // worker's answer names the unknown adapter).
  std::vector<WorkerPtr> Candidates(const std::vector<WorkerPtr>& exclude,
                                    const std::string& adapter = "") const;
  // A healthy worker for unary forwards (the least loaded), or null.
  WorkerPtr AnyHealthy() const;
  std::string NewRequestId();
};

}  // namespace tinyserve
