// tinyserve router: spreads requests over workers.
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_split.h"
#include "router/router_server.h"
#include "services/tinyserve/cli_common.h"
#include "services/tinyserve/commands.h"
#include "worker/server/signals.h"

namespace tinyserve {

int RunRouterCommand(const std::vector<std::string>& args) {
  BlockTerminationSignals();
  FlagSet flags(
      "router",
      "Route tinyserve.v1.TinyServe requests to workers (streaming proxy with retries "
      "before the first token, circuit breakers and a bounded queue), with "
      "grpc.health.v1, reflection, an OpenAI-compatible HTTP API and Prometheus metrics on "
      "HTTP /metrics.");
  RouterServerOptions o;
  std::string workers, policy = "cache_aware";
  flags.String("host", &o.host, "address to listen on");
  flags.Int("port", &o.port, "gRPC port");
  flags.Int("metrics-port", &o.metrics_port, "HTTP port of /metrics (0: off)");
  flags.Int("http-port", &o.http_port,
            "OpenAI-compatible HTTP API port: /v1/completions, /v1/chat/completions, /v1/models "
            "(0: off)");
  flags.Int("http-threads", &o.http_threads, "HTTP connections served at once");
  RegisterHttpApiFlags(&flags, &o.tool_call_parser, &o.reasoning_parser, &o.responses_store_mb);
  RegisterServerSecurityFlags(&flags, &o.api_key, &o.tls, &o.health_port, &o.http_tls);
  RegisterTracingFlags(&flags, &o.tracing);
  flags.String("worker-tls-ca", &o.worker_tls.ca_file,
               "dial workers over TLS, verifying them with this PEM CA bundle");
  flags.String("worker-tls-cert", &o.worker_tls.cert_file,
               "client certificate presented to workers (their --tls-client-ca)");
  flags.String("worker-tls-key", &o.worker_tls.key_file, "the key of --worker-tls-cert");
  flags.String("worker-tls-server-name", &o.worker_tls.server_name,
               "the name in the workers' certificates (default: the host dialled)");
  flags.String("workers", &workers, "static workers: host:port,host:port,...");
  flags.String("workers-dns", &o.registry.dns,
               "DNS name:port resolved to all workers (a Kubernetes headless Service)");
  flags.Double("dns-interval", &o.registry.dns_interval_seconds, "seconds between DNS lookups");
  flags.String("policy", &policy, "round_robin, least_load, power_of_two or cache_aware");
  flags.Double("cache-beta", &o.routing.cache_beta,
               "cache_aware: weight of relative load against the prefix match ratio");
  flags.Double("cache-min-match", &o.routing.cache_min_match,
               "cache_aware: below this match ratio use power_of_two");
  flags.Int("max-inflight", &o.max_inflight, "requests proxied at once");
  flags.Int("max-queue", &o.max_queue, "requests waiting beyond max-inflight (then RESOURCE_EXHAUSTED)");
  flags.Int("max-attempts", &o.max_attempts, "workers tried per request before the first token");
  flags.Double("health-interval", &o.registry.health_interval_seconds,
               "seconds between health checks and load polls");
  flags.Int("breaker-failures", &o.registry.breaker_failures,
            "consecutive failures that open a worker's circuit breaker");
  flags.Double("breaker-cooldown", &o.registry.breaker_cooldown_seconds,
               "seconds before an open breaker lets a probe through");
  flags.Double("drain-timeout", &o.drain_timeout_seconds,
               "seconds in-flight requests may take to finish after SIGTERM");
  flags.Int("max-message-bytes", &o.max_message_bytes,
            "largest request accepted (larger: RESOURCE_EXHAUSTED)");
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  o.worker_tls.reload_seconds = o.tls.reload_seconds;
  for (absl::string_view w : absl::StrSplit(workers, ',', absl::SkipEmpty())) {
    o.registry.static_workers.emplace_back(w);
  }
  auto kind = ParseRoutingPolicy(policy);
  if (!kind.ok()) return FailWith(std::string(kind.status().message()));
  o.routing.kind = *kind;
  auto server = RouterServer::Start(o);
  if (!server.ok()) return FailWith(std::string(server.status().message()));
  return (*server)->ServeUntilSignal();
}

}  // namespace tinyserve
