// File: router/circuit_breaker.h
// A per-worker circuit breaker. Closed: requests flow. After `failure_threshold` consecutive
// failures it opens: the worker gets no requests for `cooldown_seconds`; then it is half-open:
// one probe request may go, and its success closes the breaker while its failure reopens it.
// Failures are transport-level (UNAVAILABLE, connection failures), not bad requests.
//
// Threading: all methods are thread-safe.
#pragma once

#include <mutex>

namespace tinyserve {

class CircuitBreaker {
 public:
  CircuitBreaker(int failure_threshold, double cooldown_seconds)
      : threshold_(failure_threshold), cooldown_(cooldown_seconds) {}

  // True if a request may be sent now (closed, or half-open with no probe out).
  bool Available(double now) const;
  // Call when a request is sent; in half-open state it becomes the probe.
  void OnDispatch(double now);
  void RecordSuccess();
  void RecordFailure(double now);
  // True while open (including half-open, until a probe succeeds).
  bool open() const;

 private:
  const int threshold_;
  const double cooldown_;
  mutable std::mutex mu_;
  int failures_ = 0;             // consecutive; GUARDED_BY(mu_)
  bool open_ = false;            // GUARDED_BY(mu_)
  double open_until_ = 0;        // GUARDED_BY(mu_)
  bool probe_in_flight_ = false; // GUARDED_BY(mu_)
};

}  // namespace tinyserve
