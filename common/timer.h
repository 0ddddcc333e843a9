// File: common/timer.h
// Monotonic wall-clock helpers.
#pragma once

#include <chrono>

namespace tinyserve {

inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Unix time in seconds (comparable across hosts, unlike NowSeconds).
inline double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class Stopwatch {
 public:
  Stopwatch() : start_(NowSeconds()) {}
  double Seconds() const { return NowSeconds() - start_; }
  double Millis() const { return 1e3 * Seconds(); }
  void Reset() { start_ = NowSeconds(); }

 private:
  double start_;
};

}  // namespace tinyserve
