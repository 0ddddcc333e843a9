// The gRPC client of `tinyserve generate --server HOST:PORT`: one streamed generation.
#include <cstdio>

#include "absl/strings/str_format.h"
#include "common/timer.h"
#include "grpcpp/grpcpp.h"
#include "services/tinyserve/cli_common.h"
#include "services/tinyserve/commands.h"
#include "tinyserve/v1/tinyserve.grpc.pb.h"
#include "worker/server/api_util.h"
#include "worker/server/rpc_security.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;

const char* FinishName(v1::FinishReason r) {
  switch (r) {
    case v1::FINISH_REASON_LENGTH: return "length";
    case v1::FINISH_REASON_EOS: return "eos";
    case v1::FINISH_REASON_STOP_TOKEN: return "stop_token";
    case v1::FINISH_REASON_STOP_STRING: return "stop_string";
    case v1::FINISH_REASON_ABORT: return "abort";
    case v1::FINISH_REASON_DEADLINE: return "deadline";
    case v1::FINISH_REASON_ERROR: return "error";
    default: return "unspecified";
  }
}

}  // namespace

int RunGenerateClient(const GenerateClientOptions& o) {
  if (o.prompt.empty()) return FailWith("prompt: empty prompt (pass --prompt TEXT)");
  const ClientTls tls{o.tls_ca, o.tls_cert, o.tls_key, o.tls_server_name};
  absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> credentials =
      MakeChannelCredentials(tls, "--tls-");
  if (!credentials.ok()) return FailWith(std::string(credentials.status().message()));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  ApplyClientTls(tls, &args);
  auto channel = grpc::CreateCustomChannel(o.server, *credentials, args);
  auto stub = v1::TinyServe::NewStub(channel);

  v1::GenerateRequest req;
  req.set_request_id(o.request_id);
  req.set_lora_adapter(o.adapter);
  if (o.chat) {
    v1::ChatMessage* m = req.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(o.prompt);
  } else {
    req.set_text(o.prompt);
  }
  const SamplingParams& p = o.sampling;
  v1::SamplingOptions* s = req.mutable_sampling();
  s->set_max_tokens(p.max_tokens);
  s->set_temperature(p.temperature);
  s->set_top_k(p.top_k);
  s->set_top_p(p.top_p);
  s->set_min_p(p.min_p);
  s->set_repetition_penalty(p.repetition_penalty);
  s->set_presence_penalty(p.presence_penalty);
  s->set_frequency_penalty(p.frequency_penalty);
  if (p.has_seed) s->set_seed(p.seed);
  for (const std::string& stop : p.stop) s->add_stop(stop);
  s->set_ignore_eos(p.ignore_eos);
  s->set_response_format(p.response_format);
  s->set_json_schema(p.json_schema);
  s->set_regex(p.regex);
  s->set_grammar(p.grammar);
  if (!o.policy.empty() || o.budget > 0) {
    req.mutable_selection()->set_policy(o.policy);
    req.mutable_selection()->set_budget(o.budget);
  }

  grpc::ClientContext ctx;
  AttachApiKey(o.api_key, &ctx);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(o.timeout_seconds * 1e3)));
  Stopwatch watch;
  double ttft = -1;
  std::unique_ptr<grpc::ClientReader<v1::GenerateResponse>> reader =
      stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  v1::Complete complete;
  bool have_complete = false;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      if (ttft < 0) ttft = watch.Seconds();
      const std::string& text = resp.chunk().text();
      std::fwrite(text.data(), 1, text.size(), stdout);
      std::fflush(stdout);
    } else if (resp.has_complete()) {
      complete = resp.complete();
      have_complete = true;
    } else if (resp.has_error()) {
      std::fprintf(stderr, "\nerror from server: %s\n", resp.error().message().c_str());
    }
  }
  grpc::Status status = reader->Finish();
  std::fputs("\n", stdout);
  if (!status.ok()) {
    std::fprintf(stderr, "error: %s: %s\n", StatusCodeName(status.error_code()),
                 status.error_message().c_str());
    return 1;
  }
  if (!o.quiet && have_complete) {
    const double e2e = watch.Seconds();
    const v1::Usage& u = complete.usage();
    std::fprintf(stderr, "%s",
                 absl::StrFormat("[%s] prompt %d tokens (%d cached), %d generated; ttft %.1f ms, "
                                 "%.1f tok/s, total %.2f s%s\n",
                                 FinishName(complete.finish_reason()), u.prompt_tokens(),
                                 u.cached_tokens(), u.completion_tokens(), 1e3 * ttft,
                                 e2e > 0 ? u.completion_tokens() / e2e : 0.0, e2e,
                                 complete.worker().empty() ? "" : ", worker " + complete.worker())
                     .c_str());
  }
  return 0;
}

int RunGenerateClient(const std::vector<std::string>& args) {
  // The same flags as `generate`, so its arguments parse unchanged; engine flags other than
  // the selection ones do not apply to a remote server and are ignored.
  FlagSet flags("generate --server", "Stream one generation from a TinyServe server.");
  EngineFlags ef;
  SamplingFlags sf;
  ClientSecurityFlags security;
  GenerateClientOptions o;
  std::string trace;
  double timeout = o.timeout_seconds;
  flags.String("prompt", &o.prompt, "the prompt text");
  flags.Bool("chat", &o.chat, "send the prompt as a user chat message");
  flags.String("trace", &trace, "(ignored with --server)");
  flags.String("server", &o.server, "a TinyServe router or worker at HOST:PORT");
  flags.Double("timeout", &timeout, "deadline of the call in seconds");
  flags.String("request-id", &o.request_id, "request id (default: assigned by the server)");
  flags.String("adapter", &o.adapter,
               "the LoRA adapter to generate with (default: the base model)");
  ef.Register(&flags);
  sf.Register(&flags);
  security.Register(&flags);
  if (auto s = flags.Parse(args); !s.ok()) return FailWith(std::string(s.message()));
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return 0;
  }
  if (o.prompt.empty() && !flags.positional().empty()) o.prompt = flags.positional()[0];
  absl::StatusOr<SamplingParams> sampling = sf.Build();
  if (!sampling.ok()) return FailWith(std::string(sampling.status().message()));
  o.sampling = *std::move(sampling);
  o.timeout_seconds = timeout;
  if (flags.WasSet("policy")) o.policy = ef.policy;
  if (flags.WasSet("budget")) o.budget = ef.budget;
  o.api_key = security.api_key;
  o.tls_ca = security.tls_ca;
  o.tls_cert = security.tls_cert;
  o.tls_key = security.tls_key;
  o.tls_server_name = security.tls_server_name;
  return RunGenerateClient(o);
}

}  // namespace tinyserve
