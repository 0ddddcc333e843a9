#include "worker/server/generate_reactor.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/timer.h"
#include "worker/sampling/reasoning_constraint.h"
#include "worker/server/api_util.h"
#include "worker/server/block_hash.h"
#include "worker/server/proto_convert.h"
#include "worker/server/rpc_security.h"
#include "worker/server/status_convert.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;

// Adapts the engine's sink interface to the reactor. Holds a raw pointer: the reactor outlives
// the sink's last call (OnFinish), because it only finishes after OnFinish closes it.
class ReactorSink final : public RequestSink {
 public:
  explicit ReactorSink(GenerateReactor* reactor) : reactor_(reactor) {}
  void OnTokens(const std::vector<GeneratedToken>& tokens, const RequestUsage& usage) override {
    reactor_->OnEngineTokens(tokens, usage);
  }
  void OnPromptLogprobs(const std::vector<GeneratedToken>& tokens) override {
    reactor_->OnEnginePromptLogprobs(tokens);
  }
  void OnFinish(FinishReason reason, const RequestUsage& usage, absl::Status status) override {
    GenerateReactor* r = reactor_;
    reactor_ = nullptr;
    r->OnEngineFinish(reason, usage, status);
  }

 private:
  GenerateReactor* reactor_;
};

}  // namespace

GenerateReactor::GenerateReactor(WorkerState* state, grpc::CallbackServerContext* context,
                                 const grpc::ByteBuffer& buffer)
    : state_(state) {
  const grpc::Status auth = CheckApiKey(*context, state_->api_key);
  // Calls without a valid key are not traced: they may not fill the exporter's queue.
  span_ = Span::Start(auth.ok() ? state->tracer : nullptr, "tinyserve.worker.generate",
                      Span::kServer, TraceContextOf(*context));
  if (!auth.ok()) {
    Reject(auth);
    return;
  }
  if (state_->draining.load()) {
    Reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is draining"));
    return;
  }
  if (!state_->ready.load()) {
    Reject(grpc::Status(grpc::StatusCode::UNAVAILABLE, "worker is not ready"));
    return;
  }
  v1::GenerateRequest request;
  if (grpc::Status s = ParseRequest(buffer, &request); !s.ok()) {
    Reject(s);
    return;
  }
  Engine& engine = *state_->engine;
  absl::StatusOr<GenerateRequest> converted = ToEngineRequest(
      request, engine.tokenizer(), engine.options().default_selection, engine.loras());
  if (!converted.ok()) {
    Reject(ToGrpcStatus(converted.status()));
    return;
  }
  GenerateRequest& req = *converted;
  request_id_ = request.request_id().empty() ? state_->NewRequestId() : request.request_id();
  req.request_id = request_id_;
  req.deadline = EngineDeadline(*context);
  want_logprobs_ = req.sampling.logprobs >= 0;
  if (!req.sampling.reasoning_format.empty()) {  // told to the reader in the first chunk
    switch (ReasoningConstraint::StartOfPrompt(engine.token_table(), req.prompt_ids,
                                               req.sampling.reasoning_format)) {
      case ReasoningConstraint::State::kIdle:
        reasoning_start_ = v1::REASONING_START_IDLE;
        break;
      case ReasoningConstraint::State::kDone:
        reasoning_start_ = v1::REASONING_START_CLOSED;
        break;
      default:
        reasoning_start_ = v1::REASONING_START_OPEN;
    }
  }
  if (span_->recording()) {  // the attributes vLLM's spans carry (OpenTelemetry gen_ai.*)
    span_->Set("gen_ai.request.id", request_id_);
    span_->Set("gen_ai.request.max_tokens", static_cast<int64_t>(req.sampling.max_tokens));
    span_->Set("gen_ai.request.temperature", static_cast<double>(req.sampling.temperature));
    span_->Set("gen_ai.request.top_p", static_cast<double>(req.sampling.top_p));
    span_->Set("gen_ai.request.priority", static_cast<int64_t>(req.priority));
  }
  if (req.deadline > 0 && req.deadline <= NowSeconds()) {
    Reject(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline already passed"));
    return;
  }
  if (!state_->AddLive(request_id_)) {
    const std::string id = request_id_;
    request_id_.clear();  // not ours to remove
    Reject(grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                        absl::StrCat("request_id '", id, "' is already in use")));
    return;
  }
  state_->prefixes.Insert(PromptBlockHashes(request));
  submitted_.store(true);
  // Read before Submit: once submitted, the request may finish and free this reactor.
  const int lora = req.lora;
  WorkerMetrics* metrics = state_->metrics;
  absl::Status s = engine.Submit(std::move(req), std::make_shared<ReactorSink>(this));
  if (!s.ok()) {
    submitted_.store(false);
    state_->RemoveLive(request_id_);
    Reject(ToGrpcStatus(s));
  } else if (metrics != nullptr) {
    metrics->CountLoraRequest(lora);
  }
}

