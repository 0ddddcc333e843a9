// tinyserve worker: one worker process (engine + gRPC + /metrics).
#include <cstdio>

#include "services/tinyserve/cli_common.h"
#include "services/tinyserve/commands.h"
#include "worker/server/signals.h"
#include "worker/server/worker_server.h"

namespace tinyserve {

int RunWorkerCommand(const std::vector<std::string>& args) {
  // Before any thread starts, so every thread inherits the mask (worker/server/signals.h).
  BlockTerminationSignals();
  FlagSet flags("worker",
                "Serve one model over gRPC (tinyserve.v1.TinyServe + WorkerControl, "
                "grpc.health.v1, reflection) with Prometheus metrics on HTTP /metrics.\n"
                "SIGTERM/SIGINT drains: stop admitting, finish running requests, exit 0.");
  EngineFlags ef;
  WorkerServerOptions o;
  bool prefix_caching = true;
  ef.Register(&flags);
  flags.String("host", &o.host, "address to listen on");
  flags.Int("port", &o.port, "gRPC port");
  flags.Int("metrics-port", &o.metrics_port, "HTTP port of /metrics (0: off)");
  flags.Int("max-queue", &ef.options.max_queue, "waiting requests before RESOURCE_EXHAUSTED");
  flags.Int("max-step-tokens", &ef.options.max_step_tokens, "prefill tokens per step");
  flags.Int64("kv-pages", &ef.options.kv_pages, "KV pages in the pool (0: from kv-memory-mb)");
  flags.String("kv-dtype", &ef.options.kv_dtype, "KV storage: f16 or int8");
  flags.Bool("prefix-caching", &prefix_caching, "share cached prefix pages (--no-prefix-caching)");
  flags.Double("stall-seconds", &o.stall_seconds,
               "watchdog: running requests without a step this long -> not ready");
  flags.Double("drain-timeout", &o.drain_timeout_seconds,
               "seconds running requests may take to finish after SIGTERM");
  flags.Int("max-message-bytes", &o.max_message_bytes,
            "largest request accepted (larger: RESOURCE_EXHAUSTED)");
  flags.String("device", &o.device, "device label for tinyserve_build_info");
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  o.engine = ef.Build();
  o.engine.prefix_caching = prefix_caching;
  auto server = WorkerServer::Start(o);
  if (!server.ok()) return FailWith(std::string(server.status().message()));
  return (*server)->ServeUntilSignal();
}

}  // namespace tinyserve
