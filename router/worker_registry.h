// File: router/worker_registry.h
// The router's view of its workers: who they are (a static list, or the addresses a DNS name
// resolves to, re-resolved periodically: a Kubernetes headless Service), whether they are
// healthy (grpc.health.v1 Check "readiness" plus WorkerControl.GetLoad, polled), how loaded
// they are (requests in flight from this router, counted at dispatch), their circuit
// breakers and their approximate prefix indexes.
//
// A worker is up when its last Check said SERVING, its last GetLoad succeeded and it is not
// draining; healthy when up and serving the cluster's model; routable when healthy and its
// breaker allows a request. The cluster's model is the identity (LoadReport.model: served name
// and a digest of shape and vocabulary) most up workers report, chosen after each poll round
// (a tie goes to the smallest, so routers that see the same workers agree; with none up it
// stays). So a worker started with another model by mistake gets no requests (logged once,
// gauge tinyserve_router_worker_model_mismatch while up), and a rolling update to a new model
// switches over once half the workers run it. A worker that reports no identity (an older
// build) matches any. Until the first choice a worker with an identity is not healthy.
// When a worker turns unhealthy its prefix index is cleared (its cache may be gone); when it
// turns healthy the index is seeded from its GetPrefixSummary.
//
// Threading: Snapshot() and the WorkerHandle atomics may be used from any thread. One poller
// thread does discovery and health; polls are asynchronous (callback API) with deadlines, so a
// hung worker cannot stall the others.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "router/circuit_breaker.h"
#include "router/router_metrics.h"
#include "tinyserve/v1/tinyserve.grpc.pb.h"
#include "tinyserve/v1/worker.grpc.pb.h"
#include "worker/server/prefix_lru.h"

namespace tinyserve {

struct RegistryOptions {
  std::vector<std::string> static_workers;  // host:port
  std::string dns;                          // name:port; re-resolved every dns_interval
  double dns_interval_seconds = 5;
  double health_interval_seconds = 0.5;     // Check + GetLoad period
  double health_timeout_seconds = 1;
  int breaker_failures = 3;
  double breaker_cooldown_seconds = 5;
  size_t prefix_index_capacity = 1 << 16;   // block hashes per worker
  // How workers are dialled: TLS credentials (rpc_security.h; null: plaintext), the name their
  // certificates carry when it is not the dialled host, and the API key sent on every call.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  std::string tls_server_name;
  std::string api_key;
};

class WorkerHandle : public std::enable_shared_from_this<WorkerHandle> {
 public:
  WorkerHandle(std::string address, const RegistryOptions& options, WorkerSeries* series);

  const std::string& address() const { return address_; }
  tinyserve::v1::TinyServe::Stub& api() { return *api_; }
  tinyserve::v1::WorkerControl::Stub& control() { return *control_; }
  grpc::GenericStub& generic() { return *generic_; }
  CircuitBreaker& breaker() { return breaker_; }
  PrefixLru& prefixes() { return prefixes_; }
  WorkerSeries* series() { return series_; }
  // Readies a call to this worker: the API key (a deadline is the caller's).
  void Prepare(grpc::ClientContext* context) const;

  bool healthy() const { return healthy_.load(); }
  // Up (see above) whatever its model, and the model identity of its last load report.
  bool up() const;
  std::string model() const;
  bool model_mismatch() const;
  int inflight() const { return inflight_.load(); }
  int64_t dispatched() const { return dispatched_.load(); }
  // Last load report (running, waiting, KV pages, adapters).
  tinyserve::v1::LoadReport load() const;
  // Whether its last load report lists this LoRA adapter.
  bool ServesAdapter(const std::string& name) const;

  // Counts a request in flight (at dispatch) and out (when its stream ends).
  void AddInflight();
  void RemoveInflight();

  // Poller side: a poll's result.
  void SetHealth(bool serving, bool load_ok, const tinyserve::v1::LoadReport& load);
  // The cluster's model as chosen after a poll round ("" before the first choice).
  void SetClusterModel(const std::string& cluster_model);
  void UpdateBreakerGauge();
  // Logs a failed load poll when its code differs from the previous poll's.
  void NotePollStatus(const grpc::Status& status);
  std::atomic<bool> poll_in_flight{false};
  std::atomic<bool> removed{false};

 private:
  const std::string address_;
  const std::string api_key_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tinyserve::v1::TinyServe::Stub> api_;
  std::unique_ptr<tinyserve::v1::WorkerControl::Stub> control_;
  std::unique_ptr<grpc::GenericStub> generic_;
  CircuitBreaker breaker_;
  PrefixLru prefixes_;
  WorkerSeries* series_;
  // Sets healthy_ (up, and its model the cluster's or none) from the state below, with the
  // transitions' logs, gauges and prefix-index work. REQUIRES(mu_)
  void Update();
  // Up and reporting another model than the cluster's (once chosen). REQUIRES(mu_)
  bool Mismatch() const;
  std::atomic<bool> healthy_{false};
  std::atomic<int> last_poll_code_{0};
  std::atomic<int> inflight_{0};
  std::atomic<int64_t> dispatched_{0};
  mutable std::mutex mu_;
  tinyserve::v1::LoadReport load_;  // GUARDED_BY(mu_)
  std::string cluster_model_;       // GUARDED_BY(mu_)
  bool up_ = false;                 // GUARDED_BY(mu_)
  bool logged_mismatch_ = false;    // GUARDED_BY(mu_)
};

using WorkerPtr = std::shared_ptr<WorkerHandle>;

class WorkerRegistry {
 public:
  WorkerRegistry(const RegistryOptions& options, RouterMetrics* metrics);
  ~WorkerRegistry();

  void Start();
  void Stop();

  // The current workers (healthy or not).
  std::vector<WorkerPtr> Snapshot() const;
  // Number of workers that are healthy now.
  int HealthyCount() const;
  // Called (on the poller thread) whenever the healthy count may have changed.
  void SetOnHealthChange(std::function<void(int healthy)> fn) { on_health_change_ = fn; }
  // Called (on the poller thread) after each poll round is started, with every worker; their
  // load() is the last report (LoraSync::Reconcile). Set before Start().
  void SetOnPollRound(std::function<void(const std::vector<WorkerPtr>&)> fn) {
    on_poll_round_ = fn;
  }

 private:
  void Loop();
  void Discover();
  void Poll(const WorkerPtr& worker);
  // Picks the cluster's model from the up workers' reports and tells every worker.
  void ChooseModel(const std::vector<WorkerPtr>& workers);
  std::vector<std::string> Resolve() const;

  RegistryOptions options_;
  RouterMetrics* metrics_;
  std::function<void(int)> on_health_change_;
  std::function<void(const std::vector<WorkerPtr>&)> on_poll_round_;

  mutable std::mutex mu_;
  std::vector<WorkerPtr> workers_;  // GUARDED_BY(mu_)
  bool stop_ = false;               // GUARDED_BY(mu_)
  std::string cluster_model_;       // GUARDED_BY(mu_)
  std::condition_variable cv_;
  std::thread thread_;
  double next_dns_ = 0;
  int last_healthy_ = -1;
};

}  // namespace tinyserve
