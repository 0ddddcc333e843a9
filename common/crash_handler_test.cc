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

void (*volatile null_function)() = nullptr;

[[gnu::noinline]] void CallNull() {
  null_function();
  asm volatile("");
}

TEST(CrashHandlerDeathTest, JumpToNullListsTheCallerFromTheStack) {
  // A call through a null pointer faults at pc 0, where the unwinder stops: the stack scan still
  // names the caller.
  EXPECT_EXIT(
      {
        InstallCrashHandler("/proc/self/exe");
        CallNull();
      },
      testing::KilledBySignal(SIGSEGV), "pc \\(nil\\)(.|\n)*stack scan(.|\n)*CallNull");
}

}  // namespace
}  // namespace tinyserve
