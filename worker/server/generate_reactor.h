// File: worker/server/generate_reactor.h
// One Generate call on a worker: parses and validates the request, submits it to the engine,
// and streams what the engine's sink reports (Chunk per OnTokens, then Complete or Error).
//
// Cancellation: when the client cancels, its deadline passes or a write fails, the reactor
// calls Engine::Abort so the request's KV pages are freed at the next step; the engine still
// calls OnFinish, which closes the stream. The engine also gets the call's deadline.
// Lifetime: created by TinyServeService::Generate, deletes itself in OnDone (queued_stream.h).
// The engine's sink points at the reactor only until OnFinish, which is the sink's last call.
#pragma once

#include <memory>
#include <string>

#include "grpcpp/grpcpp.h"
#include "worker/server/queued_stream.h"
#include "worker/server/tracing.h"
#include "worker/server/worker_service.h"

namespace tinyserve {

class GenerateReactor final : public QueuedStreamReactor {
 public:
  GenerateReactor(WorkerState* state, grpc::CallbackServerContext* context,
                  const grpc::ByteBuffer& request);

  // From the engine thread (through the sink).
  void OnEngineTokens(const std::vector<GeneratedToken>& tokens, const RequestUsage& usage);
  // Kept for the first chunk (the engine calls it just before the first OnEngineTokens).
  void OnEnginePromptLogprobs(const std::vector<GeneratedToken>& tokens) { prompt_lp_ = tokens; }
  void OnEngineFinish(FinishReason reason, const RequestUsage& usage, const absl::Status& status);

 private:
  void Reject(const grpc::Status& status);  // before Submit: count it and close
  void OnClientGone() override;

  WorkerState* state_;
  std::string request_id_;
  std::atomic<bool> submitted_{false};
  bool want_logprobs_ = false;
  // Sent once, in the first chunk (Chunk.reasoning_start).
  tinyserve::v1::ReasoningStart reasoning_start_ = tinyserve::v1::REASONING_START_UNSPECIFIED;
  std::vector<GeneratedToken> prompt_lp_;
  std::unique_ptr<Span> span_;  // "tinyserve.worker.generate", under the caller's traceparent
};

}  // namespace tinyserve
