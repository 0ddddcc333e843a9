// File: worker/server/http_frontend.h
// The OpenAI-compatible HTTP server of a router or worker process. It speaks to the process's
// own TinyServe gRPC service through an in-process channel, so HTTP requests take exactly the
// gRPC path: the router's admission, routing, retries and metrics, or the worker's engine.
//
// Routes:
//   POST /v1/completions, /v1/chat/completions   openai_api.h; "stream": true answers with
//                                                server-sent events, ending "data: [DONE]"
//   GET  /v1/models                              the served model
//   POST /tokenize {"prompt", "add_special_tokens"} -> {"tokens", "count", "max_model_len"}
//   POST /detokenize {"tokens"} -> {"prompt"}
//   GET  /health                                 200 when ready, else 503
//   GET  /version                                {"version"}
//   GET  /metrics                                the process's Prometheus metrics (as on
//                                                --metrics-port; vLLM serves them here too)
// Errors are OpenAI error objects with the HTTP status of the gRPC code (openai_api.h). With
// an API key set, every route but /health, /version and /metrics needs it as a bearer token
// (401).
// A streamed request whose client goes away is cancelled at its next event (the worker frees
// its KV pages); an unstreamed one runs to its end (max_tokens bounds it).
//
// Threading: civetweb's worker threads (`threads` of them) each serve one connection at a
// time and block on that request's gRPC calls; a request's n choices run concurrently.
// Stop() (or the destructor) closes the listener and waits for running handlers: call it
// after the gRPC server has shut down, which ends every call still running.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/registry.h"
#include "tinyserve/v1/tinyserve.grpc.pb.h"
#include "worker/server/openai_api.h"
#include "worker/server/response_store.h"
#include "worker/server/tls_terminator.h"

struct mg_context;
struct mg_connection;

namespace tinyserve {

struct HttpFrontendOptions {
  std::string host = "0.0.0.0";
  int port = 8000;
  int threads = 64;              // connections served at once
  int max_body_bytes = 4 << 20;  // larger bodies: 413
  std::string version = "dev";
  std::string api_key;  // non-empty: every route but /health, /version, /metrics needs
                        // "Authorization: Bearer <api_key>" (else 401)
  // HTTPS: a PEM certificate chain and its key (both empty: plain HTTP), checked for renewal
  // every tls_reload_seconds (tls_terminator.h).
  std::string tls_cert, tls_key;
  int tls_reload_seconds = 60;
  // "hermes": chat requests with tools and tool_choice "auto" (or none given) generate freely and
  // <tool_call>{"name": ..., "arguments": ...}</tool_call> blocks in the output become
  // tool_calls (vLLM's --tool-call-parser hermes). Empty: "auto" is refused.
  std::string tool_call_parser;
  // "qwen3" or "deepseek_r1": a chat answer's <think> block becomes the message's
  // reasoning_content (vLLM's --reasoning-parser). Empty: the output is content as it is.
  std::string reasoning_parser;
  // Memory for the Responses API's stored responses (store: true; previous_response_id,
  // GET/DELETE /v1/responses/{id}; response_store.h), least recently used evicted first.
  // 0: none kept.
  int responses_store_mb = 64;
};

class HttpFrontend {
 public:
  // channel: a TinyServe server (usually grpc::Server::InProcessChannel of this process).
  // registry: where tinyserve_http_requests_total{route,code} is registered. metrics: what
  // GET /metrics serves (null: 404).
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> Start(
      const HttpFrontendOptions& options, std::shared_ptr<grpc::Channel> channel,
      prometheus::Registry* registry, std::shared_ptr<prometheus::Collectable> metrics = nullptr);
  // Start on `server`'s own TinyServe service (an in-process channel): what the router and the
  // worker do. The result is null when options.port is 0 (off).
  static absl::StatusOr<std::unique_ptr<HttpFrontend>> StartFor(
      grpc::Server* server, const HttpFrontendOptions& options, prometheus::Registry* registry,
      std::shared_ptr<prometheus::Collectable> metrics);
  ~HttpFrontend();

