// tinyserve: the command-line entry point. `tinyserve COMMAND --help` describes each command.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common/crash_handler.h"
#include "services/tinyserve/cli_common.h"
#ifdef TINYSERVE_HAVE_SERVER_COMMANDS
#include "services/tinyserve/commands.h"
#endif

namespace {

const char kUsage[] =
    "usage: tinyserve COMMAND [flags]\n\n"
    "commands:\n"
    "  generate   generate text from a prompt (in-process, or --server HOST:PORT)\n"
    "  embed      embeddings of texts (in-process), as JSON lines\n"
    "  eval       quality and speed of a selection policy against dense on a text\n"
    "  bench      decode and prefill speed\n"
    "  serve      start a router and a worker on the default model\n"
    "  worker     start one worker (gRPC engine server)\n"
    "  router     start the router\n\n"
    "`tinyserve COMMAND --help` lists a command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  tinyserve::InstallCrashHandler(argv[0]);
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  if (cmd == "generate") return tinyserve::RunGenerateCommand(args);
  if (cmd == "embed") return tinyserve::RunEmbedCommand(args);
  if (cmd == "eval") return tinyserve::RunEvalCommand(args);
  if (cmd == "bench") return tinyserve::RunBenchCommand(args);
#ifdef TINYSERVE_HAVE_SERVER_COMMANDS
  if (cmd == "serve") return tinyserve::RunServeCommand(args);
  if (cmd == "worker") return tinyserve::RunWorkerCommand(args);
  if (cmd == "router") return tinyserve::RunRouterCommand(args);
#endif
  std::fprintf(stderr, "error: unknown command '%s'\n\n%s", cmd.c_str(), kUsage);
  return 2;
}
