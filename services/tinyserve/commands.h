// File: services/tinyserve/commands.h
// The serving subcommands of the `tinyserve` CLI. main.cc dispatches to them with the
// arguments after the command name; each parses its own flags (common/flags.h), prints its
// usage for --help, and returns the process exit code.
//
//   tinyserve worker  --model PATH --port 50051 --metrics-port 9100 ...  one worker process
//   tinyserve router  --port 50050 --metrics-port 9000 --workers h:p,...  the router
//   tinyserve serve   [--model PATH]                  router + worker(s) as child processes
//
// `tinyserve generate --server HOST:PORT ...` calls RunGenerateClient(args) with generate's
// own arguments (the same flags: prompt, chat, sampling, selection) instead of loading a model.
#pragma once

#include <string>
#include <vector>

#include "worker/sampling/sampling_params.h"

namespace tinyserve {

class FlagSet;
struct ServerTls;
struct TracerOptions;

int RunWorkerCommand(const std::vector<std::string>& args);
int RunRouterCommand(const std::vector<std::string>& args);
int RunServeCommand(const std::vector<std::string>& args);
// `generate --server`: parses generate's flags and streams through RunGenerateClient(options).
int RunGenerateClient(const std::vector<std::string>& args);

// --api-key (default $TINYSERVE_API_KEY), --tls-cert, --tls-key, --tls-client-ca, --tls-reload
// and --health-port: what the worker and router commands share (server_flags.cc).
void RegisterServerSecurityFlags(FlagSet* flags, std::string* api_key, ServerTls* tls,
                                 int* health_port, ServerTls* http_tls);
// --tool-call-parser, --reasoning-parser and --responses-store-mb: the HTTP API's settings
// (http_frontend.h) that the worker and router commands share.
void RegisterHttpApiFlags(FlagSet* flags, std::string* tool_call_parser,
                          std::string* reasoning_parser, int* responses_store_mb);
// --otlp-traces-endpoint, --trace-sample-ratio, --trace-service-name (OpenTelemetry).
void RegisterTracingFlags(FlagSet* flags, TracerOptions* tracing);

// One streamed generation against a TinyServe server (router or worker).
struct GenerateClientOptions {
  std::string server = "localhost:50050";
  std::string prompt;
  bool chat = false;            // send the prompt as one user chat message
  SamplingParams sampling;      // sent as tinyserve.v1.SamplingOptions
  std::string policy;           // selection policy; empty: the server's default
  int budget = 0;               // selection budget; 0: the server's default
  double timeout_seconds = 120; // the call's deadline
  std::string request_id;
  std::string adapter;          // a LoRA adapter the server loaded; empty: the base model
  bool quiet = false;           // no summary on stderr
  std::string api_key;          // sent as "authorization: Bearer <key>"
  std::string tls_ca, tls_cert, tls_key, tls_server_name;  // see worker/server/rpc_security.h
};

// Streams the text to stdout and a summary (finish reason, tokens, timings, worker) to stderr.
// Returns 0 on success, 1 on an RPC error (printed to stderr with its code).
int RunGenerateClient(const GenerateClientOptions& options);

}  // namespace tinyserve
