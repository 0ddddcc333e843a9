// File: worker/tp/communicator.h
// Collectives of a tensor-parallel group: all-reduce (sum), broadcast and barrier.
// Implementations: in-process threads (tests), Gloo over TCP (CPU), NCCL (GPU). A collective
// that cannot complete within the timeout returns DeadlineExceeded or Unavailable, never hangs.
//
// Thread safety: one collective at a time per communicator, called by the rank's engine thread.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace tinyserve {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual absl::Status AllReduceSum(float* data, size_t n) = 0;
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  virtual absl::Status Barrier() = 0;
  // The group's start-up (rendezvous, the hello, the barrier once every rank has its cache) is
  // over: from now on collectives are bounded by the steady-state timeout, not the start-up one
  // (which covers the other ranks' model load). Implementations with one timeout ignore it.
  virtual void StartupDone() {}
};

// The size-1 group: every collective is a no-op.
std::unique_ptr<Communicator> MakeSingleProcessCommunicator();

// world_size communicators sharing memory, for ranks run as threads of one process (tests).
std::vector<std::unique_ptr<Communicator>> MakeInProcessGroup(int world_size,
                                                              double timeout_seconds = 30);

}  // namespace tinyserve
