// Cross-process tests of the shared-memory store. Children are this binary,
// re-executed (posix_spawn) to run one ShmChild.DISABLED_* test with its
// parameters in the environment; they report through their exit status and
// single bytes on fd 3.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <thread>

#include "shm/shm_test_util.h"
#include "sluice/checkpoint_engine/shm_store.h"

namespace sluice::checkpoint_engine {
namespace {

using namespace std::chrono_literals;
using testing::CheckSnapshot;
using testing::ChildEnv;
using testing::ChildProcess;
using testing::MakeVersion;
using testing::SignalParent;
using testing::TestLayout;

constexpr uint32_t kMaxReaders = 8;
constexpr uint32_t kPinsPerReader = 2;
constexpr auto kPatience = 20s;  // only reached when something is broken

ShmPublisherOptions ChildPublisherOptions() {
  ShmPublisherOptions o;
  o.shm_prefix = ChildEnv("SLUICE_SHM_TEST_PREFIX");
  o.store_name = ChildEnv("SLUICE_SHM_TEST_STORE");
  o.layout = TestLayout();
  o.max_readers = kMaxReaders;
  o.max_pins_per_reader = kPinsPerReader;
  return o;
}

ShmSubscriberOptions SubscriberOptions(const std::string& prefix, const std::string& store) {
  ShmSubscriberOptions o;
  o.shm_prefix = prefix;
  o.store_name = store;
  o.expected_layout = TestLayout();
  o.attach_timeout = kPatience;
  return o;
}

int64_t EnvInt(const char* name) { return std::stoll(ChildEnv(name)); }

// Blocks until `readers` subscribers are attached (so none misses a version).
void WaitForReaders(ShmPublisher& pub, size_t readers) {
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (std::chrono::steady_clock::now() < deadline) {
    auto s = pub.stats();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    if (s->readers_attached >= readers) return;
    std::this_thread::sleep_for(2ms);
  }
  FAIL() << "fewer than " << readers << " readers attached";
}

bool ExitedCleanly(int status) { return status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
bool KilledBySigkill(int status) { return status != -1 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }

// ------------------------------------------------------------- child modes

// Publishes versions 1..N as fast as it can, with short random pauses.
TEST(ShmChild, DISABLED_Publisher) {
  auto pub = ShmPublisher::Attach(ChildPublisherOptions());
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  WaitForReaders(**pub, static_cast<size_t>(EnvInt("SLUICE_SHM_TEST_WAIT_READERS")));
  std::mt19937 rng(1);
  const int64_t versions = EnvInt("SLUICE_SHM_TEST_VERSIONS");
  for (int64_t v = 1; v <= versions; ++v) {
    ASSERT_TRUE((*pub)->Publish(v, MakeVersion(TestLayout(), v)).ok());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1500));
  }
}

// Pins snapshots at random moments (latest, waited-for, older), holds up to
// two, and checks each is one whole version with valid checksums, both as
// zero-copy views and as verified copies.
TEST(ShmChild, DISABLED_Reader) {
  const std::string prefix = ChildEnv("SLUICE_SHM_TEST_PREFIX");
  auto sub = ShmSubscriber::Attach(SubscriberOptions(prefix, ChildEnv("SLUICE_SHM_TEST_STORE")));
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  const int64_t final_version = EnvInt("SLUICE_SHM_TEST_VERSIONS");
  std::mt19937 rng(static_cast<uint32_t>(EnvInt("SLUICE_SHM_TEST_SEED")));
  const Layout layout = TestLayout();
  std::vector<std::vector<std::byte>> standby;
  for (const TensorSpec& spec : layout) standby.emplace_back(CheckedNumel(spec.shape).value() * DTypeSize(spec.dtype));

  std::vector<ShmVersionHandle> held;
  int64_t latest_seen = kNoVersion;
  int snapshots = 0;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (latest_seen < final_version && std::chrono::steady_clock::now() < deadline) {
    Result<ShmVersionHandle> h = Status::NotFound("");
    switch (rng() % 3) {
      case 0:
        h = (*sub)->AcquireLatest();
        break;
      case 1:
        h = (*sub)->WaitForVersion(latest_seen + 1, 50ms);
        break;
      default:
        h = latest_seen > 0 ? (*sub)->Acquire(1 + static_cast<int64_t>(rng() % latest_seen)) : (*sub)->AcquireLatest();
    }
    if (!h.ok()) {
      const StatusCode c = h.status().code();
      ASSERT_TRUE(c == StatusCode::kNotFound || c == StatusCode::kTimeout || c == StatusCode::kResourceExhausted)
          << h.status().ToString();
      if (c == StatusCode::kResourceExhausted) held.clear();
      continue;
    }
    ++snapshots;
    ASSERT_EQ(CheckSnapshot(*h, layout), "");
    ASSERT_TRUE(h->Verify().ok()) << h->Verify().ToString();
    if (rng() % 4 == 0) {
      std::vector<std::span<std::byte>> spans(standby.begin(), standby.end());
      ASSERT_TRUE(h->CopyTo(spans).ok());
      for (size_t t = 0; t < layout.size(); ++t) {
        ASSERT_EQ(testing::CheckTensorBytes(layout[t], t, h->version(), standby[t].data(), standby[t].size()), "");
      }
    }
    latest_seen = std::max(latest_seen, h->version());
    if (rng() % 2 == 0) held.push_back(*h);
    if (held.size() > 2 || (!held.empty() && rng() % 3 == 0)) held.erase(held.begin());
    // What stays pinned never changes under the reader.
    for (const ShmVersionHandle& old : held) ASSERT_EQ(CheckSnapshot(old, layout), "");
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
  }
  EXPECT_EQ(latest_seen, final_version);
  std::fprintf(stderr, "reader %d: %d snapshots checked\n", static_cast<int>(::getpid()), snapshots);
}

// Publishes 1 .. N-1, then stages N (default 3) and pauses half way until it
// is killed. Nobody pins meanwhile, so from version 3 on each staging goes
// into the recycled segment of the version two before it.
TEST(ShmChild, DISABLED_PauseMidPublish) {
  ShmPublisherOptions o = ChildPublisherOptions();
  constexpr size_t kHalf = (64 + 32 + 32 + 16) * 1024 / 2;
  const char* pause_at = std::getenv("SLUICE_SHM_TEST_PAUSE_AT");
  const int64_t paused_version = pause_at != nullptr ? std::stoll(pause_at) : 3;
  o.test_hooks.after_put = [paused_version](int64_t version, size_t staged) {
    if (version != paused_version || staged < kHalf) return;
    SignalParent();
    std::this_thread::sleep_for(kPatience);
    ADD_FAILURE() << "paused publisher was not killed";
    std::_Exit(1);
  };
  auto pub = ShmPublisher::Attach(o);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  WaitForReaders(**pub, static_cast<size_t>(EnvInt("SLUICE_SHM_TEST_WAIT_READERS")));
  for (int64_t v = 1; v < paused_version; ++v) ASSERT_TRUE((*pub)->Publish(v, MakeVersion(TestLayout(), v)).ok());
  (void)(*pub)->Publish(paused_version, MakeVersion(TestLayout(), paused_version));
  ADD_FAILURE() << "publish of version " << paused_version << " returned";
}

// Publishes 1, then dies (SIGKILL) inside the commit of 2, holding the lock.
TEST(ShmChild, DISABLED_DieInsideCommit) {
  ShmPublisherOptions o = ChildPublisherOptions();
  o.test_hooks.inside_commit_lock = [](int64_t version) {
    if (version != 2) return;
    SignalParent();
    ::raise(SIGKILL);
  };
  auto pub = ShmPublisher::Attach(o);
  ASSERT_TRUE(pub.ok()) << pub.status().ToString();
  WaitForReaders(**pub, static_cast<size_t>(EnvInt("SLUICE_SHM_TEST_WAIT_READERS")));
  ASSERT_TRUE((*pub)->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  (void)(*pub)->Publish(2, MakeVersion(TestLayout(), 2));
  ADD_FAILURE() << "survived its own SIGKILL";
}

// Pins the latest version, checks it, and holds the pin until killed.
TEST(ShmChild, DISABLED_PinAndHold) {
  auto sub =
      ShmSubscriber::Attach(SubscriberOptions(ChildEnv("SLUICE_SHM_TEST_PREFIX"), ChildEnv("SLUICE_SHM_TEST_STORE")));
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  auto h = (*sub)->AcquireLatest();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_EQ(h->version(), EnvInt("SLUICE_SHM_TEST_EXPECT_VERSION"));
  ASSERT_EQ(CheckSnapshot(*h, TestLayout()), "");
  SignalParent();
  std::this_thread::sleep_for(kPatience);
  ADD_FAILURE() << "pinning reader was not killed";
}

// Pins and releases versions in a tight loop (the latest, or the one just
// superseded), checking each, until killed; signals after its first pin.
TEST(ShmChild, DISABLED_PinInALoop) {
  auto sub =
      ShmSubscriber::Attach(SubscriberOptions(ChildEnv("SLUICE_SHM_TEST_PREFIX"), ChildEnv("SLUICE_SHM_TEST_STORE")));
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  const Layout layout = TestLayout();
  bool signalled = false;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  for (uint64_t i = 0; std::chrono::steady_clock::now() < deadline; ++i) {
    const int64_t latest = (*sub)->latest_version();
    auto h = (i % 2 == 0 || latest < 1) ? (*sub)->AcquireLatest() : (*sub)->Acquire(latest - 1);
    if (!h.ok()) {
      ASSERT_EQ(h.status().code(), StatusCode::kNotFound) << h.status().ToString();
      continue;
    }
    ASSERT_EQ(CheckSnapshot(*h, layout), "");
    if (!signalled) {
      SignalParent();
      signalled = true;
    }
  }
  ADD_FAILURE() << "pinning reader was not killed";
}

// ------------------------------------------------------------ parent tests

class ShmStoreProcessTest : public ::testing::Test {
 protected:
  void SetUp() override { prefix_ = testing::UniquePrefix(); }
  void TearDown() override {
    EXPECT_EQ(testing::SegmentsWithPrefix(prefix_), std::vector<std::string>{});
    testing::RemoveSegmentsWithPrefix(prefix_);
  }
  std::map<std::string, std::string> Env(std::map<std::string, std::string> extra) {
    extra["SLUICE_SHM_TEST_PREFIX"] = prefix_;
    extra["SLUICE_SHM_TEST_STORE"] = "w";
    return extra;
  }
  std::unique_ptr<ShmSubscriber> Subscribe() {
    auto s = ShmSubscriber::Attach(SubscriberOptions(prefix_, "w"));
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? std::move(s).value() : nullptr;
  }
  std::unique_ptr<ShmPublisher> Publisher() {
    ShmPublisherOptions o;
    o.shm_prefix = prefix_;
    o.store_name = std::string(1, 'w');  // not = "w": GCC 12 -Wrestrict false positive
    o.layout = TestLayout();
    o.max_readers = kMaxReaders;
    o.max_pins_per_reader = kPinsPerReader;
    auto p = ShmPublisher::Attach(o);
    EXPECT_TRUE(p.ok()) << p.status().ToString();
    return p.ok() ? std::move(p).value() : nullptr;
  }
  bool SegmentExists(const std::string& suffix) {
    return SharedMemorySegment::Open("/" + prefix_ + ".w." + suffix, ShmAccess::kReadOnly).ok();
  }
  std::string prefix_;
};

TEST_F(ShmStoreProcessTest, NoTornReadsAcrossProcesses) {
  constexpr int kReaders = 3;
  constexpr int64_t kVersions = 60;
  ChildProcess publisher =
      ChildProcess::Spawn("Publisher", Env({{"SLUICE_SHM_TEST_VERSIONS", std::to_string(kVersions)},
                                            {"SLUICE_SHM_TEST_WAIT_READERS", std::to_string(kReaders + 1)}}));
  std::vector<ChildProcess> readers;
  for (int r = 0; r < kReaders; ++r) {
    readers.push_back(ChildProcess::Spawn("Reader", Env({{"SLUICE_SHM_TEST_VERSIONS", std::to_string(kVersions)},
                                                         {"SLUICE_SHM_TEST_SEED", std::to_string(100 + r)}})));
  }
  auto sub = Subscribe();
  ASSERT_TRUE(sub);

  // While they run: the memory bound holds in every consistent snapshot, and
  // /dev/shm never holds more than the hard cap.
  int samples = 0;
  const auto deadline = std::chrono::steady_clock::now() + kPatience;
  while (sub->latest_version() < kVersions && std::chrono::steady_clock::now() < deadline) {
    auto s = sub->stats();
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    const VersionStoreStats& v = s->versions;
    ASSERT_LE(v.versions_in_memory.size(), v.pinned.size() + 1);
    ASSERT_LE(v.bytes_held, v.max_bytes_held);
    ASSERT_LE(testing::SegmentBytesWithPrefix(prefix_),
              (kMaxReaders * kPinsPerReader + 2) * s->version_segment_bytes + s->control_segment_bytes);
    if (auto h = sub->AcquireLatest(); h.ok()) {
      ASSERT_EQ(CheckSnapshot(*h, TestLayout()), "");
    }
    ++samples;
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_GT(samples, 0);
  EXPECT_TRUE(ExitedCleanly(publisher.Wait(kPatience))) << "publisher failed";
  for (ChildProcess& r : readers) EXPECT_TRUE(ExitedCleanly(r.Wait(kPatience))) << "reader " << r.pid() << " failed";
  auto s = sub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->versions.latest_version, kVersions);
  EXPECT_EQ(s->versions.commits, static_cast<uint64_t>(kVersions));
  EXPECT_EQ(s->versions.versions_in_memory, (std::vector<int64_t>{kVersions}));
  // Readers pinned versions while their segments were being recycled.
  EXPECT_GT(s->segments_recycled, 0u);
  sub.reset();  // the last participant: everything goes
}

TEST_F(ShmStoreProcessTest, PublisherKilledMidPublishLeavesTheOldVersionAndANewPublisherResumes) {
  ChildProcess child = ChildProcess::Spawn("PauseMidPublish", Env({{"SLUICE_SHM_TEST_WAIT_READERS", "1"}}));
  auto sub = Subscribe();
  ASSERT_TRUE(sub);
  ASSERT_TRUE(child.WaitForSignal(kPatience)) << "publisher never paused mid-publish";
  auto s = sub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->versions.latest_version, 2);
  EXPECT_EQ(s->versions.staging_version, 3);
  EXPECT_TRUE(s->publisher_alive);
  EXPECT_TRUE(SegmentExists("v3"));
  auto before = sub->AcquireLatest();
  ASSERT_TRUE(before.ok());

  child.Kill();
  EXPECT_TRUE(KilledBySigkill(child.Wait(kPatience)));
  // Readers keep serving version 2, whole.
  auto after = sub->AcquireLatest();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  EXPECT_EQ(after->version(), 2);
  EXPECT_EQ(CheckSnapshot(*after, TestLayout()), "");
  EXPECT_TRUE(after->Verify().ok());
  EXPECT_EQ(CheckSnapshot(*before, TestLayout()), "");
  Status waited = sub->WaitForVersion(3, 20ms).status();
  EXPECT_EQ(waited.code(), StatusCode::kTimeout);
  EXPECT_NE(waited.message().find("is dead"), std::string::npos) << waited.ToString();

  // A new publisher sees the old one is dead, drops its staging, resumes.
  auto pub = Publisher();
  ASSERT_TRUE(pub);
  EXPECT_FALSE(SegmentExists("v3"));
  s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_GE(s->recoveries, 1u);
  EXPECT_EQ(s->versions.staging_version, kNoVersion);
  EXPECT_EQ(s->versions.aborts, 1u);
  EXPECT_EQ(pub->latest_version(), 2);
  EXPECT_EQ(pub->BeginPublish(2).status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(pub->Publish(3, MakeVersion(TestLayout(), 3)).ok());
  auto three = sub->WaitForVersion(3, kPatience);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(CheckSnapshot(*three, TestLayout()), "");
}

TEST_F(ShmStoreProcessTest, PublisherKilledHoldingTheControlLockIsRepaired) {
  ChildProcess child = ChildProcess::Spawn("DieInsideCommit", Env({{"SLUICE_SHM_TEST_WAIT_READERS", "1"}}));
  auto sub = Subscribe();
  ASSERT_TRUE(sub);
  ASSERT_TRUE(child.WaitForSignal(kPatience));
  EXPECT_TRUE(KilledBySigkill(child.Wait(kPatience)));
  // The commit of 2 never completed: the lock-free view still says 1, and
  // the first locker (this pin) repairs the half-written state.
  EXPECT_EQ(sub->latest_version(), 1);
  auto h = sub->AcquireLatest();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->version(), 1);
  EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
  auto s = sub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_GE(s->recoveries, 2u);  // the lock, and the dead publisher
  EXPECT_EQ(s->versions.versions_in_memory, (std::vector<int64_t>{1}));
  EXPECT_EQ(s->versions.staging_version, kNoVersion);
  EXPECT_EQ(s->publisher.pid, 0);
  EXPECT_FALSE(SegmentExists("v2"));

  auto pub = Publisher();
  ASSERT_TRUE(pub);
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  auto two = sub->AcquireLatest();
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(two->version(), 2);
  EXPECT_EQ(CheckSnapshot(*two, TestLayout()), "");
}

TEST_F(ShmStoreProcessTest, ReaderKilledHoldingAPinReleasesItAndOthersAreUnaffected) {
  auto pub = Publisher();
  ASSERT_TRUE(pub);
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  ChildProcess child = ChildProcess::Spawn("PinAndHold", Env({{"SLUICE_SHM_TEST_EXPECT_VERSION", "1"}}));
  ASSERT_TRUE(child.WaitForSignal(kPatience)) << "reader never pinned";
  auto other = Subscribe();
  ASSERT_TRUE(other);
  ASSERT_TRUE(pub->Publish(2, MakeVersion(TestLayout(), 2)).ok());
  auto v2 = other->AcquireLatest();
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(pub->Publish(3, MakeVersion(TestLayout(), 3)).ok());
  auto s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->versions.versions_in_memory, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(s->readers_attached, 2u);
  EXPECT_TRUE(SegmentExists("v1"));

  child.Kill();
  ASSERT_TRUE(child.WaitUntilZombie(kPatience));  // dead but not reaped: still counts as dead
  s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->dead_readers, 1u);
  // The next commit reclaims the dead reader's slot: its pin on 1 goes, and
  // 1 and 3 (superseded, unpinned) are freed; 2 stays for the live reader.
  ASSERT_TRUE(pub->Publish(4, MakeVersion(TestLayout(), 4)).ok());
  s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->versions.versions_in_memory, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(s->readers_attached, 1u);
  EXPECT_EQ(s->dead_readers, 0u);
  EXPECT_FALSE(SegmentExists("v1"));
  EXPECT_FALSE(SegmentExists("v3"));
  // The dead reader's version was freed at BeginPublish(4) and 4 staged into
  // its segment; 3, freed at the commit, is the spare now.
  EXPECT_EQ(s->segments_recycled, 1u);
  EXPECT_TRUE(SegmentExists("spare"));
  EXPECT_TRUE(KilledBySigkill(child.Wait(kPatience)));
  EXPECT_EQ(CheckSnapshot(*v2, TestLayout()), "");
  EXPECT_TRUE(v2->Verify().ok());
  auto v4 = other->AcquireLatest();
  ASSERT_TRUE(v4.ok());
  EXPECT_EQ(v4->version(), 4);
}

