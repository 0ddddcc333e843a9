// File: router/admission.h
// The router's bound on work: at most max_inflight requests proxied at once, and at most
// max_queue more waiting for a slot, by priority (lower first, as GenerateRequest.priority)
// and FIFO within one; beyond that, RESOURCE_EXHAUSTED. A waiting request whose client goes
// away leaves the queue (Cancel).
//
// Threading: thread-safe. Admission callbacks run on the thread that released the slot,
// without the mutex held.
#pragma once

#include <deque>
#include <functional>
#include <mutex>

#include "prometheus/gauge.h"

namespace tinyserve {

class Admission {
 public:
  // The gauges follow the queue's length and the slots held.
  Admission(int max_inflight, int max_queue, prometheus::Gauge* waiting_gauge,
            prometheus::Gauge* running_gauge)
      : max_inflight_(max_inflight),
        max_queue_(max_queue),
        waiting_gauge_(waiting_gauge),
        running_gauge_(running_gauge) {}

  enum class Result { kAdmitted, kQueued, kRejected };
  // Takes a slot now (kAdmitted), or queues `on_admit` to run when one frees (kQueued), or
  // neither (kRejected). `token` identifies the waiter for Cancel.
  Result Acquire(const void* token, std::function<void()> on_admit, int priority = 0);
  // Removes a queued waiter; false if it was not queued (already admitted or unknown).
  bool Cancel(const void* token);
  // Frees a slot (hands it to the first waiter, if any).
  void Release();

  int inflight() const;
  int waiting() const;

 private:
  struct Waiter {
    const void* token;
    std::function<void()> on_admit;
    int priority;
  };
  const int max_inflight_, max_queue_;
  prometheus::Gauge* waiting_gauge_;
  prometheus::Gauge* running_gauge_;
  mutable std::mutex mu_;
  int inflight_ = 0;            // GUARDED_BY(mu_)
  std::deque<Waiter> queue_;    // GUARDED_BY(mu_)
};

// One call's place in an Admission: queued for a slot, holding one, or neither. The call's
// side of the protocol (ProxyCall, the router's Embed): Acquire once, Cancel when its client
// goes away, Release when it ends.
class AdmissionTicket {
 public:
  explicit AdmissionTicket(Admission* admission) : admission_(admission) {}

  // Admission::Acquire. kAdmitted: the slot is held now (on_admit does not run); kQueued:
  // on_admit runs, with the slot held, when one frees.
  Admission::Result Acquire(std::function<void()> on_admit, int priority);
  // Leaves the queue: true if it was still waiting (on_admit will not run), false otherwise.
  bool Cancel();
  // Frees the slot if it holds one; later calls do nothing.
  void Release();

 private:
  Admission* admission_;
  std::mutex mu_;
  bool queued_ = false;  // GUARDED_BY(mu_)
  bool held_ = false;    // GUARDED_BY(mu_)
};

}  // namespace tinyserve
