#include "router/worker_registry.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/timer.h"
#include "worker/server/api_util.h"
#include "worker/server/rpc_security.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const RegistryOptions& options) {
  grpc::ChannelArguments args;
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  // Reconnect quickly when a worker restarts (the default backoff grows to two minutes).
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 200);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(64 << 20);
  return grpc::CreateCustomChannel(
      address,
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials(),
      args);
}

// grpc.health.v1.HealthCheckRequest{service: name}, hand-encoded (the health protos are not
// installed as C++ headers): field 1, length-delimited.
grpc::ByteBuffer HealthRequest(const std::string& service) {
  std::string bytes;
  bytes.push_back('\x0a');
  bytes.push_back(static_cast<char>(service.size()));
  bytes += service;
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

// HealthCheckResponse.status == SERVING (field 1, varint 1).
bool IsServing(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const auto& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return bytes.size() >= 2 && bytes[0] == '\x08' && bytes[1] == '\x01';
}

std::chrono::system_clock::time_point In(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

}  // namespace

WorkerHandle::WorkerHandle(std::string address, const RegistryOptions& options,
                           WorkerSeries* series)
    : address_(std::move(address)),
      api_key_(options.api_key),
      channel_(MakeChannel(address_, options)),
      api_(v1::TinyServe::NewStub(channel_)),
      control_(v1::WorkerControl::NewStub(channel_)),
      generic_(std::make_unique<grpc::GenericStub>(channel_)),
      breaker_(options.breaker_failures, options.breaker_cooldown_seconds),
      prefixes_(options.prefix_index_capacity),
      series_(series) {}

void WorkerHandle::NotePollStatus(const grpc::Status& status) {
  const int code = static_cast<int>(status.error_code());
  if (last_poll_code_.exchange(code) == code || status.ok()) return;
  // Once per change: a wrong API key or TLS setting would otherwise leave a worker silently
  // unhealthy.
  TS_LOG(WARNING) << "worker " << address_
                  << ": load poll failed: " << StatusCodeName(status.error_code()) << ": "
                  << status.error_message();
}

void WorkerHandle::Prepare(grpc::ClientContext* context) const { AttachApiKey(api_key_, context); }

v1::LoadReport WorkerHandle::load() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_;
}

bool WorkerHandle::ServesAdapter(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto& served = load_.lora_adapters();
  return std::find(served.begin(), served.end(), name) != served.end();
}

void WorkerHandle::AddInflight() {
  series_->inflight->Set(++inflight_);
  ++dispatched_;
}

void WorkerHandle::RemoveInflight() { series_->inflight->Set(--inflight_); }

std::string WorkerHandle::model() const {
  std::lock_guard<std::mutex> lock(mu_);
  return load_.model();
}

bool WorkerHandle::up() const {
  std::lock_guard<std::mutex> lock(mu_);
  return up_;
}

bool WorkerHandle::model_mismatch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return Mismatch();
}

bool WorkerHandle::Mismatch() const {
  const std::string& mine = load_.model();
  return up_ && !mine.empty() && !cluster_model_.empty() && mine != cluster_model_;
}

void WorkerHandle::SetHealth(bool serving, bool load_ok, const v1::LoadReport& load) {
  std::lock_guard<std::mutex> lock(mu_);
  if (load_ok) load_ = load;
  up_ = serving && load_ok && !load.draining();
  Update();
}

void WorkerHandle::SetClusterModel(const std::string& cluster_model) {
  std::lock_guard<std::mutex> lock(mu_);
  cluster_model_ = cluster_model;
  Update();
}

