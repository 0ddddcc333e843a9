#include "worker/server/tls_terminator.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/socket_io.h"
#include "common/timer.h"
#include "worker/server/rpc_security.h"

namespace tinyserve {
namespace {

constexpr int kHandshakeTimeoutMs = 10000;
constexpr int kStallTimeoutMs = 30000;  // a peer that takes no bytes for this long is dropped

std::string OpenSslError() {
  char buf[256] = "";
  ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
  return buf;
}

// A server context for the pair, TLS 1.2 and later.
absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeContext(const std::string& cert,
                                                     const std::string& key) {
  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new: " + OpenSslError());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx.get(), key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx.get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-tls-cert/--http-tls-key: ", OpenSslError()));
  }
  return ctx;
}

int64_t Stamp(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec +
         static_cast<int64_t>(st.st_size);
}

bool WaitFor(int fd, short events, int timeout_ms) {
  pollfd p{fd, events, 0};
  return poll(&p, 1, timeout_ms) > 0;
}

// SSL_write of all of data on a non-blocking socket.
bool SslWriteAll(SSL* ssl, int fd, const char* data, int size) {
  while (size > 0) {
    const int n = SSL_write(ssl, data, size);
    if (n > 0) {
      data += n;
      size -= n;
      continue;
    }
    const int err = SSL_get_error(ssl, n);
    if (err == SSL_ERROR_WANT_WRITE && WaitFor(fd, POLLOUT, kStallTimeoutMs)) continue;
    if (err == SSL_ERROR_WANT_READ && WaitFor(fd, POLLIN, kStallTimeoutMs)) continue;
    return false;
  }
  return true;
}

void SetTimeouts(int fd, int ms) {
  const timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TlsTerminator>> TlsTerminator::Start(
    const TlsTerminatorOptions& options) {
  if (absl::Status s =
          CheckKeyPair("--http-tls-cert", options.cert_file, "--http-tls-key", options.key_file);
      !s.ok()) {
    return s;
  }
  std::unique_ptr<TlsTerminator> t(new TlsTerminator(options));
  auto ctx = MakeContext(options.cert_file, options.key_file);
  if (!ctx.ok()) return ctx.status();
  t->ctx_ = *std::move(ctx);
  t->files_stamp_ = Stamp(options.cert_file) + Stamp(options.key_file);
  t->next_check_ = NowSeconds() + options.reload_seconds;

  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string where = absl::StrCat(options.host, ":", options.port);
  const int rc = getaddrinfo(options.host.empty() ? nullptr : options.host.c_str(),
                             std::to_string(options.port).c_str(), &hints, &found);
  if (rc != 0)
    return absl::UnavailableError(absl::StrCat("HTTPS on ", where, ": ", gai_strerror(rc)));
  std::string error = "no address";
  for (const addrinfo* a = found; a != nullptr && t->listen_fd_ < 0; a = a->ai_next) {
    const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0) {
      t->listen_fd_ = fd;
    } else {
      error = std::strerror(errno);
      close(fd);
    }
  }
  freeaddrinfo(found);
  if (t->listen_fd_ < 0)
    return absl::UnavailableError(absl::StrCat("HTTPS on ", where, ": ", error));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  getsockname(t->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len);
  t->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                               : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  t->acceptor_ = std::thread([p = t.get()] { p->AcceptLoop(); });
  return t;
}