TEST_F(ShmStoreProcessTest, StoreAbandonedByACrashIsSweptAway) {
  ChildProcess child = ChildProcess::Spawn("PauseMidPublish", Env({{"SLUICE_SHM_TEST_WAIT_READERS", "0"}}));
  ASSERT_TRUE(child.WaitForSignal(kPatience));
  child.Kill();
  EXPECT_TRUE(KilledBySigkill(child.Wait(kPatience)));
  // control, v2 and the abandoned staging v3; nobody is left to clean up.
  EXPECT_EQ(testing::SegmentsWithPrefix(prefix_).size(), 3u);
  ASSERT_TRUE(SweepShmStore(prefix_, "w").ok());
  EXPECT_EQ(testing::SegmentsWithPrefix(prefix_), std::vector<std::string>{});
}

// The publisher dies half way through staging into a recycled segment: the
// next publisher removes that segment and keeps recycling; readers never see
// the half-written bytes.
TEST_F(ShmStoreProcessTest, PublisherKilledMidStagingIntoARecycledSegment) {
  ChildProcess child = ChildProcess::Spawn(
      "PauseMidPublish", Env({{"SLUICE_SHM_TEST_WAIT_READERS", "1"}, {"SLUICE_SHM_TEST_PAUSE_AT", "4"}}));
  auto sub = Subscribe();
  ASSERT_TRUE(sub);
  ASSERT_TRUE(child.WaitForSignal(kPatience)) << "publisher never paused mid-publish";
  auto s = sub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->versions.latest_version, 3);
  EXPECT_EQ(s->versions.staging_version, 4);
  EXPECT_EQ(s->segments_recycled, 2u);  // 3 and 4 went into the segments of 1 and 2
  EXPECT_EQ(s->versions.spare_bytes, 0u);
  EXPECT_TRUE(SegmentExists("v4"));

  child.Kill();
  EXPECT_TRUE(KilledBySigkill(child.Wait(kPatience)));
  auto three = sub->AcquireLatest();
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  EXPECT_EQ(three->version(), 3);
  EXPECT_EQ(CheckSnapshot(*three, TestLayout()), "");
  EXPECT_TRUE(three->Verify().ok());
  EXPECT_EQ(sub->Acquire(4).status().code(), StatusCode::kNotFound);

  auto pub = Publisher();
  ASSERT_TRUE(pub);
  EXPECT_FALSE(SegmentExists("v4"));  // the dead publisher's staging is gone
  EXPECT_FALSE(SegmentExists("spare"));
  *three = ShmVersionHandle();
  for (int64_t v = 4; v <= 9; ++v) {
    ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    auto h = sub->AcquireLatest();
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_EQ(h->version(), v);
    EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
    EXPECT_TRUE(h->Verify().ok());
  }
  s = pub->stats();
  ASSERT_TRUE(s.ok());
  EXPECT_GE(s->segments_recycled, 6u);  // the new publisher recycles too
  EXPECT_EQ(s->versions.aborts, 1u);
  EXPECT_LE(s->versions.bytes_held, s->versions.max_bytes_held);
}

