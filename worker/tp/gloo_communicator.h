// File: worker/tp/gloo_communicator.h
// The Communicator over Gloo's TCP transport, for tensor parallelism on CPUs.
//
// Rendezvous goes through rank 0: rank 0 runs a TcpStoreServer (tcp_store.h) on
// rendezvous_addr; every rank publishes its Gloo addresses there and Gloo connects the full
// mesh. All-reduce uses Gloo's ring algorithm (every rank ends with the same bytes); broadcast
// and barrier are Gloo's. The rendezvous and every operation until StartupDone() are bounded by
// startup_timeout_s (the other ranks may still be loading the model), later ones by timeout_s:
// a rank that never arrives or a dead peer (its socket closes) turns into DeadlineExceeded or
// Unavailable. After the first failure the communicator is broken: every later call returns
// the same error at once (a Gloo context is not reusable after a timeout).
//
// Built when TINYSERVE_HAVE_GLOO (Debian's libgloo-dev).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/tp/communicator.h"

namespace tinyserve {

class TcpStoreServer;

// rendezvous_addr: host:port of rank 0's store. On rank 0, port 0 is allowed only together with
// an already-listening `server` (its port is used).
// server: rank 0 may pass a store it started itself (e.g. to learn the port before spawning the
// other ranks); the communicator takes ownership. Null: rank 0 listens on rendezvous_addr.
// startup_timeout_s: 0 means timeout_s.
absl::StatusOr<std::unique_ptr<Communicator>> MakeGlooCommunicator(
    int rank, int world, const std::string& rendezvous_addr, double timeout_s,
    std::unique_ptr<TcpStoreServer> server = nullptr, double startup_timeout_s = 0);

}  // namespace tinyserve
