#include "router/proxy_call.h"

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/timer.h"
#include "worker/server/api_util.h"
#include "worker/server/block_hash.h"
#include "worker/server/rpc_security.h"

namespace tinyserve {
namespace {

namespace v1 = tinyserve::v1;

bool Retryable(const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE ||
         s.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

}  // namespace

std::shared_ptr<UpstreamAttempt> UpstreamAttempt::Create(ProxyCall* call, WorkerPtr worker) {
  auto a = std::make_shared<UpstreamAttempt>(call, std::move(worker));
  a->self_ = a;
  return a;
}

void UpstreamAttempt::Start(const v1::GenerateRequest& request,
                            std::chrono::system_clock::time_point deadline) {
  request_ = request;
  if (deadline != std::chrono::system_clock::time_point::max()) context_.set_deadline(deadline);
  worker_->Prepare(&context_);
  span_ = Span::Start(call_->tracer(), "tinyserve.router.attempt", Span::kClient, call_->trace());
  span_->Set("tinyserve.worker", worker_->address());
  AttachTraceContext(span_->context(), &context_);
  worker_->api().async()->Generate(&context_, &request_, this);
  StartRead(&response_);
  StartCall();
}

void UpstreamAttempt::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows with the status
  call_->OnUpstreamMessage(response_);
  StartRead(&response_);
}

void UpstreamAttempt::OnDone(const grpc::Status& status) {
  std::shared_ptr<UpstreamAttempt> keep = std::move(self_);
  span_->Set("rpc.grpc.status_code", static_cast<int64_t>(status.error_code()));
  if (!status.ok()) span_->SetError(status.error_message());
  span_->End();  // before the call's own span, which OnUpstreamDone may end
  call_->OnUpstreamDone(this, status);
}

ProxyCall::ProxyCall(RouterCore* core, grpc::CallbackServerContext* context,
                     const grpc::ByteBuffer& buffer)
    : core_(core), context_(context), arrival_(NowSeconds()), slot_(core->admission) {
  const grpc::Status auth = CheckApiKey(*context, core_->api_key);
  // Calls without a valid key are not traced: they may not fill the exporter's queue.
  span_ = Span::Start(auth.ok() ? core->tracer : nullptr, "tinyserve.router.generate",
                      Span::kServer, TraceContextOf(*context));
  if (!auth.ok()) {
    End(auth);
    return;
  }
  if (core_->draining.load()) {
    End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "router is draining"));
    return;
  }
  if (grpc::Status s = ParseRequest(buffer, &request_); !s.ok()) {
    End(s);
    return;
  }
  if (request_.prompt_case() == v1::GenerateRequest::PROMPT_NOT_SET) {
    End(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                     "prompt: one of text, token_ids or chat must be set (prompt is empty)"));
    return;
  }
  if (request_.request_id().empty()) request_.set_request_id(core_->NewRequestId());
  blocks_ = PromptBlockHashes(request_);
  const Admission::Result admitted = slot_.Acquire([this] { Admitted(); }, request_.priority());
  if (admitted == Admission::Result::kAdmitted) {
    Admitted();
  } else if (admitted == Admission::Result::kRejected) {
    End(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "router queue is full; retry later"));
  }
}

grpc::Status ProxyCall::GoneStatus() const {
  if (context_->deadline() <= std::chrono::system_clock::now()) {
    return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
}

void ProxyCall::Admitted() {
  if (client_gone()) {
    End(GoneStatus());
    return;
  }
  Dispatch();
}

void ProxyCall::Dispatch() {
  std::shared_ptr<UpstreamAttempt> attempt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    RouteChoice choice =
        core_->policy->Pick(core_->Candidates(tried_, request_.lora_adapter()), blocks_);
    if (choice.worker != nullptr) {
      core_->metrics->CountDecision(choice.reason);
      tried_.push_back(choice.worker);
      last_worker_ = choice.worker;
      choice.worker->breaker().OnDispatch(NowSeconds());
      choice.worker->AddInflight();
      choice.worker->prefixes().Insert(blocks_);
      attempt = UpstreamAttempt::Create(this, choice.worker);
      attempt_ = attempt;
    }
  }
  if (attempt == nullptr) {
    End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no healthy worker"));
    return;
  }
  attempt->Start(request_, context_->deadline());
  if (client_gone()) attempt->Cancel();
}

void ProxyCall::OnUpstreamMessage(const v1::GenerateResponse& response) {
  if (response.has_complete() && response.complete().finish_reason() == v1::FINISH_REASON_ABORT &&
      !client_gone()) {
    std::lock_guard<std::mutex> lock(mu_);
    held_abort_ = response;  // the worker gave up on it (drain): migrate, see OnUpstreamDone
    return;
  }
  Forward(response);
}

