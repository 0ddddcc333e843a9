// tinyserve worker: one worker process (engine + gRPC + /metrics), or one rank of a
// tensor-parallel group.
//
// Tensor parallelism (worker/tp): `--tp-size N --rank R --tp-rendezvous HOST:PORT` per rank.
// Rank 0 listens for the rendezvous on HOST:PORT, serves gRPC and /metrics as usual and turns
// ready only once every rank has loaded its shard (Engine::Create waits for the group). Ranks
// > 0 serve no API: they replay rank 0's steps (worker/tp/tp_follower.h) and exit when rank 0
// shuts the group down (0) or when it fails (1). `--tp-size N --tp-launch local` starts ranks
// 1..N-1 as child processes of this one (rank 0), on a free loopback rendezvous port.
//
// Group failure: rank 0 watches its communicator (every error of a collective, including the
// idle heartbeats of the engine) and, in launch mode, its children (waitpid). When either
// fails, rank 0 drains at once (readiness NOT_SERVING, so the router stops routing to it),
// then exits 1 so that a supervisor restarts the whole group.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/timer.h"
#include "services/tinyserve/cli_common.h"
#include "services/tinyserve/commands.h"
#include "worker/server/signals.h"
#include "worker/server/worker_server.h"
#include "worker/tp/communicator.h"
#include "worker/tp/tcp_store.h"
#include "worker/tp/tp_follower.h"
#ifdef TINYSERVE_HAVE_GLOO
#include "worker/tp/gloo_communicator.h"
#endif

namespace tinyserve {
namespace {

// Passes every call through and remembers the first error: rank 0's group-health signal.
class WatchedCommunicator : public Communicator {
 public:
  explicit WatchedCommunicator(std::unique_ptr<Communicator> inner) : inner_(std::move(inner)) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  absl::Status AllReduceSum(float* data, size_t n) override {
    return Watch(inner_->AllReduceSum(data, n));
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return Watch(inner_->Broadcast(data, bytes, root));
  }
  absl::Status Barrier() override { return Watch(inner_->Barrier()); }
  void StartupDone() override { inner_->StartupDone(); }
  bool failed() const { return failed_.load(); }

 private:
  absl::Status Watch(absl::Status s) {
    if (!s.ok()) failed_.store(true);
    return s;
  }
  std::unique_ptr<Communicator> inner_;
  std::atomic<bool> failed_{false};
};

// Ranks 1..n-1 of a local group: child processes running this binary's worker command.
class LocalRanks {
 public:
  ~LocalRanks() { Stop(5); }

  absl::Status Spawn(const std::vector<std::string>& base_args, int tp_size,
                     const std::string& rendezvous) {
    for (int r = 1; r < tp_size; ++r) {
      std::vector<std::string> args = {"tinyserve", "worker"};
      args.insert(args.end(), base_args.begin(), base_args.end());
      args.push_back("--rank");
      args.push_back(std::to_string(r));
      args.push_back("--tp-rendezvous");
      args.push_back(rendezvous);
      const pid_t pid = fork();
      if (pid < 0) return absl::InternalError("fork failed");
      if (pid == 0) {
        // If rank 0 dies, so do its ranks (even on SIGKILL). Termination signals stay blocked
        // across exec (the mask is inherited); the follower waits for them itself.
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) _exit(1);
        std::vector<char*> argv;
        for (auto& a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        _exit(127);
      }
      std::lock_guard<std::mutex> lock(mu_);
      pids_.push_back(pid);
    }
    return absl::OkStatus();
  }

  // A child that exited (any reason) while the group should be running; -1 when none.
  pid_t Reap() {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < pids_.size(); ++i) {
      int status = 0;
      if (waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
        const pid_t p = pids_[i];
        TS_LOG(ERROR) << "tensor-parallel rank " << i + 1 << " (pid " << p << ") exited "
                      << (WIFSIGNALED(status) ? absl::StrCat("on signal ", WTERMSIG(status))
                                              : absl::StrCat("with ", WEXITSTATUS(status)));
        pids_[i] = -1;
        return p;
      }
    }
    return -1;
  }

