// Minimal leveled logging to stderr: SLUICE_LOG(INFO) << "text";
// The threshold is set once by the launcher (SetLogLevel) or from the
// SLUICE_LOG_LEVEL environment variable (DEBUG, INFO, WARNING, ERROR) at first use.
//
// Thread safety: each message is written with a single write call, so lines
// from different threads do not interleave.
#ifndef SLUICE_COMMON_LOGGING_H_
#define SLUICE_COMMON_LOGGING_H_

#include <sstream>
#include <string_view>

namespace sluice {

enum class LogLevel : int { kDEBUG = 0, kINFO = 1, kWARNING = 2, kERROR = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
// Parses "debug"/"info"/"warning"/"error" (any case); false if unknown.
bool ParseLogLevel(std::string_view text, LogLevel* level);

// On SIGSEGV, SIGBUS, SIGILL, SIGFPE or SIGABRT: writes the signal and the
// call stack (symbol names where the binary exports them) to stderr, then
// dies of the same signal. For programs run where no debugger is at hand
// (the device check, benchmarks).
void InstallCrashBacktrace();

namespace internal {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  LogMessage(const LogMessage&) = delete;
  LogMessage& operator=(const LogMessage&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace internal
}  // namespace sluice

#define SLUICE_LOG(level)                                  \
  (::sluice::LogLevel::k##level < ::sluice::GetLogLevel()) \
      ? (void)0                                            \
      : ::sluice::internal::LogVoidify() &                 \
            ::sluice::internal::LogMessage(::sluice::LogLevel::k##level, __FILE__, __LINE__).stream()

#endif  // SLUICE_COMMON_LOGGING_H_
