// File: worker/server/rpc_security.h
// Transport security and API keys for the gRPC servers (worker, router) and their clients
// (the router's calls to workers, `tinyserve generate --server`):
//   - ServerTls: the server's certificate chain and key (TLS); with a client CA, mutual TLS
//     (every client must present a certificate that CA signed);
//   - ClientTls: the CA that verifies the server, optionally a client certificate (for mutual
//     TLS) and the name expected in the server's certificate when it is not the dialled host;
//   - an API key: "authorization: Bearer KEY" call metadata, the header the HTTP API checks.
// Certificate files are watched (re-read every reload_seconds), so a renewed certificate
// (cert-manager rewriting a mounted Secret) is served without a restart. They are also read and
// checked once at start-up, so a wrong path, a file without PEM, or a key that does not belong
// to its certificate is an error naming the flag rather than a failed handshake later.
// A plaintext health server (grpc.health.v1 only) serves probes that cannot speak TLS, as
// Kubernetes' native gRPC probes cannot.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace tinyserve {

struct ServerTls {
  std::string cert_file;       // PEM certificate chain; empty: plaintext
  std::string key_file;        // PEM private key of cert_file
  std::string client_ca_file;  // non-empty: require client certificates signed by these CAs
  int reload_seconds = 60;     // how often the files are checked for a renewal
  bool enabled() const { return !cert_file.empty() || !key_file.empty(); }
};

struct ClientTls {
  std::string ca_file;      // PEM CA bundle verifying the server; empty: plaintext
  std::string cert_file;    // client certificate chain for mutual TLS (optional)
  std::string key_file;     // its private key
  std::string server_name;  // expected name in the server certificate (default: dialled host)
  int reload_seconds = 60;
  bool enabled() const { return !ca_file.empty(); }
};

// Insecure credentials when tls is not enabled. Errors (INVALID_ARGUMENT) name the flag:
// --tls-cert, --tls-key, --tls-client-ca.
// A certificate and key pair: both given, both PEM, unexpired, and the key belongs to the
// certificate; errors name the flags.
absl::Status CheckKeyPair(absl::string_view cert_flag, const std::string& cert_file,
                          absl::string_view key_flag, const std::string& key_file);
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls);

// Insecure credentials when tls is not enabled. Errors name the flag as flag_prefix + "ca",
// "cert" or "key" (flag_prefix "--tls-" or "--worker-tls-").
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTls& tls, absl::string_view flag_prefix);
// Adds the channel arguments tls needs (the server name override).
void ApplyClientTls(const ClientTls& tls, grpc::ChannelArguments* args);

// OK when api_key is empty or the call carries "authorization: Bearer <api_key>"; otherwise
// UNAUTHENTICATED. Compares in constant time.
grpc::Status CheckApiKey(const grpc::ServerContextBase& context, const std::string& api_key);
// Adds "authorization: Bearer <api_key>" to a call (nothing when api_key is empty).
void AttachApiKey(const std::string& api_key, grpc::ClientContext* context);
// Equality whose time shows neither where the strings differ nor whether their lengths do (it
// compares SHA-256 digests in constant time).
bool SameSecret(std::string_view a, std::string_view b);

// A plaintext gRPC server on host:port that serves grpc.health.v1 only; its statuses are set
// with SetHealth beside the main server's. port 0: none (nullptr).
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(const std::string& host, int port);
// Sets `service`'s status on each non-null server's health service.
void SetHealth(std::initializer_list<grpc::Server*> servers, const std::string& service,
               bool serving);

}  // namespace tinyserve
