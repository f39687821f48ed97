#include "sluice/common/background_thread.h"

#include <pthread.h>

#include <utility>

namespace sluice {

BackgroundThread::BackgroundThread(std::string name) : name_(std::move(name)) {}

BackgroundThread::~BackgroundThread() { Stop(); }

Status BackgroundThread::Start(Body body) {
  if (thread_.joinable()) return Status::FailedPrecondition("background thread '" + name_ + "' is already running");
  thread_ = std::jthread([body = std::move(body), name = name_.substr(0, 15)](std::stop_token stop) {
    pthread_setname_np(pthread_self(), name.c_str());
    body(stop);
  });
  return Status::Ok();
}

void BackgroundThread::Stop() {
  if (!thread_.joinable()) return;
  thread_.request_stop();
  thread_.join();
}

}  // namespace sluice
