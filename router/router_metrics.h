// File: router/router_metrics.h
// The router's Prometheus metrics (names and meanings: docs/METRICS.md, "Router"). Families
// are registered once; per-worker series are created when a worker joins (and removed when
// it leaves) and kept by reference in a WorkerSeries, so the hot path only increments.
//
// Threading: thread-safe (prometheus-cpp series are; AddWorker/RemoveWorker hold a mutex).
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "grpcpp/support/status.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace tinyserve {

// Request outcomes of tinyserve_router_requests_total.
enum class RouterOutcome { kOk, kError, kCancelled, kDeadline, kUnavailable, kInvalid, kRejected };
inline constexpr int kNumRouterOutcomes = 7;
RouterOutcome OutcomeOf(const grpc::Status& status);

// Reasons of tinyserve_router_routing_decisions_total.
enum class RouteReason { kPrefixHit, kLeastLoad, kRoundRobin, kPowerOfTwo, kOnlyChoice };
inline constexpr int kNumRouteReasons = 5;

struct WorkerSeries {
  prometheus::Gauge* healthy;
  prometheus::Gauge* circuit_open;
  prometheus::Gauge* model_mismatch;
  prometheus::Gauge* inflight;
  prometheus::Counter* outcomes[kNumRouterOutcomes];
};

class RouterMetrics {
 public:
  RouterMetrics(const std::string& version, const std::string& policy);

  std::shared_ptr<prometheus::Registry> registry() { return registry_; }

  WorkerSeries* AddWorker(const std::string& address);
  void RemoveWorker(const std::string& address);
  // For requests that never reached a worker (worker label "none").
  WorkerSeries* none() { return none_; }

  void CountDecision(RouteReason reason) { decisions_[static_cast<int>(reason)]->Increment(); }
  prometheus::Counter& retries() { return *retries_; }
  prometheus::Counter& migrations() { return *migrations_; }
  // LoRA adapter loads/unloads the router made to bring a worker in line (lora_sync.h).
  prometheus::Counter& lora_syncs(bool load, bool ok) { return *lora_syncs_[load][ok]; }
  prometheus::Gauge& workers() { return *workers_; }
  prometheus::Gauge& waiting() { return *waiting_; }
  prometheus::Gauge& running() { return *running_; }
  prometheus::Histogram& ttft() { return *ttft_; }
  prometheus::Histogram& latency() { return *latency_; }

 private:
  WorkerSeries* Create(const std::string& label);

  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Gauge>* healthy_;
  prometheus::Family<prometheus::Gauge>* circuit_open_;
  prometheus::Family<prometheus::Gauge>* model_mismatch_;
  prometheus::Family<prometheus::Gauge>* inflight_;
  prometheus::Counter* decisions_[kNumRouteReasons];
  prometheus::Counter* retries_;
  prometheus::Counter* migrations_;
  prometheus::Counter* lora_syncs_[2][2];  // [load][ok]
  prometheus::Gauge* workers_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* running_;
  prometheus::Histogram* ttft_;
  prometheus::Histogram* latency_;
  WorkerSeries* none_;

  std::mutex mu_;
  std::map<std::string, std::unique_ptr<WorkerSeries>> series_;  // GUARDED_BY(mu_)
};

}  // namespace tinyserve
