// Flags the worker and router commands share: the API key, TLS and the plaintext health port.
#include <cstdlib>

#include "common/flags.h"
#include "services/tinyserve/commands.h"
#include "worker/server/rpc_security.h"

namespace tinyserve {

void RegisterServerSecurityFlags(FlagSet* f, std::string* api_key, ServerTls* tls,
                                 int* health_port) {
  if (const char* key = std::getenv("TINYSERVE_API_KEY")) *api_key = key;
  f->String("api-key", api_key,
            "bearer token every gRPC call and HTTP request needs, except health checks, "
            "/health, /version and /metrics (default: $TINYSERVE_API_KEY; empty: none)");
  f->String("tls-cert", &tls->cert_file, "serve gRPC over TLS with this PEM certificate chain");
  f->String("tls-key", &tls->key_file, "the PEM private key of --tls-cert");
  f->String("tls-client-ca", &tls->client_ca_file,
            "mutual TLS: require client certificates signed by this PEM CA bundle");
  f->Int("tls-reload", &tls->reload_seconds,
         "seconds between checks of the TLS files for a renewed certificate");
  f->Int("health-port", health_port,
         "plaintext gRPC port serving grpc.health.v1 only, for probes that cannot speak TLS "
         "(0: off)");
}

}  // namespace tinyserve