void WorkerHandle::Update() {
  const bool mismatch = Mismatch();
  // (A poll may answer after the worker was removed: its series then stay as RemoveWorker left
  // them.)
  if (!removed.load()) series_->model_mismatch->Set(mismatch ? 1 : 0);
  if (mismatch != logged_mismatch_) {
    logged_mismatch_ = mismatch;
    if (mismatch) {
      TS_LOG(WARNING) << "worker " << address_ << " serves model " << load_.model()
                      << ", not the cluster's " << cluster_model_ << ": no requests go to it";
    } else if (up_) {
      TS_LOG(INFO) << "worker " << address_ << " serves the cluster's model " << cluster_model_;
    }
  }
  const std::string& mine = load_.model();
  const bool healthy = up_ && (mine.empty() || mine == cluster_model_);
  const bool was = healthy_.exchange(healthy);
  if (!removed.load()) series_->healthy->Set(healthy ? 1 : 0);
  if (was && !healthy) {
    if (!mismatch) TS_LOG(WARNING) << "worker " << address_ << " is down";
    prefixes_.Clear();
  } else if (!was && healthy) {
    TS_LOG(INFO) << "worker " << address_ << " is healthy";
    // A worker that came back (e.g. restarted) starts with a closed breaker.
    breaker_.RecordSuccess();
    // Seed the prefix index with what the worker reports having served.
    struct Call {
      grpc::ClientContext ctx;
      v1::GetPrefixSummaryRequest req;
      v1::PrefixSummary resp;
    };
    auto* call = new Call;
    call->ctx.set_deadline(In(2));
    Prepare(&call->ctx);
    control_->async()->GetPrefixSummary(&call->ctx, &call->req, &call->resp,
                                        [self = shared_from_this(), call](grpc::Status s) {
                                          if (s.ok() && call->resp.text_block_bytes() > 0) {
                                            std::vector<uint64_t> hashes(
                                                call->resp.block_hashes().begin(),
                                                call->resp.block_hashes().end());
                                            // Most recent first: insert each as a chain of one.
                                            for (auto it = hashes.rbegin(); it != hashes.rend();
                                                 ++it) {
                                              self->prefixes_.Insert({*it});
                                            }
                                          }
                                          delete call;
                                        });
  }
  UpdateBreakerGauge();
}

void WorkerHandle::UpdateBreakerGauge() { series_->circuit_open->Set(breaker_.open() ? 1 : 0); }

WorkerRegistry::WorkerRegistry(const RegistryOptions& options, RouterMetrics* metrics)
    : options_(options), metrics_(metrics) {}

WorkerRegistry::~WorkerRegistry() { Stop(); }

void WorkerRegistry::Start() {
  Discover();
  thread_ = std::thread([this] { Loop(); });
}

void WorkerRegistry::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // Wait (briefly) for polls still in flight: their callbacks touch the handles.
  for (int i = 0; i < 100; ++i) {
    bool busy = false;
    for (const WorkerPtr& w : Snapshot()) busy |= w->poll_in_flight.load();
    if (!busy) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<WorkerPtr> WorkerRegistry::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_;
}

int WorkerRegistry::HealthyCount() const {
  int n = 0;
  for (const WorkerPtr& w : Snapshot()) n += w->healthy() ? 1 : 0;
  return n;
}

std::vector<std::string> WorkerRegistry::Resolve() const {
  std::vector<std::string> out;
  const size_t colon = options_.dns.rfind(':');
  if (colon == std::string::npos) return out;
  const std::string host = options_.dns.substr(0, colon);
  const std::string port = options_.dns.substr(colon + 1);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &result) != 0) return out;
  std::set<std::string> seen;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    char ip[INET6_ADDRSTRLEN] = {0};
    if (ai->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_addr, ip, sizeof ip);
      seen.insert(absl::StrCat(ip, ":", port));
    } else if (ai->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ai->ai_addr)->sin6_addr, ip,
                sizeof ip);
      seen.insert(absl::StrCat("[", ip, "]:", port));
    }
  }
  freeaddrinfo(result);
  out.assign(seen.begin(), seen.end());
  return out;
}

void WorkerRegistry::Discover() {
  std::vector<std::string> wanted = options_.static_workers;
  if (!options_.dns.empty()) {
    std::vector<std::string> resolved = Resolve();
    if (resolved.empty()) {
      TS_LOG(WARNING) << "DNS: " << options_.dns << " resolves to nothing; keeping the last set";
      std::lock_guard<std::mutex> lock(mu_);
      for (const WorkerPtr& w : workers_) wanted.push_back(w->address());
    } else {
      wanted.insert(wanted.end(), resolved.begin(), resolved.end());
    }
  }
  std::sort(wanted.begin(), wanted.end());
  wanted.erase(std::unique(wanted.begin(), wanted.end()), wanted.end());

  std::lock_guard<std::mutex> lock(mu_);
  std::vector<WorkerPtr> next;
  for (const std::string& address : wanted) {
    auto it = std::find_if(workers_.begin(), workers_.end(),
                           [&](const WorkerPtr& w) { return w->address() == address; });
    if (it != workers_.end()) {
      next.push_back(*it);
    } else {
      TS_LOG(INFO) << "worker " << address << " added";
      next.push_back(
          std::make_shared<WorkerHandle>(address, options_, metrics_->AddWorker(address)));
    }
  }
  for (const WorkerPtr& w : workers_) {
    if (std::find(next.begin(), next.end(), w) == next.end()) {
      TS_LOG(INFO) << "worker " << w->address() << " removed";
      w->removed.store(true);
      metrics_->RemoveWorker(w->address());
    }
  }
  workers_ = std::move(next);
  metrics_->workers().Set(static_cast<double>(workers_.size()));
}

