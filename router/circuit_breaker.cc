#include "router/circuit_breaker.h"

namespace tinyserve {

bool CircuitBreaker::Available(double now) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!open_) return true;
  return now >= open_until_ && !probe_in_flight_;
}

void CircuitBreaker::OnDispatch(double now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_ && now >= open_until_) probe_in_flight_ = true;
}

void CircuitBreaker::RecordSuccess() {
  std::lock_guard<std::mutex> lock(mu_);
  failures_ = 0;
  open_ = false;
  probe_in_flight_ = false;
}

void CircuitBreaker::RecordFailure(double now) {
  std::lock_guard<std::mutex> lock(mu_);
  ++failures_;
  if (open_ || failures_ >= threshold_) {
    open_ = true;
    open_until_ = now + cooldown_;
    probe_in_flight_ = false;
  }
}

bool CircuitBreaker::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return open_;
}

}  // namespace tinyserve
