#include "sluice/common/logging.h"

#include <execinfo.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iterator>
#include <string>

#include "sluice/common/enum_names.h"

namespace sluice {
namespace {

LogLevel LevelFromEnvironment() {
  LogLevel level = LogLevel::kINFO;
  if (const char* env = std::getenv("SLUICE_LOG_LEVEL")) {
    if (!ParseLogLevel(env, &level)) level = LogLevel::kINFO;
  }
  return level;
}

std::atomic<int>& Threshold() {
  static std::atomic<int> threshold{static_cast<int>(LevelFromEnvironment())};
  return threshold;
}

const char* LevelLetter(LogLevel level) {
  static constexpr const char* kLetters[] = {"D", "I", "W", "E"};
  static_assert(std::size(kLetters) == static_cast<size_t>(LogLevel::kERROR) + 1);
  return EnumName(kLetters, level);
}

}  // namespace

void SetLogLevel(LogLevel level) { Threshold().store(static_cast<int>(level)); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(Threshold().load(std::memory_order_relaxed)); }

bool ParseLogLevel(std::string_view text, LogLevel* level) {
  std::string lower(text);
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "debug")
    *level = LogLevel::kDEBUG;
  else if (lower == "info")
    *level = LogLevel::kINFO;
  else if (lower == "warning" || lower == "warn")
    *level = LogLevel::kWARNING;
  else if (lower == "error")
    *level = LogLevel::kERROR;
  else
    return false;
  return true;
}

namespace internal {

LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  const char* base = std::strrchr(file, '/');
  auto now = std::chrono::system_clock::now();
  std::time_t secs = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char when[32];
  std::strftime(when, sizeof(when), "%H:%M:%S", &tm);
  stream_ << LevelLetter(level) << ' ' << when << ' ' << (base ? base + 1 : file) << ':' << line << "] ";
}

LogMessage::~LogMessage() {
  stream_ << '\n';
  std::string text = stream_.str();
  // One write per line keeps concurrent messages whole.
  ssize_t ignored = ::write(STDERR_FILENO, text.data(), text.size());
  (void)ignored;
  (void)level_;
}

}  // namespace internal
namespace {

void CrashHandler(int sig) {
  // Only async-signal-safe calls: write(2) and backtrace_symbols_fd.
  const char* name = sig == SIGSEGV  ? "SIGSEGV"
                     : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGILL ? "SIGILL"
                     : sig == SIGFPE ? "SIGFPE"
                                     : "SIGABRT";
  const char head[] = "\n*** fatal signal ";
  (void)!::write(STDERR_FILENO, head, sizeof(head) - 1);
  (void)!::write(STDERR_FILENO, name, std::strlen(name));
  (void)!::write(STDERR_FILENO, "; call stack:\n", 14);
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void InstallCrashBacktrace() {
  void* warm[1];
  ::backtrace(warm, 1);  // loads libgcc now, not inside the handler
  for (int sig : {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT}) ::signal(sig, CrashHandler);
}

}  // namespace sluice