TlsTerminator::~TlsTerminator() {
  stop_ = true;
  if (acceptor_.joinable()) acceptor_.join();
  if (listen_fd_ >= 0) close(listen_fd_);
  {  // wakes relays blocked in a handshake or a write; the others see stop_ within 500 ms
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : clients_) shutdown(fd, SHUT_RDWR);
  }
  while (open_.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

std::shared_ptr<SSL_CTX> TlsTerminator::Context() {
  std::lock_guard<std::mutex> lock(mu_);
  if (NowSeconds() >= next_check_) {
    next_check_ = NowSeconds() + options_.reload_seconds;
    const int64_t stamp = Stamp(options_.cert_file) + Stamp(options_.key_file);
    if (stamp != files_stamp_) {
      auto ctx = MakeContext(options_.cert_file, options_.key_file);
      if (ctx.ok()) {
        ctx_ = *std::move(ctx);
        files_stamp_ = stamp;
        TS_LOG(INFO) << "HTTPS: loaded the renewed certificate " << options_.cert_file;
      } else {  // a half-written renewal: keep serving the old pair, look again later
        TS_LOG(WARNING) << "HTTPS: " << ctx.status().message() << "; keeping the old certificate";
      }
    }
  }
  return ctx_;
}

void TlsTerminator::AcceptLoop() {
  while (!stop_) {
    if (!WaitFor(listen_fd_, POLLIN, 200)) continue;
    const int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (client < 0) {
      // Out of descriptors (EMFILE) or memory: the connection stays queued; back off rather
      // than spin on a listener that stays readable.
      if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    // Handshakes and relays have separate limits, so clients that connect and stall their
    // handshake (slowloris) cannot take the slots of working connections; a handshake has
    // kHandshakeTimeoutMs in all.
    if (handshakes_.load() >= options_.max_connections * 4 ||
        open_.load() - handshakes_.load() >= options_.max_connections) {
      close(client);
      continue;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);  // before the thread: the destructor wakes it
      clients_.insert(client);
    }
    ++open_;
    ++handshakes_;
    std::thread([this, client] {
      Relay(client);
      --open_;
    }).detach();
  }
}

void TlsTerminator::Relay(int client) {
  std::shared_ptr<SSL_CTX> ctx = Context();
  SSL* ssl = SSL_new(ctx.get());
  int plain = -1;
  auto done = [&] {
    if (ssl != nullptr) {
      SSL_shutdown(ssl);  // best effort: a close_notify
      SSL_free(ssl);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);  // before close: the number may be reused
      clients_.erase(client);
    }
    close(client);
    if (plain >= 0) close(plain);
  };
  // The handshake on the non-blocking socket, with one deadline for all of it.
  bool shaken = false;
  if (ssl != nullptr && SSL_set_fd(ssl, client) == 1) {
    const double deadline = NowSeconds() + kHandshakeTimeoutMs / 1000.0;
    while (!stop_) {
      const int r = SSL_accept(ssl);
      if (r == 1) {
        shaken = true;
        break;
      }
      const int err = SSL_get_error(ssl, r);
      const int left = static_cast<int>((deadline - NowSeconds()) * 1000);
      if ((err != SSL_ERROR_WANT_READ && err != SSL_ERROR_WANT_WRITE) || left <= 0) break;
      // Slices of 500 ms, so stop_ is seen; the loop asks OpenSSL again either way.
      WaitFor(client, err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, std::min(left, 500));
    }
  }
  --handshakes_;
  if (!shaken) {
    ERR_clear_error();
    return done();
  }
  plain = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in inner{};
  inner.sin_family = AF_INET;
  inner.sin_port = htons(static_cast<uint16_t>(options_.inner_port));
  inner.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (plain < 0 || connect(plain, reinterpret_cast<sockaddr*>(&inner), sizeof(inner)) != 0) {
    return done();
  }
  const int one = 1;  // server-sent events go out token by token
  setsockopt(client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(plain, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  SetTimeouts(plain, kStallTimeoutMs);
  char buf[16384];
  while (!stop_) {
    // Client to civetweb: everything OpenSSL can decrypt now.
    for (;;) {
      const int n = SSL_read(ssl, buf, sizeof(buf));
      if (n > 0) {
        if (!SendAll(plain, buf, static_cast<size_t>(n))) return done();
        continue;
      }
      const int err = SSL_get_error(ssl, n);
      if (err == SSL_ERROR_WANT_READ) break;
      if (err == SSL_ERROR_WANT_WRITE && WaitFor(client, POLLOUT, kStallTimeoutMs)) continue;
      ERR_clear_error();
      return done();  // the client closed (close_notify or EOF) or failed
    }
    pollfd fds[2] = {{client, POLLIN, 0}, {plain, POLLIN, 0}};
    if (poll(fds, 2, 500) <= 0) continue;  // also a moment to look at stop_
    if (fds[1].revents != 0) {             // civetweb to client
      const ssize_t n = recv(plain, buf, sizeof(buf), 0);
      if (n <= 0) return done();  // civetweb closed the connection
      if (!SslWriteAll(ssl, client, buf, static_cast<int>(n))) return done();
    }
  }
  done();
}

}  // namespace tinyserve
