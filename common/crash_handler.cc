#include "common/crash_handler.h"

#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <sys/prctl.h>
#include <ucontext.h>
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

void WriteFrame(const char* mark, void* pc, const char* symbol) {
  char line[512];
  snprintf(line, sizeof line, "    %s %p  %s\n", mark, pc, symbol);
  Write(line);
}

void OnFatalSignal(int sig, siginfo_t* info, void* context) {
  // A fault inside this handler (say, a damaged stack) then ends the process at once, by that
  // signal's default action, instead of a second report.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int s : kSignals) sigaction(s, &dfl, nullptr);
  char name[17] = {0};
  prctl(PR_GET_NAME, name);
  void* pc = nullptr;
  uintptr_t sp = 0;
#if defined(__x86_64__)
  if (context != nullptr) {
    const mcontext_t& mc = static_cast<ucontext_t*>(context)->uc_mcontext;
    pc = reinterpret_cast<void*>(mc.gregs[REG_RIP]);
    sp = static_cast<uintptr_t>(mc.gregs[REG_RSP]);
  }
#endif
  char line[512];
  snprintf(line, sizeof line,
           "F crash_handler] fatal signal %d (%s) at address %p, pc %p, thread %ld (%s)\n", sig,
           sigabbrev_np(sig) != nullptr ? sigabbrev_np(sig) : "?",
           info != nullptr ? info->si_addr : nullptr, pc, static_cast<long>(gettid()), name);
  Write(line);
  void* frames[64];
  const int n = backtrace(frames, 64);
  for (int i = 0; i < n; ++i) {
    char symbol[256] = "?";
    absl::Symbolize(frames[i], symbol, sizeof symbol);
    WriteFrame("@", frames[i], symbol);
  }
  if (n <= 3 && sp != 0) {
    // The unwinder stopped at the faulting frame (a jump to a bad address, e.g. a null function
    // pointer, has no unwind info): list the code addresses on the stack instead, the caller's
    // return address first. A scan: some entries are stale.
    Write("    stack scan (return addresses found on the stack):\n");
    const auto* words = reinterpret_cast<void* const*>(sp);
    for (int i = 0, shown = 0; i < 512 && shown < 24; ++i) {
      char symbol[256];
      if (absl::Symbolize(words[i], symbol, sizeof symbol)) {
        WriteFrame("?", words[i], symbol);
        ++shown;
      }
    }
  }
  // Die of the same signal (its default action is back): exit status and core as if no
  // handler ran.
  raise(sig);
}

}  // namespace

void InstallCrashHandler(const char* argv0) {
  absl::InitializeSymbolizer(argv0);
  void* warm[1];
  backtrace(warm, 1);  // loads the unwinder now, not in the handler
  // The main thread's handler runs on a stack of its own, so an overflow there is reported too;
  // other threads have no such stack: one that overflows its stack dies without a report.
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
