// File: common/log.h
// Minimal logging to stderr and CHECK for broken invariants (abort with file and line).
// Debian's Abseil 20220623 predates absl/log, so this stands in for LOG/CHECK.
//
//   TS_LOG(INFO) << "loaded " << n << " tensors";
//   TS_CHECK(page < num_pages_) << "page " << page;
#pragma once

#include <cstdlib>
#include <sstream>
#include <string_view>

namespace tinyserve {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

// Messages below this level are dropped. Set from TINYSERVE_LOG_LEVEL (debug, info, warning,
// error) at first use; default info.
LogLevel MinLogLevel();
void SetMinLogLevel(LogLevel level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();  // Writes the line; aborts for kFatal.
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

// Swallows a stream expression when the level is disabled.
struct LogVoidify {
  void operator&(std::ostream&) {}
};

}  // namespace tinyserve

#define TS_LOG_LEVEL_DEBUG ::tinyserve::LogLevel::kDebug
#define TS_LOG_LEVEL_INFO ::tinyserve::LogLevel::kInfo
#define TS_LOG_LEVEL_WARNING ::tinyserve::LogLevel::kWarning
#define TS_LOG_LEVEL_ERROR ::tinyserve::LogLevel::kError
#define TS_LOG_LEVEL_FATAL ::tinyserve::LogLevel::kFatal

#define TS_LOG(level)                                      \
  (TS_LOG_LEVEL_##level < ::tinyserve::MinLogLevel())      \
      ? (void)0                                            \
      : ::tinyserve::LogVoidify() &                        \
            ::tinyserve::LogMessage(TS_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define TS_CHECK(cond)                                                                     \
  (cond) ? (void)0                                                                         \
         : ::tinyserve::LogVoidify() &                                                     \
               ::tinyserve::LogMessage(::tinyserve::LogLevel::kFatal, __FILE__, __LINE__) \
                       .stream()                                                           \
                   << "Check failed: " #cond " "
