// File: worker/server/embed_reactor.h
// One Embed call on a worker: parses the request, tokenizes every input, and runs them through
// the engine as embedding requests (GenerateRequest::pooling), at most max_batch (and max_queue)
// at a time so a large call neither fills the queue nor waits behind itself; the last result
// finishes the call.
//
// Errors: a bad request is INVALID_ARGUMENT naming the field; an input the engine refuses (too
// long; the queue full while none of the call's inputs runs) ends the call with that status and
// aborts the inputs still running. A full queue with some of them running waits for one to end;
// a drain that begins mid-call lets the call finish.
// Cancellation, Abort(<call id>) and the deadline abort the running inputs, whose pages the
// engine frees.
// Lifetime: created by TinyServeService::Embed, deletes itself in OnDone. The engine's sinks
// share the call's state (EmbedJob), never the reactor, which the job finishes exactly once.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "worker/server/worker_service.h"

namespace tinyserve {

class EmbedJob;

class EmbedReactor final : public grpc::ServerUnaryReactor {
 public:
  EmbedReactor(WorkerState* state, grpc::CallbackServerContext* context,
               const grpc::ByteBuffer& request, grpc::ByteBuffer* response);

 private:
  // The engine requests of the call's inputs, or why there are none.
  absl::StatusOr<std::vector<GenerateRequest>> Parse(WorkerState* state,
                                                     const grpc::CallbackServerContext& context,
                                                     const grpc::ByteBuffer& buffer);
  void OnCancel() override;
  void OnDone() override { delete this; }

  std::shared_ptr<EmbedJob> job_;
  std::string request_id_;
  bool normalize_ = false;
};

}  // namespace tinyserve