void ProxyCall::Forward(const v1::GenerateResponse& response) {
  v1::GenerateResponse out = response;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (response.has_chunk()) {
      streamed_ids_.insert(streamed_ids_.end(), response.chunk().token_ids().begin(),
                           response.chunk().token_ids().end());
    }
    forwarded_ = true;
    if (response.has_chunk() && response.chunk().token_ids_size() > 0 && !first_token_) {
      first_token_ = true;
      core_->metrics->ttft().Observe(NowSeconds() - arrival_);
    }
    if (response.has_complete() && last_worker_ != nullptr) {
      out.mutable_complete()->set_worker(last_worker_->address());
    }
    if (response.has_error()) error_forwarded_ = true;
  }
  Enqueue(ToByteBuffer(out));
}

void ProxyCall::OnUpstreamDone(UpstreamAttempt* attempt, const grpc::Status& status) {
  const WorkerPtr& worker = attempt->worker();
  worker->RemoveInflight();
  bool retry = false, migrate = false;
  std::optional<v1::GenerateResponse> abort;
  {
    std::lock_guard<std::mutex> lock(mu_);
    attempt_.reset();
    const bool gone = client_gone();
    if (status.ok()) {
      worker->breaker().RecordSuccess();
    } else if (status.error_code() == grpc::StatusCode::UNAVAILABLE && !gone) {
      worker->breaker().RecordFailure(NowSeconds());
    }
    worker->UpdateBreakerGauge();
    const bool more = static_cast<int>(tried_.size()) < core_->max_attempts &&
                      !core_->Candidates(tried_, request_.lora_adapter()).empty();
    retry = !status.ok() && !gone && !forwarded_ && Retryable(status) && more;
    const bool worker_lost =
        status.error_code() == grpc::StatusCode::UNAVAILABLE || (status.ok() && held_abort_);
    migrate = !gone && forwarded_ && !error_forwarded_ && worker_lost && more;
    if (migrate) {
      request_.mutable_continuation_ids()->Assign(streamed_ids_.begin(), streamed_ids_.end());
      request_.mutable_sampling()->clear_prompt_logprobs();  // delivered with the first chunk
      held_abort_.reset();
    } else {
      abort = std::move(held_abort_);
      held_abort_.reset();
    }
  }
  if (migrate) {
    TS_LOG(INFO) << "request " << request_.request_id() << ": " << worker->address()
                 << " went away mid-stream (" << StatusCodeName(status.error_code())
                 << "); continuing on another worker after " << request_.continuation_ids_size()
                 << " tokens";
    core_->metrics->migrations().Increment();
    Dispatch();
    return;
  }
  if (abort.has_value()) Forward(*abort);  // nowhere to move it: the abort goes out after all
  if (retry) {
    TS_LOG(DEBUG) << "request " << request_.request_id() << ": " << worker->address() << " said "
                  << StatusCodeName(status.error_code()) << "; retrying elsewhere";
    core_->metrics->retries().Increment();
    Dispatch();
    return;
  }
  End(status);
}

void ProxyCall::OnClientGone() {
  std::shared_ptr<UpstreamAttempt> attempt;
  {
    std::lock_guard<std::mutex> lock(mu_);
    attempt = attempt_;
  }
  if (attempt != nullptr) {
    attempt->Cancel();
  } else if (slot_.Cancel()) {
    End(GoneStatus());
  }
}

void ProxyCall::End(const grpc::Status& status) {
  WorkerSeries* series = core_->metrics->none();
  bool add_error = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (ended_) return;
    ended_ = true;
    if (last_worker_ != nullptr) series = last_worker_->series();
    add_error = !status.ok() && forwarded_ && !error_forwarded_;
  }
  series->outcomes[static_cast<int>(OutcomeOf(status))]->Increment();
  core_->metrics->latency().Observe(NowSeconds() - arrival_);
  if (span_->recording()) {
    std::lock_guard<std::mutex> lock(mu_);
    span_->Set("gen_ai.request.id", request_.request_id());
    span_->Set("tinyserve.attempts", static_cast<int64_t>(tried_.size()));
    if (last_worker_ != nullptr) span_->Set("tinyserve.worker", last_worker_->address());
    span_->Set("rpc.grpc.status_code", static_cast<int64_t>(status.error_code()));
    if (!status.ok()) span_->SetError(status.error_message());
  }
  span_->End();
  slot_.Release();
  if (add_error) {
    v1::GenerateResponse error;
    error.set_request_id(request_.request_id());
    error.mutable_error()->set_code(static_cast<int>(status.error_code()));
    error.mutable_error()->set_message(SanitizeUtf8(status.error_message()));
    Enqueue(ToByteBuffer(error));
  }
  Close(status);  // last touch of `this`
}

}  // namespace tinyserve
