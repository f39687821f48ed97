#include "sluice/common/shm.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>

extern char** environ;

namespace sluice {
namespace {

using namespace std::chrono_literals;

class ShmSegmentTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::random_device rd;
    prefix_ = "sltc" + std::to_string(::getpid()) + "x" + std::to_string(rd());
  }
  void TearDown() override {
    auto left = ListShmSegments({prefix_});
    ASSERT_TRUE(left.ok());
    EXPECT_EQ(*left, std::vector<std::string>{});
    for (const std::string& name : *left) (void)SharedMemorySegment::Unlink(name);
  }
  std::string Name(std::string_view leaf) { return ShmSegmentName({prefix_, leaf}); }
  std::string prefix_;
};

TEST_F(ShmSegmentTest, NamesAreValidated) {
  EXPECT_EQ(ShmSegmentName({"a", "b-c", "d_1"}), "/a.b-c.d_1");
  EXPECT_TRUE(ValidateShmNameComponent("weights-7_b", "x").ok());
  for (const std::string& bad : std::vector<std::string>{"", "a.b", "a/b", "a b", std::string(101, 'a')}) {
    Status s = ValidateShmNameComponent(bad, "store_name");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("store_name"), std::string::npos);
  }
  EXPECT_TRUE(SharedMemorySegment::ValidateName("/a.b").ok());
  for (const char* bad : {"a", "/", "/a/b", "//a", "/a b"}) {
    EXPECT_EQ(SharedMemorySegment::ValidateName(bad).code(), StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_EQ(SharedMemorySegment::Create("no-slash", 8).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ShmSegmentTest, CreateExclusiveOpenReadOnlyAndReadWriteThenUnlink) {
  const std::string name = Name("seg");
  auto a = SharedMemorySegment::Create(name, 8192);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(a->valid());
  EXPECT_EQ(a->size(), 8192u);
  EXPECT_EQ(a->access(), ShmAccess::kReadWrite);
  EXPECT_EQ(a->data()[100], std::byte{0});  // zero-filled
  std::memcpy(a->data(), "hello", 5);

  EXPECT_EQ(SharedMemorySegment::Create(name, 16).status().code(), StatusCode::kAlreadyExists);
  auto ro = SharedMemorySegment::Open(name, ShmAccess::kReadOnly);
  ASSERT_TRUE(ro.ok());
  EXPECT_EQ(ro->size(), 8192u);
  EXPECT_EQ(std::memcmp(ro->data(), "hello", 5), 0);
  auto rw = SharedMemorySegment::Open(name, ShmAccess::kReadWrite);
  ASSERT_TRUE(rw.ok());
  rw->data()[8191] = std::byte{7};
  EXPECT_EQ(a->data()[8191], std::byte{7});  // one memory, three mappings

  auto listed = ListShmSegments({prefix_});
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, std::vector<std::string>{name});

  ASSERT_TRUE(SharedMemorySegment::Unlink(name).ok());
  EXPECT_EQ(SharedMemorySegment::Unlink(name).code(), StatusCode::kNotFound);
  EXPECT_EQ(SharedMemorySegment::Open(name, ShmAccess::kReadOnly).status().code(), StatusCode::kNotFound);
  // Mappings outlive the name.
  EXPECT_EQ(std::memcmp(ro->data(), "hello", 5), 0);

  SharedMemorySegment moved = std::move(*a);
  EXPECT_FALSE(a->valid());
  EXPECT_EQ(a->data(), nullptr);
  EXPECT_TRUE(moved.valid());
  moved.Reset();
  EXPECT_FALSE(moved.valid());
}

TEST_F(ShmSegmentTest, EmptySegmentsMapNothing) {
  auto a = SharedMemorySegment::Create(Name("empty"), 0);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->data(), nullptr);
  auto b = SharedMemorySegment::Open(Name("empty"), ShmAccess::kReadOnly);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->size(), 0u);
  EXPECT_TRUE(SharedMemorySegment::Unlink(Name("empty")).ok());
}

TEST_F(ShmSegmentTest, ListingMatchesWholeComponentsOnly) {
  auto a = SharedMemorySegment::Create(ShmSegmentName({prefix_, "a", "x"}), 8);
  auto ab = SharedMemorySegment::Create(ShmSegmentName({prefix_, "ab", "x"}), 8);
  ASSERT_TRUE(a.ok() && ab.ok());
  auto listed = ListShmSegments({prefix_, "a"});
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(*listed, std::vector<std::string>{ShmSegmentName({prefix_, "a", "x"})});
  EXPECT_TRUE(SharedMemorySegment::Unlink(ShmSegmentName({prefix_, "a", "x"})).ok());
  EXPECT_TRUE(SharedMemorySegment::Unlink(ShmSegmentName({prefix_, "ab", "x"})).ok());
}

