#include "router/router_metrics.h"

#include "worker/server/metric_buckets.h"

namespace tinyserve {
namespace {

const char* const kOutcomeNames[kNumRouterOutcomes] = {
    "ok", "error", "cancelled", "deadline", "unavailable", "invalid", "rejected"};
const char* const kReasonNames[kNumRouteReasons] = {"prefix_hit", "least_load", "round_robin",
                                                    "power_of_two", "only_choice"};

}  // namespace

RouterOutcome OutcomeOf(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::OK: return RouterOutcome::kOk;
    case grpc::StatusCode::CANCELLED: return RouterOutcome::kCancelled;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return RouterOutcome::kDeadline;
    case grpc::StatusCode::UNAVAILABLE: return RouterOutcome::kUnavailable;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::UNAUTHENTICATED:
      return RouterOutcome::kInvalid;  // the client's fault
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return RouterOutcome::kRejected;
    default: return RouterOutcome::kError;
  }
}

RouterMetrics::RouterMetrics(const std::string& version, const std::string& policy)
    : registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  using prometheus::BuildCounter;
  using prometheus::BuildGauge;
  using prometheus::BuildHistogram;
  requests_ = &BuildCounter()
                   .Name("tinyserve_router_requests_total")
                   .Help("Requests proxied, by worker and outcome")
                   .Register(r);
  retries_ = &BuildCounter()
                  .Name("tinyserve_router_retries_total")
                  .Help("Requests retried on another worker before the first token")
                  .Register(r)
                  .Add({});
  migrations_ = &BuildCounter()
                     .Name("tinyserve_router_migrations_total")
                     .Help("Requests moved mid-stream (re-prefill elsewhere)")
                     .Register(r)
                     .Add({});
  auto& syncs = BuildCounter()
                    .Name("tinyserve_router_lora_syncs_total")
                    .Help(
                        "LoRA adapter loads and unloads the router made to bring a worker in "
                        "line with the others, by outcome")
                    .Register(r);
  for (int load = 0; load < 2; ++load) {
    for (int ok = 0; ok < 2; ++ok) {
      lora_syncs_[load][ok] =
          &syncs.Add({{"op", load ? "load" : "unload"}, {"result", ok ? "ok" : "error"}});
    }
  }
  auto& decisions = BuildCounter()
                        .Name("tinyserve_router_routing_decisions_total")
                        .Help("Why a worker was chosen")
                        .Register(r);
  for (int i = 0; i < kNumRouteReasons; ++i) {
    decisions_[i] = &decisions.Add({{"policy", policy}, {"reason", kReasonNames[i]}});
  }
  healthy_ = &BuildGauge()
                  .Name("tinyserve_router_worker_healthy")
                  .Help("1 healthy (serving), 0 not")
                  .Register(r);
  circuit_open_ = &BuildGauge()
                       .Name("tinyserve_router_circuit_open")
                       .Help("1 while the worker's circuit breaker is open")
                       .Register(r);
  model_mismatch_ = &BuildGauge()
                         .Name("tinyserve_router_worker_model_mismatch")
                         .Help(
                             "1 while the worker serves another model than the one the "
                             "router routes to (most live workers'): it gets no requests")
                         .Register(r);
  inflight_ = &BuildGauge()
                   .Name("tinyserve_router_worker_inflight")
                   .Help("Requests in flight to the worker (load counted at dispatch)")
                   .Register(r);
  workers_ = &BuildGauge().Name("tinyserve_router_workers").Help("Workers known").Register(r).Add({});
  waiting_ = &BuildGauge()
                  .Name("tinyserve_router_requests_waiting")
                  .Help("Requests queued in the router")
                  .Register(r)
                  .Add({});
  running_ = &BuildGauge()
                  .Name("tinyserve_router_requests_running")
                  .Help("Requests holding one of the router's --max-inflight slots")
                  .Register(r)
                  .Add({});
  ttft_ = &BuildHistogram()
               .Name("tinyserve_router_time_to_first_token_seconds")
               .Help("Arrival at the router to first token")
               .Register(r)
               .Add({}, LatencyBuckets());
  latency_ = &BuildHistogram()
                  .Name("tinyserve_router_request_latency_seconds")
                  .Help("Arrival to end of stream")
                  .Register(r)
                  .Add({}, LatencyBuckets());
  BuildGauge()
      .Name("tinyserve_build_info")
      .Help("Build information; always 1")
      .Register(r)
      .Add({{"version", version}, {"role", "router"}})
      .Set(1);
  // Requests that never reached a worker: only the outcome counters are used.
  auto none = std::make_unique<WorkerSeries>();
  none->healthy = none->circuit_open = none->model_mismatch = none->inflight = nullptr;
  for (int i = 0; i < kNumRouterOutcomes; ++i) {
    none->outcomes[i] = &requests_->Add({{"worker", "none"}, {"outcome", kOutcomeNames[i]}});
  }
  none_ = none.get();
  series_.emplace("none", std::move(none));
}

WorkerSeries* RouterMetrics::AddWorker(const std::string& address) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(address);
  if (it != series_.end()) return it->second.get();
  auto s = std::make_unique<WorkerSeries>();
  const prometheus::Labels labels = {{"worker", address}};
  s->healthy = &healthy_->Add(labels);
  s->circuit_open = &circuit_open_->Add(labels);
  s->model_mismatch = &model_mismatch_->Add(labels);
  s->inflight = &inflight_->Add(labels);
  for (int i = 0; i < kNumRouterOutcomes; ++i) {
    s->outcomes[i] = &requests_->Add({{"worker", address}, {"outcome", kOutcomeNames[i]}});
  }
  WorkerSeries* out = s.get();
  series_.emplace(address, std::move(s));
  return out;
}

void RouterMetrics::RemoveWorker(const std::string& address) {
  // Series stay registered (a worker that comes back reuses them; addresses are bounded by the
  // deployment), but a removed worker reads as unhealthy with nothing in flight.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(address);
  if (it == series_.end() || address == "none") return;
  it->second->healthy->Set(0);
  it->second->circuit_open->Set(0);
  it->second->model_mismatch->Set(0);
  it->second->inflight->Set(0);
}

}  // namespace tinyserve
