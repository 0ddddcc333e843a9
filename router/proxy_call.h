// File: router/proxy_call.h
// One Generate call through the router: admit (bounded in-flight + FIFO queue, else
// RESOURCE_EXHAUSTED), pick a worker (routing_policy.h), stream the worker's responses to the
// client, and end with the worker's status.
//
// Retries: if the worker fails before anything was forwarded (UNAVAILABLE: down, draining or
// unreachable; RESOURCE_EXHAUSTED: its queue is full), the request goes to another worker, up
// to RouterCore::max_attempts in all.
// Migration: if the worker goes away mid-stream (UNAVAILABLE, or a drain that aborts it: a
// Complete with FINISH_REASON_ABORT the client did not ask for), the request moves to another
// worker with the token ids streamed so far as GenerateRequest.continuation_ids; that worker
// re-prefills them and the stream goes on, so the client sees one uninterrupted stream. Other
// failures, or none left to try, end the stream with an Error message and the status.
// Cancellation and deadlines: the client's deadline is set on the upstream call; a client
// cancel cancels the upstream call (the worker then aborts the request and frees its pages);
// a request cancelled while queued leaves the queue.
// Breakers: UNAVAILABLE counts as a failure of that worker, a completed stream as a success.
//
// Lifetime: ProxyCall deletes itself in OnDone (queued_stream.h); it closes only after its
// last upstream attempt reported OnUpstreamDone. UpstreamAttempt keeps itself alive until its
// OnDone has returned.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "router/router_core.h"
#include "tinyserve/v1/tinyserve.grpc.pb.h"
#include "worker/server/queued_stream.h"
#include "worker/server/tracing.h"

namespace tinyserve {

class ProxyCall;

class UpstreamAttempt final : public grpc::ClientReadReactor<tinyserve::v1::GenerateResponse> {
 public:
  UpstreamAttempt(ProxyCall* call, WorkerPtr worker) : call_(call), worker_(std::move(worker)) {}
  static std::shared_ptr<UpstreamAttempt> Create(ProxyCall* call, WorkerPtr worker);

  void Start(const tinyserve::v1::GenerateRequest& request,
             std::chrono::system_clock::time_point deadline);
  void Cancel() { context_.TryCancel(); }
  const WorkerPtr& worker() const { return worker_; }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  ProxyCall* call_;
  WorkerPtr worker_;
  grpc::ClientContext context_;
  tinyserve::v1::GenerateRequest request_;
  tinyserve::v1::GenerateResponse response_;
  std::unique_ptr<Span> span_;  // "tinyserve.router.attempt" (CLIENT), the worker span's parent
  std::shared_ptr<UpstreamAttempt> self_;  // released in OnDone
};

class ProxyCall final : public QueuedStreamReactor {
 public:
  ProxyCall(RouterCore* core, grpc::CallbackServerContext* context,
            const grpc::ByteBuffer& request);

  // From the upstream attempt's reactor threads.
  void OnUpstreamMessage(const tinyserve::v1::GenerateResponse& response);
  void OnUpstreamDone(UpstreamAttempt* attempt, const grpc::Status& status);
  // The trace context an attempt continues (this call's span, or the client's passed on).
  const TraceContext& trace() const { return span_->context(); }
  Tracer* tracer() const { return core_->tracer; }

 private:
  void Admitted();  // holds an admission slot now
  void Dispatch();  // picks a worker and starts an attempt (or ends)
  void End(const grpc::Status& status);  // last step: metrics, slot, Close
  void Forward(const tinyserve::v1::GenerateResponse& response);  // to the client
  void OnClientGone() override;
  grpc::Status GoneStatus() const;

  RouterCore* core_;
  grpc::CallbackServerContext* context_;
  tinyserve::v1::GenerateRequest request_;
  std::vector<uint64_t> blocks_;
  double arrival_;
  std::unique_ptr<Span> span_;  // "tinyserve.router.generate"; ended in End
  AdmissionTicket slot_;

  std::mutex mu_;
  std::shared_ptr<UpstreamAttempt> attempt_;  // GUARDED_BY(mu_)
  std::vector<WorkerPtr> tried_;              // GUARDED_BY(mu_)
  WorkerPtr last_worker_;                     // GUARDED_BY(mu_)
  bool forwarded_ = false;                    // GUARDED_BY(mu_)
  bool first_token_ = false;                  // GUARDED_BY(mu_)
  bool error_forwarded_ = false;              // GUARDED_BY(mu_)
  std::vector<int32_t> streamed_ids_;         // GUARDED_BY(mu_) output ids sent to the client
  std::optional<tinyserve::v1::GenerateResponse> held_abort_;  // GUARDED_BY(mu_)
  bool ended_ = false;                        // GUARDED_BY(mu_)
};

}  // namespace tinyserve