void WorkerRegistry::Poll(const WorkerPtr& worker) {
  if (worker->poll_in_flight.exchange(true)) return;  // the previous poll is still out
  struct PollState {
    WorkerPtr worker;
    grpc::ClientContext health_ctx, load_ctx;
    grpc::ByteBuffer health_req, health_resp;
    v1::GetLoadRequest load_req;
    v1::LoadReport load_resp;
    std::atomic<int> pending{2};
    bool serving = false, load_ok = false;
    void Done() {
      if (--pending > 0) return;
      worker->SetHealth(serving, load_ok, load_resp);
      worker->poll_in_flight.store(false);
      delete this;
    }
  };
  auto* p = new PollState;
  p->worker = worker;
  p->health_ctx.set_deadline(In(options_.health_timeout_seconds));
  p->load_ctx.set_deadline(In(options_.health_timeout_seconds));
  worker->Prepare(&p->load_ctx);
  p->health_req = HealthRequest("readiness");
  worker->generic().UnaryCall(&p->health_ctx, "/grpc.health.v1.Health/Check",
                              grpc::StubOptions(), &p->health_req, &p->health_resp,
                              [p](grpc::Status s) {
                                p->serving = s.ok() && IsServing(p->health_resp);
                                p->Done();
                              });
  worker->control().async()->GetLoad(&p->load_ctx, &p->load_req, &p->load_resp,
                                     [p](grpc::Status s) {
                                       p->load_ok = s.ok();
                                       p->worker->NotePollStatus(s);
                                       p->Done();
                                     });
}

void WorkerRegistry::ChooseModel(const std::vector<WorkerPtr>& workers) {
  std::map<std::string, int> votes;
  for (const WorkerPtr& w : workers) {
    if (!w->up()) continue;
    if (std::string model = w->model(); !model.empty()) ++votes[model];
  }
  std::string chosen;
  {
    std::lock_guard<std::mutex> lock(mu_);
    chosen = cluster_model_;  // kept while no worker is up
    // The most votes; a tie goes to the smallest identity, so that routers seeing the same
    // workers choose alike.
    int best = 0;
    for (const auto& [model, n] : votes) {
      if (n > best) best = n, chosen = model;
    }
    if (chosen != cluster_model_) {
      TS_LOG(INFO) << "routing to workers of model " << chosen << " (" << best << " of "
                   << workers.size() << " workers)"
                   << (cluster_model_.empty() ? "" : absl::StrCat("; was ", cluster_model_));
      cluster_model_ = chosen;
    }
  }
  // Every round: workers added since the last choice learn it too.
  for (const WorkerPtr& w : workers) w->SetClusterModel(chosen);
}

void WorkerRegistry::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    const double now = NowSeconds();
    if (!options_.dns.empty() && now >= next_dns_) {
      Discover();
      next_dns_ = now + options_.dns_interval_seconds;
    }
    int healthy = 0;
    const std::vector<WorkerPtr> workers = Snapshot();
    ChooseModel(workers);  // from the reports of the rounds before
    for (const WorkerPtr& w : workers) {
      Poll(w);
      w->UpdateBreakerGauge();
      healthy += w->healthy() ? 1 : 0;
    }
    if (healthy != last_healthy_ && on_health_change_) on_health_change_(healthy);
    last_healthy_ = healthy;
    if (on_poll_round_) on_poll_round_(workers);
    lock.lock();
    cv_.wait_for(lock, std::chrono::microseconds(
                           static_cast<int64_t>(options_.health_interval_seconds * 1e6)));
  }
}

}  // namespace tinyserve
