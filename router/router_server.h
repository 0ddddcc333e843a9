// File: router/router_server.h
// A router process: the worker registry and its poller, the routing policy, the admission
// bound, the gRPC server (TinyServe proxy, grpc.health.v1, reflection) and /metrics.
//
// Health: "liveness" SERVING while the process runs; "" and "readiness" SERVING while at least
// one worker is healthy and the router is not draining.
// Drain (SIGTERM/SIGINT): new calls get UNAVAILABLE, readiness goes NOT_SERVING, in-flight and
// queued calls finish for up to drain_timeout_seconds, then the server shuts down.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/exposer.h"
#include "router/lora_sync.h"
#include "router/router_core.h"
#include "router/router_service.h"
#include "worker/server/http_frontend.h"
#include "worker/server/rpc_security.h"
#include "worker/server/tracing.h"

namespace tinyserve {

struct RouterServerOptions {
  std::string host = "0.0.0.0";
  int port = 50050;
  int metrics_port = 9000;  // 0 = off
  int http_port = 8000;     // OpenAI-compatible HTTP API; 0 = off
  int http_threads = 64;    // HTTP connections served at once
  std::string api_key;      // non-empty: gRPC and HTTP calls need this bearer token; also sent to
                            // the workers
  ServerTls tls;            // the router's gRPC over TLS (mutual with tls.client_ca_file)
  ServerTls http_tls;       // HTTPS for the HTTP API (cert_file, key_file; reload as tls)
  std::string tool_call_parser;  // the HTTP API's (http_frontend.h)
  std::string reasoning_parser;  // the HTTP API's (http_frontend.h)
  int responses_store_mb = 64;   // the HTTP API's (http_frontend.h)
  ClientTls worker_tls;     // how workers are dialled (enabled: TLS)
  int health_port = 0;      // plaintext grpc.health.v1 only (probes); 0 = off
  TracerOptions tracing;    // OpenTelemetry spans; endpoint empty = off
  RegistryOptions registry;
  RoutingOptions routing;
  int max_inflight = 256;
  int max_queue = 1024;
  int max_attempts = 3;
  int max_message_bytes = 4 << 20;
  double drain_timeout_seconds = 30;
};

class RouterServer {
 public:
  static absl::StatusOr<std::unique_ptr<RouterServer>> Start(const RouterServerOptions& options);
  ~RouterServer();

  // Blocks until SIGTERM/SIGINT (blocked by the caller, see worker/server/signals.h), then
  // drains. Returns the process exit code.
  int ServeUntilSignal();
  void Drain();
  int port() const { return port_; }

 private:
  explicit RouterServer(const RouterServerOptions& options);
  void SetReady(bool ready);

  RouterServerOptions options_;
  std::unique_ptr<Tracer> tracer_;  // outlives the servers (their calls end spans); reset in the
                                    // destructor, before metrics_ (its counters) goes
  std::unique_ptr<RouterMetrics> metrics_;
  std::unique_ptr<WorkerRegistry> registry_;
  std::unique_ptr<RoutingPolicy> policy_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<LoraSync> lora_sync_;
  RouterCore core_;
  std::unique_ptr<RouterService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::Server> health_server_;  // --health-port
  std::unique_ptr<prometheus::Exposer> exposer_;
  std::unique_ptr<HttpFrontend> http_;
  int port_ = 0;
  std::mutex mu_;
  bool drained_ = false;  // GUARDED_BY(mu_)
};

}  // namespace tinyserve