  // Call before the server behind the channel shuts down: cancels the unary calls in progress,
  // waits until they have ended and the streams being started have started, and answers later
  // requests 503 without a call. gRPC 1.51 crashes creating a call on an in-process channel whose
  // server has shut down (fixed upstream in 2025, grpc/grpc#38645).
  void BeginShutdown();
  // Stops accepting and waits for running handlers (idempotent).
  void Stop();
  int port() const { return port_; }

 private:
  HttpFrontend(const HttpFrontendOptions& options, std::shared_ptr<grpc::Channel> channel,
               prometheus::Registry* registry, std::shared_ptr<prometheus::Collectable> metrics);
  static int Handle(mg_connection* conn, void* self);
  int Route(mg_connection* conn);
  // Route handlers: (connection, request body) -> the HTTP status sent.
  int Completions(mg_connection* conn, const std::string& body);
  int ChatCompletions(mg_connection* conn, const std::string& body);
  int Responses(mg_connection* conn, const std::string& body);
  // GET and DELETE /v1/responses/{id}: a stored response.
  int GetResponse(mg_connection* conn, const std::string& body);
  int DeleteResponse(mg_connection* conn, const std::string& body);
  int InputItems(mg_connection* conn, const std::string& id);  // GET .../{id}/input_items
  int Messages(mg_connection* conn, const std::string& body);
  int CountTokens(mg_connection* conn, const std::string& body);
  int Models(mg_connection* conn, const std::string& body);
  int Embeddings(mg_connection* conn, const std::string& body);
  int LoadLoraAdapter(mg_connection* conn, const std::string& body);
  int UnloadLoraAdapter(mg_connection* conn, const std::string& body);
  int LoraAdapterCall(mg_connection* conn, const std::string& body, bool load);
  int Tokenize(mg_connection* conn, const std::string& body);
  // One Tokenize call on the process's gRPC server.
  grpc::Status TokenizeCall(const tinyserve::v1::TokenizeRequest& req,
                            tinyserve::v1::TokenizeResponse* resp);
  int Detokenize(mg_connection* conn, const std::string& body);
  int Health(mg_connection* conn, const std::string& body);
  int Version(mg_connection* conn, const std::string& body);
  int Metrics(mg_connection* conn, const std::string& body);
  int Generate(mg_connection* conn, openai::Endpoint endpoint, const std::string& body);
  // The served model's name and context (GetModelInfo, cached once it answers).
  absl::StatusOr<openai::ServedModel> Model();
  void Count(const char* route, int code);

  HttpFrontendOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tinyserve::v1::TinyServe::Stub> stub_;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;
  std::shared_ptr<prometheus::Collectable> metrics_;
  mg_context* ctx_ = nullptr;
  int port_ = 0;
  std::unique_ptr<TlsTerminator> tls_;  // HTTPS in front of civetweb, when configured
  std::atomic<uint64_t> next_id_{0};
  std::unique_ptr<openai::ResponseStore> responses_;  // null: responses_store_mb 0
  std::atomic<int> active_{0};  // requests being answered (Handle)

  // The gate of BeginShutdown: a CallScope (http_frontend.cc) holds it while a call is made.
  class CallScope;
  std::mutex gate_mu_;
  std::condition_variable gate_cv_;
  bool closing_ = false;                  // GUARDED_BY(gate_mu_)
  int calling_ = 0;                       // GUARDED_BY(gate_mu_)
  std::set<grpc::ClientContext*> unary_;  // GUARDED_BY(gate_mu_) cancelled by BeginShutdown
  std::string id_prefix_;

  std::mutex mu_;
  // The served model (GetModelInfo), fetched again when older than kModelInfoTtlSeconds so that
  // workers restarted with other LoRA adapters are seen; a failed refresh keeps the old copy.
  static constexpr double kModelInfoTtlSeconds = 30;
  std::optional<openai::ServedModel> model_;  // GUARDED_BY(mu_)
  tinyserve::v1::ModelInfo model_info_;       // GUARDED_BY(mu_)
  double model_fetched_ = 0;                  // GUARDED_BY(mu_): NowSeconds() of model_
  bool refreshing_ = false;                   // GUARDED_BY(mu_): a request is refreshing it
};

}  // namespace tinyserve
