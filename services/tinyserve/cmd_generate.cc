// tinyserve generate: load a model in-process (or talk to a server) and stream a completion.
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>

#include "absl/strings/str_format.h"
#include "common/timer.h"
#include "services/tinyserve/cli_common.h"

namespace tinyserve {

#ifdef TINYSERVE_HAVE_CLIENT
int RunGenerateClient(const std::vector<std::string>& args);
#endif

namespace {

// Streams text to stdout as it is produced.
class PrintSink : public RequestSink {
 public:
  void OnTokens(const std::vector<GeneratedToken>& tokens, const RequestUsage&) override {
    for (const auto& t : tokens) {
      std::fwrite(t.text.data(), 1, t.text.size(), stdout);
      ids.push_back(t.id);
    }
    std::fflush(stdout);
  }
  void OnFinish(FinishReason r, const RequestUsage& u, absl::Status s) override {
    reason = r;
    usage = u;
    status = s;
    done.set_value();
  }
  std::vector<int32_t> ids;
  FinishReason reason = FinishReason::kError;
  RequestUsage usage;
  absl::Status status;
  std::promise<void> done;
};

// Writes one JSON object per decode step of selection instrumentation.
class TraceObserver : public EngineObserver {
 public:
  explicit TraceObserver(const std::string& path) : out_(path) {}
  bool ok() const { return out_.good(); }
  void OnSelectionStep(const SelectionSummary& s) override {
    out_ << absl::StrFormat(
        "{\"step\":%d,\"policy\":\"%s\",\"pages_scored\":%d,\"pages_selected\":%d,"
        "\"kv_bytes_read\":%d,\"kv_bytes_dense\":%d,\"select_ms\":%.4f,\"page_hit_rate\":%s,"
        "\"mass_recall\":%s}\n",
        step_++, s.policy, s.pages_scored, s.pages_selected, s.kv_bytes_read, s.kv_bytes_dense,
        1e3 * s.select_seconds, s.page_hit_rate < 0 ? "null" : absl::StrFormat("%.4f", s.page_hit_rate),
        s.mass_recall < 0 ? "null" : absl::StrFormat("%.4f", s.mass_recall));
  }

 private:
  std::ofstream out_;
  int64_t step_ = 0;
};

}  // namespace

int RunGenerateCommand(const std::vector<std::string>& args) {
  FlagSet flags("generate",
                "Generate text from a prompt, streaming it to stdout; a summary goes to stderr.\n"
                "With --server HOST:PORT the request goes to a running router or worker.");
  EngineFlags ef;
  SamplingFlags sf;
  ClientSecurityFlags security;  // used by RunGenerateClient, which parses the same arguments
  std::string prompt, trace, server, adapter;
  bool chat = false;
  flags.String("prompt", &prompt, "the prompt text");
  flags.Bool("chat", &chat, "wrap the prompt as a user turn of the model's chat template");
  flags.String("trace", &trace, "write selection statistics per decode step as JSON lines");
  flags.String("server", &server, "send the request to a TinyServe server at HOST:PORT");
  flags.String("adapter", &adapter,
               "the LoRA adapter to generate with (a --lora NAME, or one the server loaded); "
               "default: the only --lora given, else the base model; 'base': the base model");
  ef.Register(&flags);
  // Not in EngineFlags: `worker` registers its own --kv-dtype.
  flags.String("kv-dtype", &ef.options.kv_dtype, "KV cache storage: f16 or int8");
  sf.Register(&flags);
  security.Register(&flags);
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (!server.empty()) {
#ifdef TINYSERVE_HAVE_CLIENT
    return RunGenerateClient(args);
#else
    return FailWith("this build has no gRPC client");
#endif
  }
  if (prompt.empty()) return FailWith("prompt: empty prompt (pass --prompt TEXT)");
  absl::StatusOr<SamplingParams> sampling = sf.Build();
  if (!sampling.ok()) return FailWith(std::string(sampling.status().message()));
  const SamplingParams sp = *std::move(sampling);
  Stopwatch load;
  absl::StatusOr<EngineOptions> engine_options = ef.Build();
  if (!engine_options.ok()) return FailWith(std::string(engine_options.status().message()));
  auto engine_or = Engine::Create(*std::move(engine_options));
  if (!engine_or.ok()) return FailWith(std::string(engine_or.status().message()));
  Engine& engine = **engine_or;
  int lora = adapter.empty() && engine.loras().size() == 1 ? 1 : 0;
  if (!adapter.empty() && adapter != "base") {
    lora = LoraId(engine.loras(), adapter);
    if (lora == 0) return FailWith("--adapter: no --lora adapter is named '" + adapter + "'");
  }
  const double load_s = load.Seconds();
  std::unique_ptr<TraceObserver> tracer;
  if (!trace.empty()) {
    tracer = std::make_unique<TraceObserver>(trace);
    if (!tracer->ok()) return FailWith("trace: cannot write " + trace);
    engine.SetObserver(tracer.get());
  }
  const Tokenizer& tok = engine.tokenizer();
  GenerateRequest req;
  req.request_id = "cli";
  if (chat) {
    absl::StatusOr<std::string> text = RenderChat(tok.data(), {{"user", prompt}}, true);
    if (!text.ok()) return FailWith(std::string(text.status().message()));
    req.prompt_ids = tok.Encode(*text, /*parse_special=*/true, /*add_bos=*/false);
  } else {
    req.prompt_ids = tok.Encode(prompt, /*parse_special=*/false, tok.data().add_bos);
  }
  req.sampling = sp;
  req.lora = lora;
  auto sink = std::make_shared<PrintSink>();
  if (auto s = engine.Submit(std::move(req), sink); !s.ok())
    return FailWith(std::string(s.message()));
  engine.RunUntilIdle();
  sink->done.get_future().wait();
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (sink->reason == FinishReason::kError) return FailWith(std::string(sink->status.message()));
  const RequestUsage& u = sink->usage;
  const double prefill_tps = u.prefill_seconds > 0 ? (u.prompt_tokens - u.cached_tokens) / u.prefill_seconds : 0;
  const double decode_tps = u.decode_seconds > 0 ? (u.generated_tokens - 1) / u.decode_seconds : 0;
  std::string sel;
  if (u.selection.steps > 0 && u.selection.policy != "dense") {
    const auto& s = u.selection;
    sel = absl::StrFormat(
        " | %s: %.1f pages selected/step of %.1f scored, KV read %.1f%% of dense",
        s.policy, static_cast<double>(s.pages_selected) / s.steps,
        static_cast<double>(s.pages_scored) / s.steps,
        s.kv_bytes_dense ? 100.0 * s.kv_bytes_read / s.kv_bytes_dense : 100.0);
    if (s.page_hit_rate >= 0)
      sel += absl::StrFormat(", hit rate %.3f, mass recall %.3f", s.page_hit_rate, s.mass_recall);
    if (s.reuse >= 0) sel += absl::StrFormat(", reuse %.3f", s.reuse);
  }
  if (u.spec_draft_tokens > 0)
    sel += absl::StrFormat(" | speculative: %d of %d drafted tokens accepted",
                           u.spec_accepted_tokens, u.spec_draft_tokens);
  std::fprintf(stderr,
               "prompt %d tokens, generated %d tokens (%s) | prefill %.1f tok/s, decode %.1f "
               "tok/s | load %.2f s%s\n",
               u.prompt_tokens, u.generated_tokens, FinishReasonName(sink->reason), prefill_tps,
               decode_tps, load_s, sel.c_str());
  return 0;
}

}  // namespace tinyserve
