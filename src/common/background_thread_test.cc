#include "sluice/common/background_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "sluice/common/mutex.h"

namespace sluice {
namespace {

using namespace std::chrono_literals;

// Generous deadline for "this should happen promptly"; only reached on failure.
constexpr auto kPatience = 10s;

// A one-shot flag the test thread can wait on with a deadline.
class Event {
 public:
  void Set() {
    MutexLock lock(&mu_);
    set_ = true;
    cv_.NotifyAll();
  }
  bool WaitFor(std::chrono::steady_clock::duration timeout) {
    MutexLock lock(&mu_);
    return cv_.WaitFor(&mu_, timeout, [&] { return set_; });
  }

 private:
  Mutex mu_;
  CondVar cv_;
  bool set_ = false;
};

TEST(BackgroundThreadTest, StartRunsBodyOnAnotherThread) {
  BackgroundThread thread("worker");
  EXPECT_EQ(thread.name(), "worker");
  EXPECT_FALSE(thread.running());
  Event ran;
  std::atomic<std::thread::id> body_thread{};
  ASSERT_TRUE(thread
                  .Start([&](std::stop_token) {
                    body_thread = std::this_thread::get_id();
                    ran.Set();
                  })
                  .ok());
  EXPECT_TRUE(thread.running());
  ASSERT_TRUE(ran.WaitFor(kPatience));
  thread.Stop();
  EXPECT_FALSE(thread.running());
  EXPECT_NE(body_thread.load(), std::this_thread::get_id());
}

TEST(BackgroundThreadTest, StopRequestsStopAndJoins) {
  BackgroundThread thread("looper");
  Event started;
  std::atomic<bool> saw_stop{false};
  std::atomic<bool> exited{false};
  ASSERT_TRUE(thread
                  .Start([&](std::stop_token stop) {
                    started.Set();
                    while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
                    saw_stop = true;
                    std::this_thread::sleep_for(20ms);  // Stop() must still wait for this
                    exited = true;
                  })
                  .ok());
  ASSERT_TRUE(started.WaitFor(kPatience));
  EXPECT_FALSE(saw_stop.load());
  thread.Stop();
  EXPECT_TRUE(saw_stop.load());
  EXPECT_TRUE(exited.load());
  EXPECT_FALSE(thread.running());
}

TEST(BackgroundThreadTest, DoubleStartIsFailedPrecondition) {
  BackgroundThread thread("twice");
  ASSERT_TRUE(thread
                  .Start([](std::stop_token stop) {
                    while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
                  })
                  .ok());
  std::atomic<bool> second_ran{false};
  Status s = thread.Start([&](std::stop_token) { second_ran = true; });
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("twice"), std::string::npos) << s.ToString();
  thread.Stop();
  EXPECT_FALSE(second_ran.load());
}

TEST(BackgroundThreadTest, CanRestartAfterStop) {
  BackgroundThread thread("restart");
  std::atomic<int> runs{0};
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(thread.Start([&](std::stop_token) { ++runs; }).ok());
    thread.Stop();
  }
  EXPECT_EQ(runs.load(), 3);
}

TEST(BackgroundThreadTest, DestructorStopsAndJoins) {
  std::atomic<bool> exited{false};
  Event started;
  {
    BackgroundThread thread("scoped");
    ASSERT_TRUE(thread
                    .Start([&](std::stop_token stop) {
                      started.Set();
                      while (!stop.stop_requested()) std::this_thread::sleep_for(1ms);
                      exited = true;
                    })
                    .ok());
    ASSERT_TRUE(started.WaitFor(kPatience));
  }
  EXPECT_TRUE(exited.load());
}

TEST(BackgroundThreadTest, StopIsIdempotentAndSafeWhenNeverStarted) {
  BackgroundThread never("never");
  never.Stop();
  never.Stop();
  EXPECT_FALSE(never.running());

  BackgroundThread thread("idem");
  ASSERT_TRUE(thread.Start([](std::stop_token) {}).ok());
  thread.Stop();
  thread.Stop();
  EXPECT_FALSE(thread.running());
}

TEST(BackgroundThreadTest, StopCallbackWakesBlockedBody) {
  // A body blocked on a condition variable is woken through a stop_callback.
  BackgroundThread thread("waiter");
  Mutex mu;
  CondVar cv;
  Event waiting;
  std::atomic<bool> woke_by_stop{false};
  ASSERT_TRUE(thread
                  .Start([&](std::stop_token stop) {
                    std::stop_callback wake(stop, [&] {
                      MutexLock lock(&mu);
                      cv.NotifyAll();
                    });
                    MutexLock lock(&mu);
                    waiting.Set();
                    woke_by_stop = cv.WaitFor(&mu, kPatience, [&] { return stop.stop_requested(); });
                  })
                  .ok());
  ASSERT_TRUE(waiting.WaitFor(kPatience));
  auto t0 = std::chrono::steady_clock::now();
  thread.Stop();
  EXPECT_TRUE(woke_by_stop.load());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kPatience / 2);
}

TEST(CondVarTest, WaitForTimesOutWhenPredicateStaysFalse) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  auto t0 = std::chrono::steady_clock::now();
  bool result = cv.WaitFor(&mu, 30ms, [] { return false; });
  auto waited = std::chrono::steady_clock::now() - t0;
  EXPECT_FALSE(result);
  EXPECT_GE(waited, 30ms);
}

TEST(CondVarTest, WaitForReturnsImmediatelyWhenPredicateHolds) {
  Mutex mu;
  CondVar cv;
  MutexLock lock(&mu);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(cv.WaitFor(&mu, kPatience, [] { return true; }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kPatience / 2);
}

TEST(CondVarTest, NotifyWakesWaiterBeforeDeadline) {
  Mutex mu;
  CondVar cv;
  bool ready = false;
  std::jthread notifier([&] {
    std::this_thread::sleep_for(20ms);
    MutexLock lock(&mu);
    ready = true;
    cv.NotifyOne();
  });
  MutexLock lock(&mu);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(cv.WaitFor(&mu, kPatience, [&] { return ready; }));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, kPatience / 2);
}

TEST(CondVarTest, LockIsHeldAgainAfterWait) {
  // After WaitFor returns the caller still owns the mutex: another thread
  // cannot get in until the caller's MutexLock goes out of scope.
  Mutex mu;
  CondVar cv;
  std::atomic<bool> other_got_lock{false};
  std::jthread other;
  {
    MutexLock lock(&mu);
    EXPECT_FALSE(cv.WaitFor(&mu, 1ms, [] { return false; }));
    other = std::jthread([&] {
      MutexLock inner(&mu);
      other_got_lock = true;
    });
    std::this_thread::sleep_for(20ms);
    EXPECT_FALSE(other_got_lock.load());
  }
  other.join();
  EXPECT_TRUE(other_got_lock.load());
}

}  // namespace
}  // namespace sluice
