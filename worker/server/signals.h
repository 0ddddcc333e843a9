// File: worker/server/signals.h
// SIGTERM/SIGINT handling for the server commands, without async signal handlers: the command
// blocks both signals first thing (before any thread starts, so every thread inherits the
// mask), then its main thread waits for them synchronously.
#pragma once

#include <functional>

namespace tinyserve {

// Blocks SIGTERM and SIGINT in the calling thread (and the threads it creates later).
void BlockTerminationSignals();
// Waits up to timeout_seconds for SIGTERM or SIGINT; returns the signal, or 0 on timeout.
int WaitForTerminationSignal(double timeout_seconds);
// A server command's main loop: waits for SIGTERM or SIGINT, then runs drain() (logging both);
// a second signal during the drain exits the process at once. Returns 0, the exit status.
int DrainOnTerminationSignal(double grace_seconds, const std::function<void()>& drain);

}  // namespace tinyserve
