#include "router/router_server.h"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/socket_io.h"
#include "common/timer.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "worker/server/signals.h"

#ifndef TINYSERVE_VERSION
#define TINYSERVE_VERSION "dev"
#endif

namespace tinyserve {

RouterServer::RouterServer(const RouterServerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<RouterServer>> RouterServer::Start(
    const RouterServerOptions& options) {
  if (options.registry.static_workers.empty() && options.registry.dns.empty()) {
    return absl::InvalidArgumentError("workers: give --workers host:port,... or --workers-dns");
  }
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  RegistryOptions registry = options.registry;
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> worker_credentials =
      MakeChannelCredentials(options.worker_tls, "--worker-tls-");
  if (!worker_credentials.ok()) return worker_credentials.status();
  registry.credentials = *worker_credentials;
  registry.tls_server_name = options.worker_tls.server_name;
  registry.api_key = options.api_key;
  TracerOptions tracing = options.tracing;
  if (tracing.service_name.empty()) tracing.service_name = "tinyserve-router";
  tracing.service_version = TINYSERVE_VERSION;
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Create(tracing);
  if (!tracer.ok()) return tracer.status();
  std::unique_ptr<RouterServer> r(new RouterServer(options));
  r->tracer_ = *std::move(tracer);
  r->metrics_ = std::make_unique<RouterMetrics>(TINYSERVE_VERSION,
                                                RoutingPolicyName(options.routing.kind));
  if (r->tracer_ != nullptr) r->tracer_->BindMetrics(r->metrics_->registry().get());
  r->registry_ = std::make_unique<WorkerRegistry>(registry, r->metrics_.get());
  r->policy_ = std::make_unique<RoutingPolicy>(options.routing);
  r->admission_ = std::make_unique<Admission>(options.max_inflight, options.max_queue,
                                              &r->metrics_->waiting(), &r->metrics_->running());
  r->core_.metrics = r->metrics_.get();
  r->core_.registry = r->registry_.get();
  r->core_.policy = r->policy_.get();
  r->core_.admission = r->admission_.get();
  r->lora_sync_ = std::make_unique<LoraSync>(r->metrics_.get());
  r->core_.max_attempts = options.max_attempts;
  r->core_.version = TINYSERVE_VERSION;
  r->core_.api_key = options.api_key;
  r->core_.tracer = r->tracer_.get();
  r->core_.start_time = NowSeconds();
  r->service_ = std::make_unique<RouterService>(&r->core_);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = JoinHostPort(options.host, options.port);
  builder.AddListeningPort(address, *credentials, &r->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.RegisterService(r->service_.get());
  r->server_ = builder.BuildAndStart();
  if (r->server_ == nullptr || r->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  auto health_server = StartHealthServer(options.host, options.health_port);
  if (!health_server.ok()) {
    r->server_->Shutdown();
    return health_server.status();
  }
  r->health_server_ = *std::move(health_server);
  SetHealth({r->server_.get(), r->health_server_.get()}, "liveness", true);
  r->SetReady(false);

  if (options.metrics_port > 0) {
    const std::string metrics_address = JoinHostPort(options.host, options.metrics_port);
    try {
      r->exposer_ = std::make_unique<prometheus::Exposer>(metrics_address);
    } catch (const std::exception& ex) {
      r->server_->Shutdown();
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", metrics_address, ": ", ex.what()));
    }
    r->exposer_->RegisterCollectable(r->metrics_->registry());
  }
  auto http = HttpFrontend::StartFor(
      r->server_.get(),
      {options.host, options.http_port, options.http_threads, options.max_message_bytes,
       TINYSERVE_VERSION, options.api_key, options.http_tls.cert_file, options.http_tls.key_file,
       options.tls.reload_seconds, options.tool_call_parser, options.reasoning_parser,
       options.responses_store_mb},
      r->metrics_->registry().get(), r->metrics_->registry());
  if (!http.ok()) {
    r->server_->Shutdown();
    return http.status();
  }
  r->http_ = *std::move(http);

  RouterServer* self = r.get();
  r->registry_->SetOnHealthChange([self](int healthy) {
    self->SetReady(healthy > 0 && !self->core_.draining.load());
  });
  r->registry_->SetOnPollRound(
      [self](const std::vector<WorkerPtr>& workers) { self->lora_sync_->Reconcile(workers); });
  r->registry_->Start();
  TS_LOG(INFO) << "router serving gRPC" << (options.tls.enabled() ? " (TLS)" : "") << " on "
               << options.host << ":" << r->port_ << ", policy "
               << RoutingPolicyName(options.routing.kind)
               << (options.metrics_port > 0
                       ? absl::StrCat(", metrics on :", options.metrics_port, "/metrics")
                       : std::string())
               << (options.http_port > 0
                       ? absl::StrCat(", OpenAI-compatible HTTP on :", options.http_port)
                       : std::string());
  return r;
}

RouterServer::~RouterServer() {
  Drain();
  tracer_.reset();  // flushes its spans while the metrics registry of its counters exists
}

void RouterServer::SetReady(bool ready) {
  if (server_ == nullptr) return;
  SetHealth({server_.get(), health_server_.get()}, "readiness", ready);
  SetHealth({server_.get(), health_server_.get()}, "", ready);
}

void RouterServer::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drained_) return;
    drained_ = true;
  }
  if (server_ == nullptr) return;
  core_.draining.store(true);
  SetReady(false);
  const double deadline = NowSeconds() + options_.drain_timeout_seconds;
  while ((admission_->inflight() > 0 || admission_->waiting() > 0) && NowSeconds() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (http_ != nullptr) http_->BeginShutdown();  // no in-process call after the server is down
  // Cancels what is still running (each call cancels its upstream and then finishes).
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  http_.reset();  // after the server: its handlers' calls have ended
  registry_->Stop();
  if (health_server_ != nullptr) health_server_->Shutdown();
  exposer_.reset();
}

int RouterServer::ServeUntilSignal() {
  return DrainOnTerminationSignal(options_.drain_timeout_seconds, [this] { Drain(); });
}

}  // namespace tinyserve