// A reader SIGKILLed while pinning and releasing in a loop (any point of the
// pin protocol: between its pin and its flock, holding both, or unpinning):
// its pins are reclaimed, its segments recycled, and later versions publish
// and serve whole.
TEST_F(ShmStoreProcessTest, ReaderKilledWhilePinningDoesNotStopRecycling) {
  auto pub = Publisher();
  ASSERT_TRUE(pub);
  ASSERT_TRUE(pub->Publish(1, MakeVersion(TestLayout(), 1)).ok());
  auto sub = Subscribe();
  ASSERT_TRUE(sub);
  std::mt19937 rng(std::random_device{}());
  int64_t v = 1;
  for (int round = 0; round < 3; ++round) {
    ChildProcess child = ChildProcess::Spawn("PinInALoop", Env({}));
    ASSERT_TRUE(child.WaitForSignal(kPatience)) << "reader never pinned";
    const int publishes = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < publishes; ++i) {
      ++v;
      ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
    }
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2000));
    child.Kill();
    EXPECT_TRUE(KilledBySigkill(child.Wait(kPatience)));
    const uint64_t recycled_before = pub->stats()->segments_recycled;
    for (int i = 0; i < 3; ++i) {
      ++v;
      ASSERT_TRUE(pub->Publish(v, MakeVersion(TestLayout(), v)).ok());
      auto h = sub->AcquireLatest();
      ASSERT_TRUE(h.ok()) << h.status().ToString();
      EXPECT_EQ(h->version(), v);
      EXPECT_EQ(CheckSnapshot(*h, TestLayout()), "");
      EXPECT_TRUE(h->Verify().ok());
    }
    auto s = pub->stats();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->readers_attached, 1u);  // the dead reader's slot was reclaimed
    EXPECT_EQ(s->versions.versions_in_memory, (std::vector<int64_t>{v}));
    EXPECT_GE(s->segments_recycled, recycled_before + 2);  // not blocked by the dead reader
    EXPECT_EQ(testing::SegmentBytesWithPrefix(prefix_), s->versions.bytes_held + s->control_segment_bytes);
  }
}

}  // namespace
}  // namespace sluice::checkpoint_engine
