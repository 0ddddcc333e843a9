// File: worker/server/tls_terminator.h
// HTTPS for the OpenAI-compatible HTTP API. Debian's civetweb cannot serve TLS with OpenSSL 3
// (it loads libssl at run time and looks for SSL_get_peer_certificate, which OpenSSL 3 no longer
// exports), so TLS ends here: a listener on the public port does the handshake with OpenSSL and
// relays each connection's plaintext to civetweb on a loopback port. One thread per connection
// (civetweb holds one per connection too); the certificate files are checked for a renewal every
// reload_seconds and new connections use the new pair. A handshake has 10 s in all, and
// handshakes and established connections have separate limits, so stalled handshakes cannot
// starve working clients. Limits: a client that half-closes after its request gets no answer
// (as with the plaintext API); bytes from the client are forwarded with blocking writes, so a
// client pipelining megabytes while its answer streams can stall its own connection (30 s).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace tinyserve {

struct TlsTerminatorOptions {
  std::string host;           // the public address
  int port = 0;               // 0: an ephemeral port
  std::string cert_file;      // PEM certificate chain
  std::string key_file;       // its PEM private key
  int inner_port = 0;         // civetweb's plaintext port on 127.0.0.1
  int max_connections = 256;  // established connections (handshakes: 4 x); more are closed
  int reload_seconds = 60;    // how often the files are checked for a renewal
};

class TlsTerminator {
 public:
  // INVALID_ARGUMENT naming --http-tls-cert or --http-tls-key for files OpenSSL cannot use;
  // UNAVAILABLE when the port cannot be bound.
  static absl::StatusOr<std::unique_ptr<TlsTerminator>> Start(const TlsTerminatorOptions& options);
  ~TlsTerminator();  // stops accepting, closes the open connections and waits for them

  int port() const { return port_; }

 private:
  explicit TlsTerminator(const TlsTerminatorOptions& options) : options_(options) {}
  void AcceptLoop();
  void Relay(int client);
  std::shared_ptr<SSL_CTX> Context();  // the current pair, reloaded when the files changed

  TlsTerminatorOptions options_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> open_{0};        // connections accepted and not yet closed
  std::atomic<int> handshakes_{0};  // of which still in their handshake
  std::mutex mu_;
  std::shared_ptr<SSL_CTX> ctx_;  // GUARDED_BY(mu_)
  int64_t files_stamp_ = 0;       // GUARDED_BY(mu_): the files' mtimes when ctx_ was made
  double next_check_ = 0;         // GUARDED_BY(mu_)
  std::set<int> clients_;         // GUARDED_BY(mu_): sockets of the connections relayed
  std::thread acceptor_;
};

}  // namespace tinyserve
