// An owned background thread: started explicitly, asked to stop through a
// std::stop_token, and always joined (Stop() or the destructor). Nothing in
// Sluice detaches a thread.
//
// Thread safety: Start/Stop/running are called by the owner thread only; the
// body runs on the background thread and must poll its stop_token (or use the
// stop callback) so Stop() returns promptly.
#ifndef SLUICE_COMMON_BACKGROUND_THREAD_H_
#define SLUICE_COMMON_BACKGROUND_THREAD_H_

#include <functional>
#include <stop_token>
#include <string>
#include <thread>

#include "sluice/common/status.h"

namespace sluice {

class BackgroundThread {
 public:
  using Body = std::function<void(std::stop_token)>;

  // `name` appears in logs (and as the OS thread name, truncated to 15 chars).
  explicit BackgroundThread(std::string name);
  ~BackgroundThread();  // Stop()s and joins.
  BackgroundThread(const BackgroundThread&) = delete;
  BackgroundThread& operator=(const BackgroundThread&) = delete;

  // Errors: FailedPrecondition if already running.
  Status Start(Body body);
  // Requests stop and joins. Idempotent; safe when never started.
  void Stop();
  bool running() const { return thread_.joinable(); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::jthread thread_;
};

}  // namespace sluice

#endif  // SLUICE_COMMON_BACKGROUND_THREAD_H_
