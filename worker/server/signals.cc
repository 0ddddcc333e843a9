#include "worker/server/signals.h"

#include <pthread.h>
#include <signal.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <thread>

#include "common/log.h"

namespace tinyserve {
namespace {

sigset_t TerminationSet() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSet();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal(double timeout_seconds) {
  sigset_t set = TerminationSet();
  timespec ts;
  ts.tv_sec = static_cast<time_t>(std::floor(timeout_seconds));
  ts.tv_nsec = static_cast<long>((timeout_seconds - std::floor(timeout_seconds)) * 1e9);
  for (;;) {
    const int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig > 0) return sig;
    if (errno == EINTR) continue;
    return 0;  // EAGAIN: timed out
  }
}

int DrainOnTerminationSignal(double grace_seconds, const std::function<void()>& drain) {
  int sig = 0;
  while (sig == 0) sig = WaitForTerminationSignal(1.0);
  TS_LOG(INFO) << "signal " << sig << ": draining (grace " << grace_seconds << " s)";
  std::thread([] {
    if (WaitForTerminationSignal(1e9) != 0) {
      TS_LOG(WARNING) << "second signal: exiting without finishing the drain";
      std::_Exit(1);
    }
  }).detach();
  drain();
  TS_LOG(INFO) << "drained; exiting";
  return 0;
}

}  // namespace tinyserve
