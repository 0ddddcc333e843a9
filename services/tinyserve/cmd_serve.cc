// tinyserve serve: a router and worker(s) as child processes of this one, for a one-command
// local deployment. SIGTERM/SIGINT are forwarded to the children, which drain and exit.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/paths.h"
#include "common/socket_io.h"
#include "common/timer.h"
#include "grpcpp/grpcpp.h"
#include "services/tinyserve/cli_common.h"
#include "services/tinyserve/commands.h"
#include "tinyserve/v1/tinyserve.grpc.pb.h"
#include "worker/server/rpc_security.h"
#include "worker/server/signals.h"

namespace tinyserve {
namespace {

// Starts `/proc/self/exe args...` with the default signal mask; returns its pid or -1.
pid_t Spawn(const std::vector<std::string>& args) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Its own process group: a terminal's Ctrl-C reaches only `serve`, which forwards it once
  // (a second signal would make the child skip its drain).
  setpgid(0, 0);
  sigset_t none;
  sigemptyset(&none);
  pthread_sigmask(SIG_SETMASK, &none, nullptr);
  std::vector<char*> argv;
  std::string self = "tinyserve";
  argv.push_back(self.data());
  std::vector<std::string> copy = args;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::perror("exec");
  _exit(127);
}

bool RouterReady(const std::string& address) {
  auto stub = tinyserve::v1::TinyServe::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(1));
  // The children inherit $TINYSERVE_API_KEY as their --api-key default.
  if (const char* key = std::getenv("TINYSERVE_API_KEY")) AttachApiKey(key, &ctx);
  tinyserve::v1::GetServerInfoRequest req;
  tinyserve::v1::ServerInfo info;
  return stub->GetServerInfo(&ctx, req, &info).ok() && info.ready();
}

}  // namespace

int RunServeCommand(const std::vector<std::string>& args) {
  BlockTerminationSignals();
  FlagSet flags("serve",
                "Start a router and worker(s) on this machine as child processes, wait until "
                "they are ready and print an example request. SIGTERM/SIGINT stops them.");
  std::string model = DefaultModelPath();
  std::string host = "127.0.0.1", policy = "cache_aware";
  int port = 50050, metrics_port = 9000, worker_port = 50051, worker_metrics_port = 9100;
  int http_port = 8000;
  int workers = 1, threads = 1;
  double ready_timeout = 300;
  std::vector<std::string> worker_args;
  std::string tool_call_parser, reasoning_parser;
  flags.String("model", &model, "GGUF file or Hugging Face folder (default: the default model)");
  flags.String("host", &host, "address the router and workers listen on");
  flags.Int("port", &port, "router gRPC port");
  flags.Int("metrics-port", &metrics_port, "router /metrics port");
  flags.Int("http-port", &http_port, "router's OpenAI-compatible HTTP API port (0: off)");
  flags.Int("worker-port", &worker_port, "first worker's gRPC port (the next ones follow)");
  flags.Int("worker-metrics-port", &worker_metrics_port, "first worker's /metrics port");
  flags.Int("workers", &workers, "worker processes");
  flags.Int("threads", &threads, "CPU threads per worker");
  flags.String("policy", &policy, "routing policy");
  flags.Double("ready-timeout", &ready_timeout, "seconds to wait for readiness");
  flags.StringList("worker-arg", &worker_args, "extra flag for every worker (repeatable)");
  flags.String("tool-call-parser", &tool_call_parser,
               "the router's HTTP API: hermes or llama3_json parses tool_choice \"auto\" "
               "outputs' calls in that format into tool calls (off: \"auto\" is refused)");
  flags.String("reasoning-parser", &reasoning_parser,
               "the router's HTTP API: qwen3 or deepseek_r1 moves a chat answer's <think> block "
               "into reasoning_content (off: left in content)");
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (!FileExists(model)) {
    return FailWith(absl::StrCat("model: ", model,
                                 " not found (scripts/fetch-model, or pass --model PATH)"));
  }

  std::vector<pid_t> children;
  std::string worker_list;
  for (int i = 0; i < workers; ++i) {
    std::vector<std::string> a = {"worker",
                                  "--model", model,
                                  "--host", host,
                                  "--port", std::to_string(worker_port + i),
                                  "--metrics-port", std::to_string(worker_metrics_port + i),
                                  "--threads", std::to_string(threads)};
    a.insert(a.end(), worker_args.begin(), worker_args.end());
    children.push_back(Spawn(a));
    worker_list +=
        absl::StrCat(worker_list.empty() ? "" : ",", JoinHostPort(host, worker_port + i));
  }
  std::vector<std::string> router = {"router",
                                     "--host",
                                     host,
                                     "--port",
                                     std::to_string(port),
                                     "--metrics-port",
                                     std::to_string(metrics_port),
                                     "--http-port",
                                     std::to_string(http_port),
                                     "--workers",
                                     worker_list,
                                     "--policy",
                                     policy};
  if (!tool_call_parser.empty())
    router.insert(router.end(), {"--tool-call-parser", tool_call_parser});
  if (!reasoning_parser.empty())
    router.insert(router.end(), {"--reasoning-parser", reasoning_parser});
  children.push_back(Spawn(router));

  auto stop_all = [&](int sig) {
    for (pid_t pid : children) {
      if (pid > 0) kill(pid, sig);
    }
  };
  auto reap = [&](bool block) {
    int alive = 0;
    for (pid_t& pid : children) {
      if (pid <= 0) continue;
      int status = 0;
      if (waitpid(pid, &status, block ? 0 : WNOHANG) == pid) {
        pid = -1;
      } else {
        ++alive;
      }
    }
    return alive;
  };

  const std::string address = JoinHostPort(host, port);
  const double start = NowSeconds();
  bool ready = false;
  while (!ready && NowSeconds() - start < ready_timeout) {
    if (WaitForTerminationSignal(0.25) != 0 ||
        reap(false) < static_cast<int>(children.size())) {
      break;
    }
    ready = RouterReady(address);
  }
  if (!ready) {
    std::fprintf(stderr, "error: the cluster did not become ready; stopping it\n");
    stop_all(SIGTERM);
    reap(true);
    return 1;
  }
  std::printf(
      "TinyServe is ready: router on %s (metrics http://%s:%d/metrics), %d worker(s).\n"
      "Try:\n  tinyserve generate --server %s --prompt \"Once upon a time\" --max-tokens 64\n",
      address.c_str(), host.c_str(), metrics_port, workers, address.c_str());
  if (http_port > 0) {
    std::printf(
        "  curl http://%s:%d/v1/chat/completions -H 'Content-Type: application/json' \\\n"
        "    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], "
        "\"max_tokens\": 64}'\n",
        host.c_str(), http_port);
  }
  std::printf("Ctrl-C stops it.\n");
  std::fflush(stdout);

  int sig = 0;
  while (sig == 0) {
    sig = WaitForTerminationSignal(0.5);
    if (sig == 0 && reap(false) < static_cast<int>(children.size())) {
      std::fprintf(stderr, "error: a child process exited; stopping the others\n");
      sig = SIGTERM;
    }
  }
  stop_all(sig);
  reap(true);
  return 0;
}

}  // namespace tinyserve
