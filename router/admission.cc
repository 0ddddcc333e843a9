#include "router/admission.h"

#include <algorithm>
#include <iterator>

namespace tinyserve {

Admission::Result Admission::Acquire(const void* token, std::function<void()> on_admit,
                                     int priority) {
  std::lock_guard<std::mutex> lock(mu_);
  if (inflight_ < max_inflight_ && queue_.empty()) {
    running_gauge_->Set(++inflight_);
    return Result::kAdmitted;
  }
  if (static_cast<int>(queue_.size()) >= max_queue_) return Result::kRejected;
  auto at = queue_.end();  // after every waiter of this priority or a more urgent one
  while (at != queue_.begin() && std::prev(at)->priority > priority) --at;
  queue_.insert(at, {token, std::move(on_admit), priority});
  waiting_gauge_->Set(static_cast<double>(queue_.size()));
  return Result::kQueued;
}

bool Admission::Cancel(const void* token) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = std::find_if(queue_.begin(), queue_.end(),
                         [&](const Waiter& w) { return w.token == token; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  waiting_gauge_->Set(static_cast<double>(queue_.size()));
  return true;
}

void Admission::Release() {
  std::function<void()> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (queue_.empty()) {
      running_gauge_->Set(--inflight_);
      return;
    }
    next = std::move(queue_.front().on_admit);  // the slot passes to the waiter
    queue_.pop_front();
    waiting_gauge_->Set(static_cast<double>(queue_.size()));
  }
  next();
}

Admission::Result AdmissionTicket::Acquire(std::function<void()> on_admit, int priority) {
  // Held across Acquire, so that a slot freed at once on another thread (which runs the
  // callback) sees queued_ already set.
  std::lock_guard<std::mutex> lock(mu_);
  const Admission::Result r = admission_->Acquire(
      this,
      [this, on_admit = std::move(on_admit)] {
        {
          std::lock_guard<std::mutex> lock(mu_);
          queued_ = false;
          held_ = true;
        }
        on_admit();
      },
      priority);
  queued_ = r == Admission::Result::kQueued;
  held_ = r == Admission::Result::kAdmitted;
  return r;
}

bool AdmissionTicket::Cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!queued_) return false;
  }
  if (!admission_->Cancel(this)) return false;  // admitted meanwhile
  std::lock_guard<std::mutex> lock(mu_);
  queued_ = false;
  return true;
}

void AdmissionTicket::Release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!held_) return;
    held_ = false;
  }
  admission_->Release();  // (may run the next waiter's callback: not under mu_)
}

int Admission::inflight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return inflight_;
}

int Admission::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

}  // namespace tinyserve