TEST(ProcessIdentityTest, DetectsLiveDeadReusedAndZombieProcesses) {
  const ProcessIdentity self = CurrentProcess();
  EXPECT_EQ(self.pid, ::getpid());
  EXPECT_GT(self.start_time, 0u);
  auto read = ReadProcessIdentity(self.pid);
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(*read, self);
  EXPECT_TRUE(IsProcessAlive(self));
  // Same pid, another start time: the pid was reused, the recorded process is gone.
  EXPECT_FALSE(IsProcessAlive({self.pid, self.start_time + 1}));
  EXPECT_FALSE(IsProcessAlive({0, 0}));
  EXPECT_FALSE(IsProcessAlive({0x7ffffff0, 1}));  // beyond pid_max
  EXPECT_EQ(ReadProcessIdentity(0x7ffffff0).status().code(), StatusCode::kNotFound);

  // A child that exited but is not reaped yet (a zombie) is dead.
  pid_t pid;
  char arg0[] = "true";
  char* argv[] = {arg0, nullptr};
  ASSERT_EQ(::posix_spawnp(&pid, "true", nullptr, nullptr, argv, environ), 0);
  auto child = ReadProcessIdentity(pid);  // may already be a zombie: the entry exists until reaped
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT), 0);
  EXPECT_FALSE(IsProcessAlive(*child));
  int status;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_FALSE(IsProcessAlive(*child));
}

TEST(ProcessIdentityTest, ReadsTheStateOfARunningAndAStoppedProcess) {
  auto self = ReadProcessState(::getpid());
  ASSERT_TRUE(self.ok()) << self.status().ToString();
  EXPECT_EQ(*self, 'R');  // this thread is reading it
  EXPECT_EQ(ReadProcessState(0x7ffffff0).status().code(), StatusCode::kNotFound);
  pid_t pid;
  char arg0[] = "sleep";
  char arg1[] = "30";
  char* argv[] = {arg0, arg1, nullptr};
  ASSERT_EQ(::posix_spawnp(&pid, "sleep", nullptr, nullptr, argv, environ), 0);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, static_cast<id_t>(pid), &info, WSTOPPED), 0);  // the stop has taken effect
  auto stopped = ReadProcessState(pid);
  ASSERT_TRUE(stopped.ok()) << stopped.status().ToString();
  EXPECT_EQ(*stopped, 'T');
  ::kill(pid, SIGKILL);
  int status;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
}

TEST_F(ShmSegmentTest, MutexTimesOutWhileHeldAndReportsADeadOwner) {
  auto seg = SharedMemorySegment::Create(Name("mutex"), sizeof(ShmMutex));
  ASSERT_TRUE(seg.ok());
  auto* mu = new (seg->data()) ShmMutex();
  ASSERT_TRUE(mu->Init().ok());
  auto locked = mu->Lock(1s);
  ASSERT_TRUE(locked.ok());
  EXPECT_FALSE(locked->previous_owner_died);
  std::thread other([&] {
    auto t0 = std::chrono::steady_clock::now();
    auto r = mu->Lock(30ms);
    EXPECT_EQ(r.status().code(), StatusCode::kTimeout);
    EXPECT_GE(std::chrono::steady_clock::now() - t0, 30ms);
  });
  other.join();
  mu->Unlock();

  // A thread that ends holding the lock: the next locker is told.
  std::thread dies([&] { ASSERT_TRUE(mu->Lock(1s).ok()); });
  dies.join();
  auto after = mu->Lock(1s);
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_TRUE(after->previous_owner_died);
  mu->Unlock();
  auto again = mu->Lock(1s);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->previous_owner_died);
  mu->Unlock();
  EXPECT_TRUE(SharedMemorySegment::Unlink(Name("mutex")).ok());
}

TEST_F(ShmSegmentTest, FutexWaitIsWokenAndBounded) {
  auto seg = SharedMemorySegment::Create(Name("futex"), sizeof(std::atomic<uint32_t>));
  ASSERT_TRUE(seg.ok());
  auto* word = new (seg->data()) std::atomic<uint32_t>(0);
  // Timeout.
  auto t0 = std::chrono::steady_clock::now();
  ShmFutexWait(word, 0, 20ms);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 15ms);
  // Value already differs: returns at once.
  t0 = std::chrono::steady_clock::now();
  ShmFutexWait(word, 1, 10s);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  // Woken by another thread through a second mapping of the same word.
  auto seg2 = SharedMemorySegment::Open(Name("futex"), ShmAccess::kReadWrite);
  ASSERT_TRUE(seg2.ok());
  auto* word2 = reinterpret_cast<std::atomic<uint32_t>*>(seg2->data());
  std::thread waker([&] {
    std::this_thread::sleep_for(20ms);
    word2->store(1);
    ShmFutexWakeAll(word2);
  });
  t0 = std::chrono::steady_clock::now();
  while (word->load() == 0 && std::chrono::steady_clock::now() - t0 < 10s) ShmFutexWait(word, 0, 10s);
  waker.join();
  EXPECT_EQ(word->load(), 1u);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);
  EXPECT_TRUE(SharedMemorySegment::Unlink(Name("futex")).ok());
}

}  // namespace
}  // namespace sluice
