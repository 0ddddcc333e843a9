#include "worker/tp/gloo_communicator.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <exception>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/broadcast.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "worker/tp/tcp_store.h"

namespace tinyserve {
namespace {

// Gloo's Store interface over our TCP store. Gloo expects exceptions; errors become
// gloo::IoException, which the communicator turns back into a Status.
class GlooStore : public gloo::rendezvous::Store {
 public:
  GlooStore(TcpStoreClient* client, double timeout_s) : client_(client), timeout_s_(timeout_s) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    const absl::Status s = client_->Set(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(std::string(s.message()));
  }

  std::vector<char> get(const std::string& key) override {
    absl::StatusOr<std::string> v = client_->Get(key, timeout_s_);
    if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, std::chrono::milliseconds(static_cast<int64_t>(timeout_s_ * 1000)));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const double t = timeout.count() > 0 ? timeout.count() / 1000.0 : timeout_s_;
    for (const auto& k : keys) {
      absl::StatusOr<std::string> v = client_->Get(k, t);
      if (!v.ok()) throw gloo::IoException(std::string(v.status().message()));
    }
  }

 private:
  TcpStoreClient* client_;
  double timeout_s_;
};

// The local address other ranks can reach us on: the source address of a route to rank 0's
// host (a UDP "connect" sends nothing). Loopback when rank 0 is local.
std::string LocalAddressToward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.empty() ? "127.0.0.1" : host.c_str(), "9", &hints, &res) != 0 ||
      res == nullptr)
    return "127.0.0.1";
  std::string out = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
    sockaddr_in me{};
    socklen_t len = sizeof(me);
    char buf[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0 &&
        inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf)) != nullptr &&
        me.sin_addr.s_addr != htonl(INADDR_ANY))
      out = buf;
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(res);
  return out;
}

absl::Status FromGlooError(const char* what, const std::exception& e) {
  const std::string msg = absl::StrCat("gloo ", what, ": ", e.what());
  if (absl::StrContains(e.what(), "imed out") || absl::StrContains(e.what(), "imeout"))
    return absl::DeadlineExceededError(msg);
  return absl::UnavailableError(msg);
}

class GlooCommunicator : public Communicator {
 public:
  GlooCommunicator(int rank, int world, double timeout_s, double startup_timeout_s,
                   std::unique_ptr<TcpStoreServer> server, std::unique_ptr<TcpStoreClient> client,
                   std::shared_ptr<gloo::rendezvous::Context> context)
      : rank_(rank),
        world_(world),
        timeout_(Millis(startup_timeout_s)),
        steady_timeout_(Millis(timeout_s)),
        server_(std::move(server)),
        client_(std::move(client)),
        context_(std::move(context)) {}

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }

  absl::Status AllReduceSum(float* data, size_t n) override {
    if (world_ == 1 || n == 0) return broken_;
    return Run("all-reduce", [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, n);  // in place: the output is also the input
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    if (root < 0 || root >= world_)
      return absl::InvalidArgumentError(absl::StrCat("broadcast root ", root));
    if (world_ == 1 || bytes == 0) return broken_;
    return Run("broadcast", [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(static_cast<uint8_t*>(data), bytes);
      opts.setRoot(root);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  absl::Status Barrier() override {
    if (world_ == 1) return broken_;
    return Run("barrier", [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(NextTag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

  void StartupDone() override { timeout_ = steady_timeout_; }

  static std::chrono::milliseconds Millis(double seconds) {
    return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }

 private:
  // Tags keep successive operations apart on the wire; every rank counts the same.
  uint32_t NextTag() { return tag_++ & 0x7fffffffu; }

  template <typename F>
  absl::Status Run(const char* what, F&& f) {
    if (!broken_.ok()) return broken_;
    try {
      f();
      return absl::OkStatus();
    } catch (const std::exception& e) {
      broken_ = FromGlooError(what, e);
      TS_LOG(ERROR) << "rank " << rank_ << ": " << broken_;
      return broken_;
    }
  }

  int rank_, world_;
  std::chrono::milliseconds timeout_;  // the start-up one until StartupDone()
  const std::chrono::milliseconds steady_timeout_;
  uint32_t tag_ = 0;
  absl::Status broken_;
  std::unique_ptr<TcpStoreServer> server_;
  std::unique_ptr<TcpStoreClient> client_;
  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    int rank, int world, const std::string& rendezvous_addr, double timeout_s,
    std::unique_ptr<TcpStoreServer> server, double startup_timeout_s) {
  if (world < 1 || rank < 0 || rank >= world)
    return absl::InvalidArgumentError(absl::StrCat("bad rank ", rank, " of ", world));
  if (!(timeout_s > 0)) return absl::InvalidArgumentError("timeout must be > 0");
  if (startup_timeout_s == 0) startup_timeout_s = timeout_s;
  if (!(startup_timeout_s > 0)) return absl::InvalidArgumentError("start-up timeout must be > 0");
  if (world == 1) return MakeSingleProcessCommunicator();
  std::string host;
  int port = 0;
  TS_RETURN_IF_ERROR(ParseHostPort(rendezvous_addr, &host, &port));
  if (rank == 0 && server == nullptr) {
    if (port == 0)
      return absl::InvalidArgumentError("rank 0 needs a rendezvous port (or a started store)");
    TS_ASSIGN_OR_RETURN(server, TcpStoreServer::Listen(host, port));
  }
  if (rank == 0) port = server->port();
  const std::string connect_host =
      host.empty() || host == "0.0.0.0" || host == "::" ? "127.0.0.1" : host;
  TS_ASSIGN_OR_RETURN(auto client, TcpStoreClient::Connect(connect_host, port, startup_timeout_s));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = LocalAddressToward(connect_host);
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
    context->setTimeout(GlooCommunicator::Millis(startup_timeout_s));
    GlooStore store(client.get(), startup_timeout_s);
    gloo::rendezvous::PrefixStore prefixed("tinyserve-gloo", store);
    context->connectFullMesh(prefixed, device);
    auto comm = std::make_unique<GlooCommunicator>(rank, world, timeout_s, startup_timeout_s,
                                                   std::move(server), std::move(client),
                                                   std::move(context));
    // Everyone is connected once a barrier passes; after it rank 0's store may go away.
    TS_RETURN_IF_ERROR(comm->Barrier());
    return std::unique_ptr<Communicator>(std::move(comm));
  } catch (const std::exception& e) {
    return FromGlooError(absl::StrCat("rendezvous (rank ", rank, " of ", world, ")").c_str(), e);
  }
}

}  // namespace tinyserve
