#include "worker/server/queued_stream.h"

#include <utility>

namespace tinyserve {

void QueuedStreamReactor::Enqueue(grpc::ByteBuffer message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (gone_ || close_.has_value()) return;
    queue_.push_back(std::move(message));
  }
  Progress();
}

void QueuedStreamReactor::Close(grpc::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (close_.has_value()) return;
    close_ = std::move(status);
  }
  Progress();
}

bool QueuedStreamReactor::client_gone() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gone_;
}

void QueuedStreamReactor::OnWriteDone(bool ok) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
  }
  if (!ok) MarkGone();
  Progress();
}

void QueuedStreamReactor::OnCancel() {
  MarkGone();
  Progress();
}

void QueuedStreamReactor::OnDone() {
  OnFinished();
  delete this;
}

void QueuedStreamReactor::MarkGone() {
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    gone_ = true;
    queue_.clear();
    if (!gone_notified_) {
      gone_notified_ = true;
      notify = true;
    }
  }
  if (notify) OnClientGone();
}

void QueuedStreamReactor::Progress() {
  enum { kNothing, kWrite, kFinish } action = kNothing;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_called_ || writing_) return;
    if (!gone_ && !queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      action = kWrite;
    } else if (close_.has_value()) {
      finish_called_ = true;
      status = *close_;
      action = kFinish;
    }
  }
  if (action == kWrite) {
    StartWrite(&current_);
  } else if (action == kFinish) {
    Finish(status);  // last touch of `this`: OnDone may run (and delete it) right away
  }
}

}  // namespace tinyserve
