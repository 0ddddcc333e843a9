// Flags the worker and router commands share: the API key, TLS, the plaintext health port and
// OpenTelemetry tracing.
#include <cstdlib>

#include "common/flags.h"
#include "services/tinyserve/commands.h"
#include "worker/server/rpc_security.h"
#include "worker/server/tracing.h"

namespace tinyserve {

void RegisterServerSecurityFlags(FlagSet* f, std::string* api_key, ServerTls* tls, int* health_port,
                                 ServerTls* http_tls) {
  if (const char* key = std::getenv("TINYSERVE_API_KEY")) *api_key = key;
  f->String("api-key", api_key,
            "bearer token every gRPC call and HTTP request needs, except health checks, "
            "/health, /version and /metrics (default: $TINYSERVE_API_KEY; empty: none)");
  f->String("tls-cert", &tls->cert_file, "serve gRPC over TLS with this PEM certificate chain");
  f->String("tls-key", &tls->key_file, "the PEM private key of --tls-cert");
  f->String("tls-client-ca", &tls->client_ca_file,
            "mutual TLS: require client certificates signed by this PEM CA bundle");
  f->Int("tls-reload", &tls->reload_seconds,
         "seconds between checks of the TLS files (gRPC's and HTTPS') for a renewed certificate");
  f->String("http-tls-cert", &http_tls->cert_file,
            "serve the OpenAI-compatible HTTP API over HTTPS with this PEM certificate chain");
  f->String("http-tls-key", &http_tls->key_file, "the PEM private key of --http-tls-cert");
  f->Int("health-port", health_port,
         "plaintext gRPC port serving grpc.health.v1 only, for probes that cannot speak TLS "
         "(0: off)");
}

void RegisterHttpApiFlags(FlagSet* f, std::string* tool_call_parser, std::string* reasoning_parser,
                          int* responses_store_mb) {
  f->String("tool-call-parser", tool_call_parser,
            "hermes or llama3_json: tool_choice \"auto\" parses the output's calls in that "
            "format (<tool_call> blocks; Llama 3's JSON objects) into tool calls (off: "
            "\"auto\" is refused)");
  f->String("reasoning-parser", reasoning_parser,
            "qwen3 or deepseek_r1: a chat answer's <think> block becomes the message's "
            "reasoning_content, streamed as delta.reasoning_content (off: left in content)");
  f->Int("responses-store-mb", responses_store_mb,
         "MiB of memory for the Responses API's stored responses (previous_response_id, GET "
         "/v1/responses/{id}), least recently used evicted first (0: none kept)");
}

void RegisterTracingFlags(FlagSet* f, TracerOptions* tracing) {
  // The OpenTelemetry SDKs' environment variables are the defaults.
  if (const char* e = std::getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) tracing->endpoint = e;
  if (const char* e = std::getenv("OTEL_SERVICE_NAME")) tracing->service_name = e;
  f->String("otlp-traces-endpoint", &tracing->endpoint,
            "export OpenTelemetry spans over OTLP/HTTP JSON to this URL, e.g. "
            "http://localhost:4318/v1/traces (default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; "
            "empty: off)");
  f->Double("trace-sample-ratio", &tracing->sample_ratio,
            "fraction of new traces recorded (a caller's traceparent decision is followed)");
  f->String("trace-service-name", &tracing->service_name,
            "service.name of the spans (default: $OTEL_SERVICE_NAME, else tinyserve-worker or "
            "tinyserve-router)");
}

}  // namespace tinyserve
