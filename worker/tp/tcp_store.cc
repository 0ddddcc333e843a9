#include "worker/tp/tcp_store.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/socket_io.h"
#include "common/status.h"
#include "common/timer.h"

namespace tinyserve {
namespace {

bool RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t k = recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

bool SendString(int fd, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  return SendAll(fd, &n, 4) && SendAll(fd, s.data(), s.size());
}

constexpr uint32_t kMaxField = 64u << 20;

bool RecvString(int fd, std::string* s) {
  uint32_t n = 0;
  if (!RecvAll(fd, &n, 4) || n > kMaxField) return false;
  s->resize(n);
  return RecvAll(fd, s->data(), n);
}

absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_s = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_s.c_str(), &hints, &res);
  if (rc != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  return res;
}

}  // namespace

absl::Status ParseHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), port) ||
      *port < 0 || *port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("rendezvous address '", address, "' is not host:port"));
  *host = address.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']')
    *host = host->substr(1, host->size() - 2);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Listen(const std::string& host,
                                                                      int port) {
  TS_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host.empty() ? "0.0.0.0" : host, port, true));
  std::unique_ptr<TcpStoreServer> s(new TcpStoreServer());
  std::string last_error = "no address";
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 64) == 0) {
      s->listen_fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  if (s->listen_fd_ < 0)
    return absl::UnavailableError(
        absl::StrCat("rendezvous store: cannot listen on ", host, ":", port, ": ", last_error));
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  s->port_ = addr.ss_family == AF_INET6
                 ? ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port)
                 : ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  s->accept_thread_ = std::thread([p = s.get()] { p->AcceptLoop(); });
  return s;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : conn_fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(conn_threads_);
  }
  for (auto& t : threads) t.join();
}

void TcpStoreServer::AcceptLoop() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      close(fd);
      break;
    }
    conn_fds_.push_back(fd);
    conn_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  for (;;) {
    char op = 0;
    std::string key, value;
    if (!RecvAll(fd, &op, 1) || !RecvString(fd, &key)) break;
    if (op == 'S') {
      if (!RecvString(fd, &value)) break;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_[key] = std::move(value);
      }
      const char ok = 1;
      if (!SendAll(fd, &ok, 1)) break;
    } else if (op == 'G') {
      bool found = false;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = data_.find(key);
        if (it != data_.end()) {
          found = true;
          value = it->second;
        }
      }
      const char f = found ? 1 : 0;
      if (!SendAll(fd, &f, 1) || (found && !SendString(fd, value))) break;
    } else {
      break;  // unknown op: drop the connection
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  // The fd stays in conn_fds_ until the destructor (shutdown on a closed fd is harmless only
  // if the number is not reused, so close here and forget it).
  for (auto it = conn_fds_.begin(); it != conn_fds_.end(); ++it)
    if (*it == fd) {
      conn_fds_.erase(it);
      break;
    }
  close(fd);
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TcpStoreClient>> TcpStoreClient::Connect(const std::string& host,
                                                                       int port,
                                                                       double timeout_s) {
  const double deadline = NowSeconds() + timeout_s;
  std::string last_error;
  for (;;) {
    TS_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host.empty() ? "127.0.0.1" : host, port, false));
    for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        freeaddrinfo(res);
        const int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        // A request answers at once; a silent server is a dead one.
        timeval tv{10, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        return std::unique_ptr<TcpStoreClient>(new TcpStoreClient(fd));
      }
      last_error = std::strerror(errno);
      close(fd);
    }
    freeaddrinfo(res);
    if (NowSeconds() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat("rendezvous store ", host, ":", port,
                                                  " not reachable within ", timeout_s,
                                                  " s: ", last_error));
}

TcpStoreClient::~TcpStoreClient() { close(fd_); }

absl::Status TcpStoreClient::Set(const std::string& key, const std::string& value) {
  const char op = 'S';
  char ok = 0;
  if (!SendAll(fd_, &op, 1) || !SendString(fd_, key) || !SendString(fd_, value) ||
      !RecvAll(fd_, &ok, 1))
    return absl::UnavailableError(absl::StrCat("rendezvous store: set '", key, "' failed"));
  return absl::OkStatus();
}

absl::StatusOr<std::pair<bool, std::string>> TcpStoreClient::TryGet(const std::string& key) {
  const char op = 'G';
  char found = 0;
  std::string value;
  if (!SendAll(fd_, &op, 1) || !SendString(fd_, key) || !RecvAll(fd_, &found, 1) ||
      (found != 0 && !RecvString(fd_, &value)))
    return absl::UnavailableError(absl::StrCat("rendezvous store: get '", key, "' failed"));
  return std::make_pair(found != 0, std::move(value));
}

absl::StatusOr<bool> TcpStoreClient::Has(const std::string& key) {
  TS_ASSIGN_OR_RETURN(auto r, TryGet(key));
  return r.first;
}

absl::StatusOr<std::string> TcpStoreClient::Get(const std::string& key, double timeout_s) {
  const double deadline = NowSeconds() + timeout_s;
  int sleep_ms = 1;
  for (;;) {
    TS_ASSIGN_OR_RETURN(auto r, TryGet(key));
    if (r.first) return std::move(r.second);
    if (NowSeconds() >= deadline)
      return absl::DeadlineExceededError(absl::StrCat(
          "rendezvous: key '", key, "' not set within ", timeout_s, " s (a rank missing?)"));
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    sleep_ms = std::min(sleep_ms * 2, 50);
  }
}

}  // namespace tinyserve
