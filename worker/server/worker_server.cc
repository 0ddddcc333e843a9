#include "worker/server/worker_server.h"

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>

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

WorkerServer::WorkerServer(const WorkerServerOptions& options) : options_(options) {}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(
    const WorkerServerOptions& options) {
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(options.tls);
  if (!credentials.ok()) return credentials.status();
  TracerOptions tracing = options.tracing;
  if (tracing.service_name.empty()) tracing.service_name = "tinyserve-worker";
  tracing.service_version = TINYSERVE_VERSION;
  absl::StatusOr<std::unique_ptr<Tracer>> tracer = Tracer::Create(tracing);
  if (!tracer.ok()) return tracer.status();
  std::unique_ptr<WorkerServer> w(new WorkerServer(options));
  w->tracer_ = *std::move(tracer);
  Stopwatch load_time;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options.engine);
  if (!engine.ok()) return engine.status();
  w->engine_ = std::move(*engine);
  TS_LOG(INFO) << "loaded " << options.engine.model_path << " in " << load_time.Seconds()
               << " s";

  Engine* e = w->engine_.get();
  w->metrics_ = std::make_unique<WorkerMetrics>(TINYSERVE_VERSION, e->served_name(),
                                                options.engine.device, [e] { return e->Stats(); });
  w->metrics_->SetReady(false);
  w->metrics_->DeclareLoras(e->loras());
  if (w->tracer_ != nullptr) w->tracer_->BindMetrics(w->metrics_->registry());
  e->SetObserver(w->metrics_.get());
  e->Start();

  if (options.probe_at_start) {
    if (absl::Status s = e->HealthProbe(); !s.ok()) {
      return absl::UnavailableError(absl::StrCat("start-up health probe failed: ", s.message()));
    }
  }

  w->state_.engine = e;
  w->state_.metrics = w->metrics_.get();
  w->state_.model_path = options.engine.model_path;
  w->state_.model_identity = ModelIdentity(*e);
  w->state_.version = TINYSERVE_VERSION;
  w->state_.api_key = options.api_key;
  w->state_.allow_runtime_lora = options.allow_runtime_lora;
  w->state_.tracer = w->tracer_.get();
  w->state_.start_time = NowSeconds();
  w->api_service_ = std::make_unique<TinyServeService>(&w->state_);
  w->control_service_ = std::make_unique<WorkerControlService>(&w->state_);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = JoinHostPort(options.host, options.port);
  builder.AddListeningPort(address, *credentials, &w->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.RegisterService(w->api_service_.get());
  builder.RegisterService(w->control_service_.get());
  w->server_ = builder.BuildAndStart();
  if (w->server_ == nullptr || w->port_ == 0) {
    w->engine_->Stop();
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }
  auto health_server = StartHealthServer(options.host, options.health_port);
  if (!health_server.ok()) {
    w->server_->Shutdown();
    w->engine_->Stop();
    return health_server.status();
  }
  w->health_server_ = *std::move(health_server);
  SetHealth({w->server_.get(), w->health_server_.get()}, "liveness", true);
  SetHealth({w->server_.get(), w->health_server_.get()}, "readiness", false);
  SetHealth({w->server_.get(), w->health_server_.get()}, "", false);

  if (options.metrics_port > 0) {
    const std::string metrics_address = JoinHostPort(options.host, options.metrics_port);
    try {
      w->exposer_ = std::make_unique<prometheus::Exposer>(metrics_address);
    } catch (const std::exception& ex) {
      w->server_->Shutdown();
      w->engine_->Stop();
      return absl::UnavailableError(
          absl::StrCat("cannot serve metrics on ", metrics_address, ": ", ex.what()));
    }
    w->exposer_->RegisterCollectable(w->metrics_->collectable());
  }
  auto http = HttpFrontend::StartFor(
      w->server_.get(),
      {options.host, options.http_port, options.http_threads, options.max_message_bytes,
       TINYSERVE_VERSION, options.api_key, options.http_tls.cert_file, options.http_tls.key_file,
       options.tls.reload_seconds, options.tool_call_parser, options.reasoning_parser,
       options.responses_store_mb},
      w->metrics_->registry(), w->metrics_->collectable());
  if (!http.ok()) {
    w->server_->Shutdown();
    w->engine_->Stop();
    return http.status();
  }
  w->http_ = *std::move(http);

  w->SetReady(true);
  w->watchdog_ = std::thread([p = w.get()] { p->WatchdogLoop(); });
  TS_LOG(INFO) << "worker serving gRPC" << (options.tls.enabled() ? " (TLS)" : "") << " on "
               << options.host << ":" << w->port_
               << (options.metrics_port > 0
                       ? absl::StrCat(", metrics on :", options.metrics_port, "/metrics")
                       : std::string())
               << (options.http_port > 0 ? absl::StrCat(", HTTP on :", options.http_port)
                                         : std::string());
  return w;
}

WorkerServer::~WorkerServer() {
  Drain();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_watchdog_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  // Flushes its spans while the metrics registry its counters live in still exists.
  tracer_.reset();
}

void WorkerServer::SetReady(bool ready) {
  state_.ready.store(ready);
  SetHealth({server_.get(), health_server_.get()}, "readiness", ready);
  SetHealth({server_.get(), health_server_.get()}, "", ready);
  metrics_->SetReady(ready);
}

void WorkerServer::WatchdogLoop() {
  int64_t last_steps = -1;
  double last_progress = NowSeconds();
  bool was_ready = true;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_watchdog_) {
    cv_.wait_for(lock, std::chrono::milliseconds(250));
    if (stop_watchdog_ || drained_) continue;
    lock.unlock();
    const EngineStats s = engine_->Stats();
    const double now = NowSeconds();
    if (s.steps_total != last_steps || (s.running == 0 && s.waiting == 0)) {
      last_steps = s.steps_total;
      last_progress = now;
    }
    const bool stalled = now - last_progress > options_.stall_seconds;
    const bool ready = !stalled && !state_.draining.load();
    if (ready != was_ready) {
      if (stalled) {
        TS_LOG(WARNING) << "watchdog: " << s.running << " running requests and no step for "
                        << now - last_progress << " s; not ready";
      } else if (ready) {
        TS_LOG(INFO) << "watchdog: progress again; ready";
      }
      was_ready = ready;
      SetReady(ready);
    }
    lock.lock();
  }
}

void WorkerServer::Drain() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (drained_) return;
    drained_ = true;
  }
  if (server_ == nullptr) return;
  state_.draining.store(true);
  SetReady(false);
  engine_->Drain();
  const double deadline = NowSeconds() + options_.drain_timeout_seconds;
  for (;;) {
    const EngineStats s = engine_->Stats();
    if (s.running == 0 && s.waiting == 0) break;
    if (NowSeconds() >= deadline) {
      TS_LOG(WARNING) << "drain: grace period over; aborting " << s.running << " running and "
                      << s.waiting << " waiting requests";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  // Stop() aborts whatever is left, so every open stream gets its OnFinish and closes;
  // then the server can shut down without waiting on a reactor that will never finish.
  engine_->Stop();
  if (http_ != nullptr) http_->BeginShutdown();  // no in-process call after the server is down
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  http_.reset();  // after the server: its handlers' calls have ended
  if (health_server_ != nullptr) health_server_->Shutdown();
  exposer_.reset();
}

int WorkerServer::ServeUntilSignal() {
  return DrainOnTerminationSignal(options_.drain_timeout_seconds, [this] { Drain(); });
}

}  // namespace tinyserve
