// File: services/tinyserve/cli_common.h
// Flags shared by the CLI commands: model and engine options, sampling, selection.
#pragma once

#include <string>
#include <vector>

#include "common/flags.h"
#include "worker/engine/engine.h"

namespace tinyserve {

struct EngineFlags {
  EngineOptions options;
  std::string policy = "dense";
  int budget = 1024;
  int dense_layers = 2;
  int sink_pages = 1;
  int recent_pages = 0;
  int oracle_every = 0;
  std::string gqa;  // quest: max | sum
  std::vector<std::string> loras;  // --lora NAME=PATH
  std::string chat_template;       // a file, or the template itself
  void Register(FlagSet* flags);
  // Copies the selection flags into options.default_selection, the parsed --lora flags into
  // options.loras and --chat-template's Jinja source into options.chat_template;
  // InvalidArgument for a malformed --lora or a --chat-template that is neither a file nor a
  // template.
  absl::StatusOr<EngineOptions> Build() const;
  SelectionSpec Selection() const;
};

struct SamplingFlags {
  SamplingParams params;
  int64_t seed = -1;
  std::vector<std::string> stop;
  std::string grammar_file;
  void Register(FlagSet* flags);
  absl::StatusOr<SamplingParams> Build() const;
};

// How `generate --server` reaches a server: the API key and TLS files (see
// worker/server/rpc_security.h). Registered by generate too, so its arguments parse unchanged.
struct ClientSecurityFlags {
  std::string api_key;  // default: $TINYSERVE_API_KEY
  std::string tls_ca, tls_cert, tls_key, tls_server_name;
  void Register(FlagSet* flags);
};

// Prints "error: <message>" to stderr and returns 1 (the CLI's one-line failure).
int FailWith(const std::string& message);

// Command entry points (args exclude the program and command names).
int RunGenerateCommand(const std::vector<std::string>& args);
int RunEmbedCommand(const std::vector<std::string>& args);
int RunEvalCommand(const std::vector<std::string>& args);
int RunBenchCommand(const std::vector<std::string>& args);

}  // namespace tinyserve
