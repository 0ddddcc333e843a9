// File: worker/server/queued_stream.h
// A server-streaming reactor that never blocks: producers on any thread (the engine thread,
// a router's upstream reader) Enqueue() serialized messages and finally Close() with a status;
// the reactor writes them one at a time in order and then finishes the RPC.
//
// Threading: Enqueue/Close/client_gone may be called from any thread. Only one write is in
// flight; the next one starts from OnWriteDone. StartWrite/Finish are never called with the
// mutex held. When the client goes away (OnCancel, or a failed write), queued and later
// messages are dropped and OnClientGone() is called once so the owner can cancel upstream work;
// the owner must still Close() (exactly once) for the RPC to finish.
//
// Lifetime: the object deletes itself in OnDone, which gRPC calls after Finish completes.
// Close() is the owner's last call: after it returns (or once it has been called on another
// thread) the object may already be gone.
#pragma once

#include <deque>
#include <mutex>
#include <optional>

#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"

namespace tinyserve {

class QueuedStreamReactor : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  QueuedStreamReactor() = default;

  // Queues one message (dropped once the client is gone).
  void Enqueue(grpc::ByteBuffer message);
  // Ends the stream with `status` once every queued message is written.
  void Close(grpc::Status status);
  // True once the client cancelled or a write failed.
  bool client_gone() const;

  // grpc::ServerWriteReactor
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 protected:
  ~QueuedStreamReactor() override = default;
  // Called once, without the mutex, when the client goes away (cancel, deadline, write error).
  virtual void OnClientGone() {}
  // Called from OnDone just before the object deletes itself.
  virtual void OnFinished() {}

 private:
  void Progress();
  void MarkGone();

  mutable std::mutex mu_;
  std::deque<grpc::ByteBuffer> queue_;   // GUARDED_BY(mu_)
  grpc::ByteBuffer current_;             // the message being written
  bool writing_ = false;                 // GUARDED_BY(mu_)
  bool gone_ = false;                    // GUARDED_BY(mu_)
  bool gone_notified_ = false;           // GUARDED_BY(mu_)
  bool finish_called_ = false;           // GUARDED_BY(mu_)
  std::optional<grpc::Status> close_;    // GUARDED_BY(mu_)
};

}  // namespace tinyserve
