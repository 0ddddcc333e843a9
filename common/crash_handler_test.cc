#include "common/crash_handler.h"

#include <signal.h>

#include "gtest/gtest.h"

namespace tinyserve {
namespace {

[[gnu::noinline]] void CrashHere() {
  raise(SIGSEGV);
  asm volatile("");  // not a tail call: this frame stays on the stack
}

TEST(CrashHandlerDeathTest, ReportsSignalAndStack) {
  // The child installs the handler and faults: stderr names the signal and the faulting frame,
  // and it still dies of SIGSEGV.
  EXPECT_EXIT(
      {
        InstallCrashHandler("/proc/self/exe");
        CrashHere();
      },
      testing::KilledBySignal(SIGSEGV), "fatal signal 11 \\(SEGV\\)(.|\n)*CrashHere");
}

}  // namespace
}  // namespace tinyserve