void GenerateReactor::Reject(const grpc::Status& status) {
  if (state_->metrics != nullptr)
    state_->metrics->CountRefusal(static_cast<absl::StatusCode>(status.error_code()));
  TS_LOG(DEBUG) << "Generate rejected: " << StatusCodeName(status.error_code()) << ": "
                << status.error_message();
  span_->Set("rpc.grpc.status_code", static_cast<int64_t>(status.error_code()));
  span_->SetError(status.error_message());
  span_->End();
  Close(status);
}

void GenerateReactor::OnClientGone() {
  // Frees the request's pages at the engine's next step; OnFinish(kAbort) then closes us.
  if (submitted_.load()) state_->engine->Abort(request_id_);
}

void GenerateReactor::OnEngineTokens(const std::vector<GeneratedToken>& tokens,
                                     const RequestUsage& usage) {
  if (client_gone()) return;
  v1::GenerateResponse response;
  response.set_request_id(request_id_);
  v1::Chunk* chunk = response.mutable_chunk();
  const Tokenizer& tok = state_->engine->tokenizer();
  auto fill = [&tok](const GeneratedToken& t, v1::TokenLogprobs* lp) {
    lp->set_token_id(t.id);
    lp->set_logprob(t.logprob);
    lp->set_rank(t.rank);
    lp->set_text(SanitizeUtf8(tok.TokenBytes(t.id)));
    for (const TokenLogprob& alt : t.top) {
      v1::TopLogprob* top = lp->add_top();
      top->set_token_id(alt.id);
      top->set_logprob(alt.logprob);
      top->set_text(SanitizeUtf8(tok.TokenBytes(alt.id)));
    }
  };
  chunk->set_reasoning_start(std::exchange(reasoning_start_, v1::REASONING_START_UNSPECIFIED));
  for (const GeneratedToken& t : prompt_lp_) fill(t, chunk->add_prompt_logprobs());
  std::vector<GeneratedToken>().swap(prompt_lp_);
  std::string text;
  for (const GeneratedToken& t : tokens) {
    chunk->add_token_ids(t.id);
    text += t.text;
    if (want_logprobs_) fill(t, chunk->add_logprobs());
  }
  chunk->set_text(IsWellFormedUtf8(text) ? text : SanitizeUtf8(text));
  chunk->set_prompt_tokens(usage.prompt_tokens);
  chunk->set_completion_tokens(usage.generated_tokens);
  chunk->set_cached_tokens(usage.cached_tokens);
  Enqueue(ToByteBuffer(response));
}

void GenerateReactor::OnEngineFinish(FinishReason reason, const RequestUsage& usage,
                                     const absl::Status& status) {
  state_->RemoveLive(request_id_);
  v1::GenerateResponse response;
  response.set_request_id(request_id_);
  grpc::Status final_status = grpc::Status::OK;
  if (reason == FinishReason::kError) {
    final_status = status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL, "engine error")
                               : ToGrpcStatus(status);
    v1::Error* error = response.mutable_error();
    error->set_code(static_cast<int>(final_status.error_code()));
    error->set_message(SanitizeUtf8(final_status.error_message()));
  } else {
    FillComplete(usage, reason, response.mutable_complete());
    if (reason == FinishReason::kDeadline) {
      final_status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
    } else if (reason == FinishReason::kAbort && client_gone()) {
      final_status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
    }
  }
  if (span_->recording()) {
    span_->Set("gen_ai.response.finish_reasons", FinishReasonName(reason));
    span_->Set("gen_ai.usage.input_tokens", static_cast<int64_t>(usage.prompt_tokens));
    span_->Set("gen_ai.usage.output_tokens", static_cast<int64_t>(usage.generated_tokens));
    span_->Set("gen_ai.latency.time_in_queue", usage.queue_seconds);
    span_->Set("gen_ai.latency.time_to_first_token", usage.ttft_seconds);
    span_->Set("gen_ai.latency.time_in_model_prefill", usage.prefill_seconds);
    span_->Set("gen_ai.latency.time_in_model_decode", usage.decode_seconds);
    span_->Set("gen_ai.latency.e2e", usage.e2e_seconds);
    span_->Set("tinyserve.cached_tokens", static_cast<int64_t>(usage.cached_tokens));
    span_->Set("tinyserve.preemptions", static_cast<int64_t>(usage.preemptions));
    span_->Set("tinyserve.spec_accepted_tokens", static_cast<int64_t>(usage.spec_accepted_tokens));
    const SelectionSummary& sel = usage.selection;
    if (!sel.policy.empty()) {
      span_->Set("tinyserve.selection.policy", sel.policy);
      span_->Set("tinyserve.selection.kv_bytes_read", sel.kv_bytes_read);
      span_->Set("tinyserve.selection.kv_bytes_dense", sel.kv_bytes_dense);
    }
    span_->Set("rpc.grpc.status_code", static_cast<int64_t>(final_status.error_code()));
    if (!final_status.ok()) span_->SetError(final_status.error_message());
  }
  span_->End();
  Enqueue(ToByteBuffer(response));
  Close(final_status);  // last touch of `this`
}

}  // namespace tinyserve
