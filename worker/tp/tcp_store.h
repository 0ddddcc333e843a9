// File: worker/tp/tcp_store.h
// A tiny key-value store over TCP for the rendezvous of a tensor-parallel group.
//
// Rank 0 runs a TcpStoreServer on the rendezvous address (host:port); every rank, rank 0
// included, talks to it through a TcpStoreClient: Set(key, value) and Get(key, timeout), which
// waits until some rank has set the key. Gloo's rendezvous::Store and the NCCL unique id both go
// through it (gloo_communicator.cc, nccl_communicator.cc). Values are opaque bytes.
//
// Wire format (all integers little-endian u32): request = op (1 byte) | key length | key |
// [value length | value]; ops: 'S' set (reply 1 byte), 'G' get (reply 1 byte found, then
// length | value when found). Get does not block on the server: the client polls until its
// deadline, so a dead rank 0 or a rank that never sets its key ends in DeadlineExceeded.
//
// Threading: the server runs an accept thread and one thread per connection; the destructor
// stops them. A client is used by one thread at a time.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tinyserve {

// Splits "host:port" (the host may be empty: 0.0.0.0 for a server, 127.0.0.1 for a client).
absl::Status ParseHostPort(const std::string& address, std::string* host, int* port);

class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free port; see port()).
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Listen(const std::string& host,
                                                               int port);
  ~TcpStoreServer();
  int port() const { return port_; }

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void Serve(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;
  std::mutex mu_;
  std::map<std::string, std::string> data_;  // GUARDED_BY(mu_)
  std::vector<int> conn_fds_;                // GUARDED_BY(mu_)
  std::vector<std::thread> conn_threads_;    // GUARDED_BY(mu_)
};

class TcpStoreClient {
 public:
  // Connects to host:port, retrying until timeout_s (rank 0 may not be listening yet).
  static absl::StatusOr<std::unique_ptr<TcpStoreClient>> Connect(const std::string& host,
                                                                int port, double timeout_s);
  ~TcpStoreClient();

  absl::Status Set(const std::string& key, const std::string& value);
  // Waits until the key is set; DeadlineExceeded after timeout_s.
  absl::StatusOr<std::string> Get(const std::string& key, double timeout_s);
  // True when the key is set (no waiting).
  absl::StatusOr<bool> Has(const std::string& key);

 private:
  explicit TcpStoreClient(int fd) : fd_(fd) {}
  absl::StatusOr<std::pair<bool, std::string>> TryGet(const std::string& key);
  int fd_;
};

}  // namespace tinyserve
