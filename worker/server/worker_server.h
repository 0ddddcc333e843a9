// File: worker/server/worker_server.h
// A worker process's servers around one Engine: the gRPC server (TinyServe + WorkerControl,
// grpc.health.v1, reflection), the Prometheus /metrics exposer, and the readiness watchdog.
//
// Health (grpc.health.v1 Check):
//   "liveness"            SERVING while the process runs (the gRPC server answers at all);
//   "" and "readiness"    SERVING only when ready: the model is loaded, the start-up deep probe
//                         passed, the server is not draining, and the stall watchdog is happy
//                         (no running requests without a scheduler step for stall_seconds).
// Drain (Drain(), or SIGTERM/SIGINT in ServeUntilSignal): stop admitting (new Generate calls
// get UNAVAILABLE, readiness goes NOT_SERVING), let running and queued requests finish for up
// to drain_timeout_seconds, then abort what is left, stop the server and the engine.
//
// Threading: Start and ServeUntilSignal are called by the owning thread; the watchdog runs on
// its own thread; the RPC handlers on gRPC's threads (worker_service.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "worker/engine/engine.h"
#include "worker/server/http_frontend.h"
#include "worker/server/rpc_security.h"
#include "worker/server/tracing.h"
#include "worker/server/worker_metrics.h"
#include "worker/server/worker_service.h"

namespace tinyserve {

struct WorkerServerOptions {
  EngineOptions engine;
  std::string host = "0.0.0.0";
  int port = 50051;                       // gRPC
  int metrics_port = 9100;                // HTTP /metrics; 0 = off
  double stall_seconds = 30;              // watchdog: no step progress with work -> not ready
  double drain_timeout_seconds = 30;      // grace for running requests after SIGTERM
  int max_message_bytes = 4 << 20;        // larger requests: RESOURCE_EXHAUSTED (by gRPC)
  int http_port = 0;                      // OpenAI-compatible HTTP API; 0 = off
  int http_threads = 64;                  // HTTP connections served at once
  std::string api_key;                    // non-empty: gRPC and HTTP calls need this bearer token
  ServerTls tls;                          // gRPC over TLS (mutual with tls.client_ca_file)
  ServerTls http_tls;  // HTTPS for the HTTP API (cert_file, key_file; reload as tls)
  std::string tool_call_parser;           // the HTTP API's (http_frontend.h)
  std::string reasoning_parser;           // the HTTP API's (http_frontend.h)
  int responses_store_mb = 64;            // the HTTP API's (http_frontend.h)
  // LoadLoraAdapter / UnloadLoraAdapter (and the HTTP routes) are served: a caller may make the
  // worker read any adapter file it can see, so it is off unless asked for (vLLM's
  // VLLM_ALLOW_RUNTIME_LORA_UPDATING).
  bool allow_runtime_lora = false;
  int health_port = 0;                    // plaintext grpc.health.v1 only (probes); 0 = off
  TracerOptions tracing;                  // OpenTelemetry spans; endpoint empty = off
  bool probe_at_start = true;             // run Engine::HealthProbe before turning ready
};

class WorkerServer {
 public:
  // Loads the model, starts the engine, the servers and the watchdog. Errors name the cause
  // (model load, port in use...).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(const WorkerServerOptions& options);
  ~WorkerServer();

  // Blocks until SIGTERM/SIGINT (which the caller must have blocked, see signals.h), then
  // drains and stops. Returns the process exit code (0 after a clean drain).
  int ServeUntilSignal();
  // Drains and stops (idempotent).
  void Drain();

  int port() const { return port_; }

 private:
  explicit WorkerServer(const WorkerServerOptions& options);
  void WatchdogLoop();
  void SetReady(bool ready);

  WorkerServerOptions options_;
  std::unique_ptr<Tracer> tracer_;  // outlives the servers (their calls end spans); reset in the
                                    // destructor, before metrics_ (its counters) goes
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<WorkerMetrics> metrics_;
  WorkerState state_;
  std::unique_ptr<TinyServeService> api_service_;
  std::unique_ptr<WorkerControlService> control_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;  // --health-port
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<HttpFrontend> http_;
  int port_ = 0;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_watchdog_ = false;  // GUARDED_BY(mu_)
  bool drained_ = false;        // GUARDED_BY(mu_)
  std::thread watchdog_;
};

}  // namespace tinyserve
