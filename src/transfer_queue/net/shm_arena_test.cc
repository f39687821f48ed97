// Tests of the shared-memory arena on its own: allocation and coalescing,
// the epoch pins that keep freed blocks from reuse while a reader may still
// look at them, dead readers (forked children killed with SIGKILL), slot
// exhaustion, validation of what a client maps, and the sweep of arenas left
// by dead servers.
#include "net/shm_arena.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>

#include "test_util.h"

namespace sluice::transfer_queue::internal {
namespace {

using namespace std::chrono_literals;

std::shared_ptr<ShmArena> NewArena(uint64_t bytes, uint32_t readers = 8, std::chrono::milliseconds wait = 50ms) {
  ShmArena::Options o;
  o.data_bytes = bytes;
  o.max_readers = readers;
  o.alloc_timeout = wait;
  Result<std::shared_ptr<ShmArena>> arena = ShmArena::Create(o);
  EXPECT_TRUE(arena.ok()) << arena.status().ToString();
  return arena.ok() ? *arena : nullptr;
}

Result<HostTensor> Block(ShmArena& arena, uint64_t n) { return arena.Allocate(DType::kU8, {int64_t(n)}, n); }

// Forks a child that attaches to `arena`, pins it, tells the parent, and
// waits to be killed. Returns its pid.
pid_t ForkPinnedReader(const ShmArena& arena) {
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    Result<std::shared_ptr<ShmArenaClient>> client = ShmArenaClient::Open(arena.name(), arena.data_bytes());
    if (!client.ok()) _exit(3);
    std::shared_ptr<const void> pin = (*client)->Pin();
    const char ok = 'p';
    if (write(fds[1], &ok, 1) != 1) _exit(4);
    for (int i = 0; i < 600; ++i) usleep(100000);  // killed long before
    _exit(0);
  }
  close(fds[1]);
  char got = 0;
  EXPECT_EQ(read(fds[0], &got, 1), 1);
  EXPECT_EQ(got, 'p');
  close(fds[0]);
  return pid;
}

void KillAndReap(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFSIGNALED(status));
}

TEST(ShmArenaTest, AllocatesAlignedBlocksAndCoalescesFreedOnes) {
  auto arena = NewArena(64 * 1024);
  ASSERT_NE(arena, nullptr);
  EXPECT_EQ(arena->name().rfind("/sluice.tq.", 0), 0u);
  std::vector<HostTensor> blocks;
  for (int i = 0; i < 16; ++i) {
    Result<HostTensor> b = Block(*arena, 4000);
    ASSERT_TRUE(b.ok()) << b.status().ToString();
    EXPECT_EQ(arena->OffsetOf(b->data) % kArenaAlignment, 0u);
    EXPECT_TRUE(arena->Contains(b->data));
    std::memset(const_cast<std::byte*>(b->data), i, b->nbytes);
    blocks.push_back(*b);
  }
  // Full (16 x 4032 of 65536): the next one fails after the short wait, naming why.
  TQ_EXPECT_ERROR(Block(*arena, 4000).status(), kResourceExhausted, "no room");
  TQ_EXPECT_ERROR(Block(*arena, 1 << 20).status(), kResourceExhausted, "can never fit");
  // Bytes stay put while held.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(static_cast<int>(blocks[static_cast<size_t>(i)].data[7]), i);
  // Freed every other block, then the rest: one coalesced free range again.
  for (size_t i = 0; i < blocks.size(); i += 2) blocks[i] = HostTensor{};
  blocks.clear();
  Result<HostTensor> whole = Block(*arena, 64 * 1024);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  const ShmArenaStats stats = arena->Stats();
  EXPECT_EQ(stats.allocated_bytes, 64u * 1024);
  EXPECT_EQ(stats.pinned_bytes, 0u);
  EXPECT_GE(stats.peak_allocated_bytes, 16u * 4032);
}

TEST(ShmArenaTest, PlaceAdoptsBlocksAndCopiesOthers) {
  auto arena = NewArena(4096);
  ASSERT_NE(arena, nullptr);
  Result<HostTensor> inside = Block(*arena, 100);
  ASSERT_TRUE(inside.ok());
  Result<HostTensor> adopted = arena->Place(*inside);
  ASSERT_TRUE(adopted.ok());
  EXPECT_EQ(adopted->data, inside->data);  // written in place: no copy
  const int64_t values[3] = {7, 8, 9};
  HostTensor heap = HostTensor::Copy(DType::kI64, {3}, values, sizeof(values));
  Result<HostTensor> placed = arena->Place(heap);
  ASSERT_TRUE(placed.ok());
  EXPECT_TRUE(arena->Contains(placed->data));
  EXPECT_EQ(std::memcmp(placed->data, values, sizeof(values)), 0);
}

TEST(ShmArenaTest, APinDefersReuseOfBlocksFreedAfterIt) {
  auto arena = NewArena(8192);
  ASSERT_NE(arena, nullptr);
  Result<std::shared_ptr<ShmArenaClient>> reader = ShmArenaClient::Open(arena->name(), arena->data_bytes());
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  Result<HostTensor> block = Block(*arena, 8192);
  ASSERT_TRUE(block.ok());
  const uint64_t offset = arena->OffsetOf(block->data);
  std::memset(const_cast<std::byte*>(block->data), 0x5a, 8192);

  // The reader pins, then views the block (as a read reply would name it).
  std::shared_ptr<const void> pin = (*reader)->Pin();
  Result<HostTensor> view = (*reader)->View(offset, DType::kU8, {8192}, 8192, pin);
  ASSERT_TRUE(view.ok());
  pin.reset();            // the view holds the pin now
  *block = HostTensor{};  // the server frees the block
  EXPECT_EQ(arena->Stats().pinned_bytes, 8192u);
  TQ_EXPECT_ERROR(Block(*arena, 8192).status(), kResourceExhausted, "pinned by reader views");
  EXPECT_EQ(static_cast<uint8_t>(view->data[8191]), 0x5a);  // untouched

  view = Result<HostTensor>(Status::NotFound("dropped"));  // unpins
  Result<HostTensor> again = Block(*arena, 8192);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(arena->OffsetOf(again->data), offset);
}

