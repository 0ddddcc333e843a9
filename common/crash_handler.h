// File: common/crash_handler.h
// On a fatal signal (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT) the process writes the signal, the
// faulting thread's stack (symbolized) and the address to stderr, then dies of the same signal
// (so exit statuses and core dumps are unchanged). Operators get a trace in the pod's log
// instead of a bare "exited with -11"; llama.cpp and vLLM print one too.
#pragma once

namespace tinyserve {

// Once, early in main (argv0: for symbolization). Leaves handlers others installed first (a
// sanitizer's) in place.
void InstallCrashHandler(const char* argv0);

}  // namespace tinyserve