  // Waits up to grace_s for the children (rank 0's shutdown message ends them), then SIGTERM,
  // then SIGKILL.
  void Stop(double grace_s) {
    std::lock_guard<std::mutex> lock(mu_);
    const double deadline = NowSeconds() + grace_s;
    for (int sig : {0, SIGTERM, SIGKILL}) {
      for (pid_t p : pids_)
        if (p > 0 && sig != 0) kill(p, sig);
      const double until = sig == 0 ? deadline : NowSeconds() + 2;
      for (;;) {
        bool left = false;
        for (pid_t& p : pids_) {
          if (p > 0 && waitpid(p, nullptr, WNOHANG) == p) p = -1;
          left |= p > 0;
        }
        if (!left) return;
        if (NowSeconds() >= until) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    }
  }

 private:
  std::mutex mu_;
  std::vector<pid_t> pids_;
};

// The worker args without the flags the launcher sets per rank.
std::vector<std::string> ArgsForRanks(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    bool drop = false;
    for (const char* f : {"--tp-launch", "--rank", "--tp-rendezvous"}) {
      const std::string flag = f;
      if (args[i] == flag) {
        drop = true;
        ++i;  // and its value
      } else if (args[i].rfind(flag + "=", 0) == 0) {
        drop = true;
      }
      if (drop) break;
    }
    if (!drop) out.push_back(args[i]);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeCpuCommunicator(
    int rank, int world, const std::string& rendezvous, double timeout_s, double startup_timeout_s,
    std::unique_ptr<TcpStoreServer> server) {
#ifdef TINYSERVE_HAVE_GLOO
  return MakeGlooCommunicator(rank, world, rendezvous, timeout_s, std::move(server),
                              startup_timeout_s);
#else
  (void)rank, (void)world, (void)rendezvous, (void)timeout_s, (void)startup_timeout_s, (void)server;
  return absl::UnimplementedError("tensor parallelism needs Gloo (libgloo-dev) in this build");
#endif
}

// A rank > 0: no API, just the follower loop.
int RunFollowerRank(const EngineOptions& eo, int rank, int tp_size, const std::string& rendezvous,
                    double timeout_s, double startup_timeout_s, double drain_timeout_s) {
  // A termination signal alone does not stop a follower (rank 0 drains and then sends the
  // shutdown); if none comes within the drain grace, exit anyway.
  std::thread([drain_timeout_s] {
    if (WaitForTerminationSignal(1e9) != 0) {
      std::this_thread::sleep_for(std::chrono::duration<double>(drain_timeout_s + 5));
      TS_LOG(WARNING) << "no shutdown from rank 0 after a termination signal; exiting";
      std::_Exit(0);
    }
  }).detach();
  auto comm = MakeCpuCommunicator(rank, tp_size, rendezvous, timeout_s, startup_timeout_s, nullptr);
  if (!comm.ok()) return FailWith(std::string(comm.status().message()));
  TpFollowerOptions fo;
  fo.model_path = eo.model_path;
  fo.rope_scaling = eo.rope_scaling;
  fo.threads = eo.threads;
  fo.loras = eo.loras;
  const absl::Status s = RunTpFollower(fo, comm->get());
  if (!s.ok()) {
    TS_LOG(ERROR) << "tensor-parallel rank " << rank << ": " << s;
    return 1;
  }
  return 0;
}

}  // namespace

int RunWorkerCommand(const std::vector<std::string>& args) {
  // Before any thread starts, so every thread inherits the mask (worker/server/signals.h).
  BlockTerminationSignals();
  FlagSet flags("worker",
                "Serve one model over gRPC (tinyserve.v1.TinyServe + WorkerControl, "
                "grpc.health.v1, reflection) with Prometheus metrics on HTTP /metrics.\n"
                "SIGTERM/SIGINT drains: stop admitting, finish running requests, exit 0.\n"
                "Tensor parallelism: --tp-size N with --rank R --tp-rendezvous HOST:PORT per "
                "rank (rank 0 serves; the others replay its steps), or --tp-launch local to "
                "start ranks 1..N-1 here as child processes.");
  EngineFlags ef;
  WorkerServerOptions o;
  bool prefix_caching = true;
  int tp_size = 1, rank = 0;
  std::string tp_rendezvous, tp_launch;
  double tp_timeout = 30, tp_startup_timeout = 600, tp_heartbeat = 1;
  ef.Register(&flags);
  flags.String("host", &o.host, "address to listen on");
  flags.Int("port", &o.port, "gRPC port");
  flags.Int("metrics-port", &o.metrics_port, "HTTP port of /metrics (0: off)");
  flags.Int("http-port", &o.http_port, "OpenAI-compatible HTTP API port (0: off)");
  flags.Int("http-threads", &o.http_threads, "HTTP connections served at once");
  RegisterHttpApiFlags(&flags, &o.tool_call_parser, &o.reasoning_parser, &o.responses_store_mb);
  RegisterServerSecurityFlags(&flags, &o.api_key, &o.tls, &o.health_port, &o.http_tls);
  RegisterTracingFlags(&flags, &o.tracing);
  flags.Bool("allow-runtime-lora", &o.allow_runtime_lora,
             "serve LoadLoraAdapter/UnloadLoraAdapter (/v1/load_lora_adapter): callers may make "
             "the worker read adapter files");
  flags.String("served-model-name", &ef.options.served_model_name,
               "the name the APIs serve the model by (default: its own name)");
  flags.Int("max-queue", &ef.options.max_queue,
            "requests waiting beyond the free batch slots before RESOURCE_EXHAUSTED");
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
  flags.Int("tp-size", &tp_size, "tensor-parallel group size (ranks)");
  flags.Int("rank", &rank, "this process's tensor-parallel rank (0 serves the API)");
  flags.String("tp-rendezvous", &tp_rendezvous,
               "HOST:PORT of rank 0's rendezvous store (rank 0 listens there)");
  flags.String("tp-launch", &tp_launch, "'local': start ranks 1..tp-size-1 as child processes");
  flags.Double("tp-timeout", &tp_timeout,
               "seconds a collective may wait for the other ranks before the group fails (once "
               "the group has started)");
  flags.Double("tp-startup-timeout", &tp_startup_timeout,
               "seconds the group's start-up may take: every rank joining, loading the model "
               "and allocating its KV cache (the collectives until then wait this long)");
  flags.Double("tp-heartbeat", &tp_heartbeat, "seconds between liveness checks of an idle group");
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  absl::StatusOr<EngineOptions> engine_options = ef.Build();
  if (!engine_options.ok()) return FailWith(std::string(engine_options.status().message()));
  o.engine = *std::move(engine_options);
  o.engine.prefix_caching = prefix_caching;
  if (tp_size < 1) return FailWith("--tp-size must be >= 1");
  if (tp_size == 1) {
    if (!tp_launch.empty() || rank != 0) return FailWith("--tp-launch and --rank need --tp-size > 1");
    auto server = WorkerServer::Start(o);
    if (!server.ok()) return FailWith(std::string(server.status().message()));
    return (*server)->ServeUntilSignal();
  }

  // ---- Tensor parallelism.
  if (rank < 0 || rank >= tp_size)
    return FailWith(absl::StrCat("--rank ", rank, " is not in [0, ", tp_size, ")"));
  if (!tp_launch.empty() && tp_launch != "local")
    return FailWith("--tp-launch: only 'local' is supported");
  if (!tp_launch.empty() && rank != 0) return FailWith("--tp-launch is for rank 0");
  if (!(tp_timeout > 0) || !(tp_heartbeat > 0) || tp_heartbeat >= tp_timeout)
    return FailWith("--tp-heartbeat must be > 0 and below --tp-timeout");
  if (!(tp_startup_timeout > 0)) return FailWith("--tp-startup-timeout must be > 0");
  if (tp_launch.empty() && tp_rendezvous.empty())
    return FailWith("--tp-size > 1 needs --tp-rendezvous HOST:PORT (or --tp-launch local)");
  o.engine.tp_rank = rank;
  o.engine.tp_size = tp_size;
  o.engine.tp_heartbeat_seconds = tp_heartbeat;
  if (rank > 0)
    return RunFollowerRank(o.engine, rank, tp_size, tp_rendezvous, tp_timeout, tp_startup_timeout,
                           o.drain_timeout_seconds);

  std::unique_ptr<TcpStoreServer> store;
  std::unique_ptr<LocalRanks> children;
  if (tp_launch == "local") {
    std::string host = "127.0.0.1";
    int port = 0;
    if (!tp_rendezvous.empty()) {
      if (auto s = ParseHostPort(tp_rendezvous, &host, &port); !s.ok())
        return FailWith(std::string(s.message()));
    }
    auto listening = TcpStoreServer::Listen(host, port);
    if (!listening.ok()) return FailWith(std::string(listening.status().message()));
    store = std::move(*listening);
    tp_rendezvous = absl::StrCat(host == "0.0.0.0" ? "127.0.0.1" : host, ":", store->port());
    children = std::make_unique<LocalRanks>();
    if (auto s = children->Spawn(ArgsForRanks(args), tp_size, tp_rendezvous); !s.ok())
      return FailWith(std::string(s.message()));
    TS_LOG(INFO) << "tensor parallelism: started ranks 1.." << tp_size - 1
                 << " locally; rendezvous " << tp_rendezvous;
  }
  auto inner = MakeCpuCommunicator(0, tp_size, tp_rendezvous, tp_timeout, tp_startup_timeout,
                                   std::move(store));
  if (!inner.ok()) return FailWith(std::string(inner.status().message()));
  auto comm = std::make_unique<WatchedCommunicator>(std::move(*inner));
  o.engine.tp_comm = comm.get();
  auto server = WorkerServer::Start(o);  // ready once every rank has its shard and cache
  if (!server.ok()) return FailWith(std::string(server.status().message()));

  // Serve until a signal (drain, exit 0) or a group failure (drain at once, exit 1).
  int code = 0;
  for (;;) {
    const int sig = WaitForTerminationSignal(0.1);
    if (sig != 0) {
      TS_LOG(INFO) << "signal " << sig << ": draining (grace " << o.drain_timeout_seconds
                   << " s)";
      break;
    }
    const pid_t dead = children != nullptr ? children->Reap() : -1;
    if (comm->failed() || dead > 0) {
      TS_LOG(ERROR) << "tensor-parallel group failed ("
                    << (dead > 0 ? "a rank exited" : "a collective failed")
                    << "): not ready; draining and exiting";
      code = 1;
      break;
    }
  }
  std::thread([] {
    if (WaitForTerminationSignal(1e9) != 0) {
      TS_LOG(WARNING) << "second signal: exiting without finishing the drain";
      std::_Exit(1);
    }
  }).detach();
  (*server)->Drain();  // readiness NOT_SERVING first; the engine's Stop ends the followers
  server->reset();
  if (children != nullptr) children->Stop(5);
  TS_LOG(INFO) << (code == 0 ? "drained; exiting" : "exiting after a group failure");
  return code;
}

}  // namespace tinyserve