TEST(ShmArenaTest, APinTakenAfterAFreeDoesNotBlockIt) {
  auto arena = NewArena(4096);
  ASSERT_NE(arena, nullptr);
  Result<std::shared_ptr<ShmArenaClient>> reader = ShmArenaClient::Open(arena->name(), arena->data_bytes());
  ASSERT_TRUE(reader.ok());
  { ASSERT_TRUE(Block(*arena, 4096).ok()); }  // allocated and freed at once
  std::shared_ptr<const void> pin = (*reader)->Pin();
  EXPECT_TRUE(Block(*arena, 4096).ok());
}

TEST(ShmArenaTest, AKilledReadersPinIsIgnoredAndItsSlotReused) {
  auto arena = NewArena(4096, /*readers=*/1, /*wait=*/2000ms);
  ASSERT_NE(arena, nullptr);
  Result<HostTensor> block = Block(*arena, 4096);
  ASSERT_TRUE(block.ok());
  const pid_t child = ForkPinnedReader(*arena);
  // The only slot is held by a live process.
  TQ_EXPECT_ERROR(ShmArenaClient::Open(arena->name(), arena->data_bytes()).status(), kResourceExhausted,
                  "reader slots");
  *block = HostTensor{};  // freed after the child's pin: deferred
  EXPECT_EQ(arena->Stats().pinned_bytes, 4096u);
  KillAndReap(child);
  // The dead reader's pin no longer counts, and its slot can be claimed.
  Result<HostTensor> again = Block(*arena, 4096);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  Result<std::shared_ptr<ShmArenaClient>> reader = ShmArenaClient::Open(arena->name(), arena->data_bytes());
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
}

TEST(ShmArenaTest, ClientRefusesForeignAndMismatchedSegmentsAndBadOffsets) {
  auto arena = NewArena(4096);
  ASSERT_NE(arena, nullptr);
  TQ_EXPECT_ERROR(ShmArenaClient::Open(arena->name(), 8192).status(), kFailedPrecondition, "geometry");
  TQ_EXPECT_ERROR(ShmArenaClient::Open("/sluice.tq.nonexistent", 4096).status(), kNotFound, "");
  const std::string foreign = ShmSegmentName({"sluice", "tqtest", std::to_string(getpid())});
  {
    Result<SharedMemorySegment> zeros = SharedMemorySegment::Create(foreign, 8192);
    ASSERT_TRUE(zeros.ok()) << zeros.status().ToString();
    TQ_EXPECT_ERROR(ShmArenaClient::Open(foreign, 4096).status(), kFailedPrecondition, "not a TransferQueue arena");
  }
  TQ_ASSERT_OK(SharedMemorySegment::Unlink(foreign));
  Result<std::shared_ptr<ShmArenaClient>> reader = ShmArenaClient::Open(arena->name(), arena->data_bytes());
  ASSERT_TRUE(reader.ok());
  std::shared_ptr<const void> pin = (*reader)->Pin();
  TQ_EXPECT_ERROR((*reader)->View(4096, DType::kU8, {1}, 1, pin).status(), kDataLoss, "outside");
  TQ_EXPECT_ERROR((*reader)->View(64, DType::kU8, {4096}, 4096, pin).status(), kDataLoss, "outside");
  TQ_EXPECT_ERROR((*reader)->View(3, DType::kU8, {1}, 1, pin).status(), kDataLoss, "misaligned");
  EXPECT_TRUE((*reader)->View(4032, DType::kU8, {64}, 64, pin).ok());
}

TEST(ShmArenaTest, ArenasOfDeadServersAreSweptAndOwnArenaUnlinked) {
  // A "server" that dies: a child whose identity names a leftover segment.
  const pid_t child = fork();
  if (child == 0) {
    for (int i = 0; i < 600; ++i) usleep(100000);
    _exit(0);
  }
  Result<ProcessIdentity> id = ReadProcessIdentity(child);
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  KillAndReap(child);
  const std::string stale =
      ShmSegmentName({"sluice", "tq", std::to_string(id->pid) + "-" + std::to_string(id->start_time), "0"});
  ASSERT_TRUE(SharedMemorySegment::Create(stale, 4096).ok());
  std::string name;
  {
    auto arena = NewArena(4096);
    ASSERT_NE(arena, nullptr);
    name = arena->name();
    TQ_EXPECT_ERROR(SharedMemorySegment::Open(stale, ShmAccess::kReadOnly).status(), kNotFound, "");
    EXPECT_TRUE(SharedMemorySegment::Open(name, ShmAccess::kReadOnly).ok());
  }
  TQ_EXPECT_ERROR(SharedMemorySegment::Open(name, ShmAccess::kReadOnly).status(), kNotFound, "");
}

}  // namespace
}  // namespace sluice::transfer_queue::internal
