#include "common/crash_handler.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>

#include "absl/debugging/symbolize.h"

namespace tinyserve {
namespace {

constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};

// Only async-signal-safe calls below: write(2), snprintf into a stack buffer (glibc's is safe
// for these conversions), backtrace(3) (libgcc's unwinder, loaded at install: it needs no frame
// pointers and walks through the signal frame) and absl's symbolizer (written for this use).
void Write(const char* s) { (void)!write(STDERR_FILENO, s, strlen(s)); }

void OnFatalSignal(int sig, siginfo_t* info, void*) {
  char line[512];
  snprintf(line, sizeof line, "F crash_handler] fatal signal %d (%s) at address %p, thread %ld\n",
           sig, sigabbrev_np(sig) != nullptr ? sigabbrev_np(sig) : "?",
           info != nullptr ? info->si_addr : nullptr, static_cast<long>(gettid()));
  Write(line);
  void* frames[64];
  const int n = backtrace(frames, 64);
  for (int i = 0; i < n; ++i) {
    char symbol[256] = "?";
    absl::Symbolize(frames[i], symbol, sizeof symbol);
    snprintf(line, sizeof line, "    @ %p  %s\n", frames[i], symbol);
    Write(line);
  }
  // Die of the same signal (SA_RESETHAND restored the default action): exit status and core
  // as if no handler ran.
  raise(sig);
}

}  // namespace

void InstallCrashHandler(const char* argv0) {
  absl::InitializeSymbolizer(argv0);
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not in the handler
  // On the main thread the handler runs on a stack of its own, so an overflow there is reported
  // too (other threads' handlers run on their own stacks).
  static char alt_stack[64 * 1024];
  stack_t ss{};
  ss.ss_sp = alt_stack;
  ss.ss_size = sizeof alt_stack;
  sigaltstack(&ss, nullptr);
  for (int sig : kSignals) {
    struct sigaction old {};
    if (sigaction(sig, nullptr, &old) == 0 && old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_sigaction = OnFatalSignal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(sig, &sa, nullptr);
  }
}

}  // namespace tinyserve
