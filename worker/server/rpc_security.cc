#include "worker/server/rpc_security.h"

#include <openssl/bio.h>
#include <openssl/crypto.h>
#include <openssl/pem.h>
#include <openssl/sha.h>
#include <openssl/x509.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/socket_io.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace tinyserve {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

absl::StatusOr<std::string> ReadPem(absl::string_view flag, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": cannot read '", path, "': ", std::strerror(errno)));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

struct BioDeleter {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

std::unique_ptr<BIO, BioDeleter> Bio(const std::string& pem) {
  return std::unique_ptr<BIO, BioDeleter>(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

// The first certificate of a PEM file; errors name the flag and say what is wrong.
absl::StatusOr<X509Ptr> FirstCertificate(absl::string_view flag, const std::string& path) {
  absl::StatusOr<std::string> pem = ReadPem(flag, path);
  if (!pem.ok()) return pem.status();
  X509Ptr cert(PEM_read_bio_X509(Bio(*pem).get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": '", path, "' holds no PEM certificate"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, ": the certificate in '", path, "' has expired"));
  }
  return cert;
}

}  // namespace

// Checks a certificate and key pair: both given, both PEM, and the key belongs to the
// certificate.
absl::Status CheckKeyPair(absl::string_view cert_flag, const std::string& cert_file,
                          absl::string_view key_flag, const std::string& key_file) {
  if (cert_file.empty() != key_file.empty()) {
    return absl::InvalidArgumentError(
        cert_file.empty() ? absl::StrCat(key_flag, ": needs ", cert_flag, " as well")
                          : absl::StrCat(cert_flag, ": needs ", key_flag, " as well"));
  }
  absl::StatusOr<X509Ptr> cert = FirstCertificate(cert_flag, cert_file);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> pem = ReadPem(key_flag, key_file);
  if (!pem.ok()) return pem.status();
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(Bio(*pem).get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        key_flag, ": '", key_file, "' holds no PEM private key (or it is password-protected)"));
  }
  if (X509_check_private_key(cert->get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(key_flag, ": the key in '", key_file,
                                                   "' does not belong to the certificate in ",
                                                   cert_flag));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const ServerTls& tls) {
  if (!tls.enabled()) {
    if (!tls.client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls-client-ca: needs --tls-cert and --tls-key");
    }
    return grpc::InsecureServerCredentials();
  }
  if (absl::Status s = CheckKeyPair("--tls-cert", tls.cert_file, "--tls-key", tls.key_file);
      !s.ok()) {
    return s;
  }
  const bool mutual = !tls.client_ca_file.empty();
  if (mutual) {
    if (absl::StatusOr<X509Ptr> ca = FirstCertificate("--tls-client-ca", tls.client_ca_file);
        !ca.ok()) {
      return ca.status();
    }
  }
  auto provider = std::make_shared<FileWatcherCertificateProvider>(
      tls.key_file, tls.cert_file, tls.client_ca_file, tls.reload_seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (mutual) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeChannelCredentials(
    const ClientTls& tls, absl::string_view flag_prefix) {
  const std::string ca_flag = absl::StrCat(flag_prefix, "ca");
  const std::string cert_flag = absl::StrCat(flag_prefix, "cert");
  const std::string key_flag = absl::StrCat(flag_prefix, "key");
  if (!tls.enabled()) {
    if (!tls.cert_file.empty() || !tls.key_file.empty() || !tls.server_name.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(ca_flag,
                       ": TLS options were given without the CA that verifies the "
                       "server"));
    }
    return grpc::InsecureChannelCredentials();
  }
  if (absl::StatusOr<X509Ptr> ca = FirstCertificate(ca_flag, tls.ca_file); !ca.ok()) {
    return ca.status();
  }
  const bool identity = !tls.cert_file.empty() || !tls.key_file.empty();
  if (identity) {
    if (absl::Status s = CheckKeyPair(cert_flag, tls.cert_file, key_flag, tls.key_file); !s.ok()) {
      return s;
    }
  }
  auto provider = std::make_shared<FileWatcherCertificateProvider>(
      identity ? tls.key_file : "", identity ? tls.cert_file : "", tls.ca_file, tls.reload_seconds);
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (identity) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  return grpc::experimental::TlsCredentials(options);
}

void ApplyClientTls(const ClientTls& tls, grpc::ChannelArguments* args) {
  if (tls.enabled() && !tls.server_name.empty()) {
    args->SetSslTargetNameOverride(tls.server_name);
  }
}

bool SameSecret(std::string_view a, std::string_view b) {
  // Digests of equal length, compared without an early exit: neither where the strings first
  // differ nor whether their lengths do shows in the time taken.
  unsigned char da[SHA256_DIGEST_LENGTH], db[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(a.data()), a.size(), da);
  SHA256(reinterpret_cast<const unsigned char*>(b.data()), b.size(), db);
  return CRYPTO_memcmp(da, db, sizeof(da)) == 0;
}

grpc::Status CheckApiKey(const grpc::ServerContextBase& context, const std::string& api_key) {
  if (api_key.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "an API key is required (metadata authorization: Bearer <key>)");
  }
  const std::string_view given(it->second.data(), it->second.size());
  if (!SameSecret(given, absl::StrCat("Bearer ", api_key))) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "the API key is not valid");
  }
  return grpc::Status::OK;
}

void AttachApiKey(const std::string& api_key, grpc::ClientContext* context) {
  if (!api_key.empty()) context->AddMetadata("authorization", absl::StrCat("Bearer ", api_key));
}

absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealthServer(const std::string& host, int port) {
  if (port <= 0) return std::unique_ptr<grpc::Server>();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  const std::string address = JoinHostPort(host, port);
  int bound = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &bound);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve health on ", address));
  }
  return server;
}

void SetHealth(std::initializer_list<grpc::Server*> servers, const std::string& service,
               bool serving) {
  for (grpc::Server* s : servers) {
    if (s != nullptr) s->GetHealthCheckService()->SetServingStatus(service, serving);
  }
}

}  // namespace tinyserve
