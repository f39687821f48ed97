// The same-host shared-memory rings (shm_ring.h): messages of any size in
// chunks, closing, a client killed in the middle of a message, garbage
// written into a ring while the server serves it, and more callers than
// rings.
#include "net/shm_ring.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <random>
#include <thread>

#include "common/testing/skip.h"
#include "net/net_test_util.h"
#include "net/rpc_channel.h"
#include "sluice/transfer_queue/remote.h"
#include "sluice/transfer_queue/server.h"
#include "test_util.h"

namespace sluice::transfer_queue::internal {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;
using testing::I64;
using testing::Tags;
using testing::ToI64;

constexpr char kChildRingEnv[] = "SLUICE_TEST_RING_NAME";
constexpr char kChildCapacityEnv[] = "SLUICE_TEST_RING_CAPACITY";
constexpr char kChildEndpointEnv[] = "SLUICE_TEST_RING_ENDPOINT";

std::vector<std::byte> Pattern(size_t n, int seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 131 + seed * 7) & 0xff);
  return v;
}

TEST(ShmRingTest, MessagesOfAnySizeCrossInChunks) {
  Result<std::unique_ptr<ShmRingServerEnd>> server = ShmRingServerEnd::Create(4096);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<std::unique_ptr<ShmRingClientEnd>> client = ShmRingClientEnd::Open((*server)->name(), 4096);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  // The client unlinked the name: nobody else can attach.
  TQ_EXPECT_ERROR(ShmRingClientEnd::Open((*server)->name(), 4096), kNotFound, "no shared-memory ring");

  std::atomic<bool> stop{false};
  std::thread echo([&] {
    // Replies with the request reversed, until the client closes the ring.
    for (;;) {
      Result<RingMessage> m = (*server)->Receive(1 << 20, Steady::now() + 10s, RingSpin{}, stop);
      if (!m.ok()) return;
      std::vector<std::byte> reply(m->bytes().rbegin(), m->bytes().rend());
      if (!(*server)->Send(reply, RingSpin{}, stop).ok()) return;
    }
  });
  for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, size_t{4097}, size_t{3 * 4096 + 5}, size_t{100000}}) {
    const std::vector<std::byte> request = Pattern(n, static_cast<int>(n));
    Result<RingMessage> reply = (*client)->Call(request, 1 << 20, Steady::now() + 10s, RingSpin{});
    ASSERT_TRUE(reply.ok()) << n << ": " << reply.status().ToString();
    ASSERT_EQ(reply->size, n);
    EXPECT_TRUE(std::equal(request.rbegin(), request.rend(), reply->data.get())) << n;
  }
  // A reply over the caller's limit is refused, and the ring is done.
  TQ_EXPECT_ERROR((*client)->Call(Pattern(5000, 1), 4000, Steady::now() + 10s, RingSpin{}), kInvalidArgument,
                  "exceeds 4000 bytes");
  TQ_EXPECT_ERROR((*client)->Call(Pattern(10, 1), 4000, Steady::now() + 10s, RingSpin{}), kFailedPrecondition,
                  "unusable");
  client->reset();  // closes: the server's wait ends
  echo.join();
}

TEST(ShmRingTest, AClientThatNeverAttachesCountsAsGone) {
  Result<std::unique_ptr<ShmRingServerEnd>> server = ShmRingServerEnd::Create(4096, 300ms);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::atomic<bool> stop{false};
  const Steady::time_point start = Steady::now();
  RingEnd end = RingEnd::kNone;
  // Waited for in slices, as the server's ring thread does: the attach
  // deadline is the ring's, not each wait's.
  for (int i = 0; i < 20 && end != RingEnd::kPeerGone; ++i) {
    (void)(*server)->Receive(1 << 20, Steady::now() + 100ms, RingSpin{}, stop, &end);
  }
  EXPECT_EQ(end, RingEnd::kPeerGone);
  EXPECT_LT(Steady::now() - start, 1500ms);
}

TEST(ShmRingTest, BadCapacitiesAndForeignSegmentsAreRefused) {
  TQ_EXPECT_ERROR(ShmRingServerEnd::Create(100), kInvalidArgument, "capacity 100");
  TQ_EXPECT_ERROR(ShmRingServerEnd::Create(4096 + 1), kInvalidArgument, "multiple of 64");
  TQ_EXPECT_ERROR(ShmRingClientEnd::Open("/sluice.tq.1-2.0", 4096), kFailedPrecondition, "not the name of");
  Result<std::unique_ptr<ShmRingServerEnd>> server = ShmRingServerEnd::Create(8192);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  TQ_EXPECT_ERROR(ShmRingClientEnd::Open((*server)->name(), 4096), kFailedPrecondition, "bytes long");
}

// Child mode: attach to a ring, post half a message, then hang until killed.
TEST(ShmRingChild, PostHalfAndHang) {
  const char* name = std::getenv(kChildRingEnv);
  if (name == nullptr) SLUICE_CHILD_ENTRY_ONLY("AClientKilledMidMessageEndsItsRing");
  Result<std::unique_ptr<ShmRingClientEnd>> ring =
      ShmRingClientEnd::Open(name, std::strtoull(std::getenv(kChildCapacityEnv), nullptr, 10));
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  (*ring)->PostChunkForTest(Pattern(100, 3), /*last=*/false);
  std::printf("posted\n");
  std::fflush(stdout);
  std::this_thread::sleep_for(60s);  // killed long before
}

TEST(ShmRingTest, AClientKilledMidMessageEndsItsRing) {
  Result<std::unique_ptr<ShmRingServerEnd>> server = ShmRingServerEnd::Create(4096);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<testing::ChildProcess> child =
      testing::ChildProcess::Spawn(testing::SelfExe(), {"--gtest_filter=ShmRingChild.PostHalfAndHang"},
                                   {{kChildRingEnv, (*server)->name()}, {kChildCapacityEnv, "4096"}});
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  for (;;) {
    Result<std::string> line = child->ReadLine(20s);
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    if (*line == "posted") break;
  }
  std::atomic<bool> stop{false};
  std::thread kill([&] {
    std::this_thread::sleep_for(200ms);
    child->Signal(SIGKILL);
  });
  const Steady::time_point start = Steady::now();
  RingEnd end = RingEnd::kNone;
  // The first chunk is there; the rest never comes: the wait ends when the client dies.
  TQ_EXPECT_ERROR((*server)->Receive(1 << 20, Steady::now() + 30s, RingSpin{}, stop, &end), kAborted, "gone");
  EXPECT_EQ(end, RingEnd::kPeerGone);
  EXPECT_LT(Steady::now() - start, 5s);
  kill.join();
  EXPECT_TRUE((*server)->ClientGone());
}

ServerOptions RingServerOptions(uint32_t rings) {
  ServerOptions o;
  o.controller.columns = testing::DefaultColumns();
  o.controller.tasks = {"train"};
  o.shm_bytes = 64 << 20;
  o.shm_rings = rings;
  o.shm_ring_bytes = 4096;  // small: multi-chunk messages are common
  return o;
}

RemoteOptions ClientOptions() {
  RemoteOptions o;
  o.rpc_timeout = 10s;
  o.shm = ShmMode::kRequired;
  return o;
}

// Puts `n` rows of stamp `stamp`, takes them back, checks and acks them.
void RoundTrip(TransferQueueClient& client, const std::string& partition, int n, int64_t stamp) {
  ColumnBatch put;
  std::vector<RowTags> tags;
  for (int i = 0; i < n; ++i) {
    put["prompt"].push_back(I64(std::vector<int64_t>(700, stamp + i)));  // 5.6 KiB: over the ring's 4 KiB
    tags.push_back(Tags());
  }
  Result<std::vector<RowId>> rows = client.PutRows(partition, tags, put);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  Result<BatchMeta> meta = client.GetMeta("train", {"prompt"}, static_cast<uint32_t>(n), partition, {}, 5s);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  Result<BatchData> data = client.GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  std::set<int64_t> seen;
  for (const HostTensor& t : data->columns["prompt"]) {
    const std::vector<int64_t> v = ToI64(t);
    ASSERT_EQ(v.size(), 700u);
    EXPECT_EQ(std::count(v.begin(), v.end(), v[0]), 700) << "a row was corrupted";
    seen.insert(v[0]);
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(n));
  EXPECT_EQ(*seen.begin(), stamp);
  TQ_ASSERT_OK(client.Ack(meta->lease_id).status());
}

TEST(ShmRingTest, ClientsUseRingsAndFallBackToTheSocketWhenTheyRunOut) {
  Result<std::unique_ptr<TransferQueueServer>> server = TransferQueueServer::Start(RingServerOptions(2));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  {
    Result<RemoteQueue> queue = ConnectTransferQueue((*server)->endpoint(), ClientOptions());
    ASSERT_TRUE(queue.ok()) << queue.status().ToString();
    TransferQueueClient client = queue->client();
    TQ_ASSERT_OK(client.CreatePartition("p"));
    RoundTrip(client, "p", 3, 1000);
    EXPECT_EQ((*server)->counters().rings_open, 1u);
    const ServerCounters a = (*server)->counters();
    EXPECT_GE(a.ring_requests, 2u);  // the put and the take, at least
    RoundTrip(client, "p", 3, 2000);
    // Every request of this one-threaded client now comes through its ring.
    const ServerCounters b = (*server)->counters();
    EXPECT_GT(b.requests, a.requests);
    EXPECT_EQ(b.ring_requests - a.ring_requests, b.requests - a.requests);
    // Six threads at once, two rings: the others go through the socket.
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) {
      threads.emplace_back([&, t] {
        TQ_ASSERT_OK(client.CreatePartition("t" + std::to_string(t)));
        for (int i = 0; i < 20; ++i) RoundTrip(client, "t" + std::to_string(t), 2, t * 100000 + i * 10);
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ((*server)->counters().rings_open, 2u);
  }
  // Dropping the client closes its rings; their threads end.
  const Steady::time_point deadline = Steady::now() + 5s;
  while ((*server)->counters().rings_open > 0 && Steady::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ((*server)->counters().rings_open, 0u);
}

TEST(ShmRingTest, GarbageInARingEndsThatRingOnly) {
  Result<std::unique_ptr<TransferQueueServer>> server = TransferQueueServer::Start(RingServerOptions(8));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<RemoteQueue> queue = ConnectTransferQueue((*server)->endpoint(), ClientOptions());
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  TransferQueueClient client = queue->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  RoundTrip(client, "p", 2, 0);

  // A scribbler with rings of its own, opened through the socket.
  RemoteOptions raw_options = ClientOptions();
  raw_options.shm_rings = 0;
  Result<std::shared_ptr<RpcChannel>> channel = RpcChannel::Create((*server)->endpoint(), raw_options);
  ASSERT_TRUE(channel.ok());
  auto open_ring = [&]() -> std::unique_ptr<ShmRingClientEnd> {
    Result<wire::RingInfo> info = (*channel)->Call<wire::RingInfo>(wire::MessageType::kOpenRing, 0, wire::Empty{}, 0ms);
    EXPECT_TRUE(info.ok()) << info.status().ToString();
    if (!info.ok()) return nullptr;
    Result<std::unique_ptr<ShmRingClientEnd>> ring = ShmRingClientEnd::Open(info->name, info->capacity);
    EXPECT_TRUE(ring.ok()) << ring.status().ToString();
    return ring.ok() ? std::move(*ring) : nullptr;
  };
  std::mt19937_64 rng(20261205);
  const wire::Message valid = wire::EncodeRequest(wire::MessageType::kStats, 0, 1, "", wire::Empty{});
  int rounds = 0, failed_calls = 0;
  const Steady::time_point until = Steady::now() + 4s;
  std::unique_ptr<ShmRingClientEnd> ring = open_ring();
  ASSERT_NE(ring, nullptr);
  for (; rounds < 400 && Steady::now() < until; ++rounds) {
    const int kind = static_cast<int>(rng() % 4);
    if (kind == 0) {
      // Random bytes in the header page: lanes, flags, capacity.
      for (int i = 0; i < 8; ++i) ring->raw()[rng() % 512] = static_cast<std::byte>(rng());
    } else if (kind == 3) {
      // A chunk header of any length and flag, then whatever comes next.
      ring->PostRawForTest(static_cast<uint32_t>(rng() % (3 * 4096)), static_cast<uint32_t>(rng() % 3));
    }
    std::vector<std::byte> message(valid.bytes().begin(), valid.bytes().end());
    if (kind == 1) {
      for (int i = 0; i < 3; ++i) message[rng() % message.size()] = static_cast<std::byte>(rng());
    } else if (kind == 2) {
      message.resize(rng() % (3 * 4096));
      for (auto& b : message) b = static_cast<std::byte>(rng());
    }
    Result<RingMessage> reply = ring->Call(message, 1 << 20, Steady::now() + 300ms, RingSpin{});
    if (!reply.ok()) {
      ++failed_calls;
      ring = open_ring();  // that one is done; the server hands out another
      ASSERT_NE(ring, nullptr) << "round " << rounds;
    }
    if (rounds % 50 == 0) RoundTrip(client, "p", 2, rounds * 10);  // the honest client is unaffected
  }
  ring.reset();
  EXPECT_GT(rounds, 50);
  EXPECT_GT(failed_calls, 0);                       // rings the server closed
  EXPECT_GT((*server)->counters().malformed, 10u);  // garbage refused at the door
  RoundTrip(client, "p", 3, 99000);
  Result<QueueStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->controller.rows, 0u);
  EXPECT_EQ(stats->controller.active_leases, 0u);
}

// Child mode: a client that puts and takes rows through rings until killed.
TEST(ShmRingChild, TrafficUntilKilled) {
  const char* endpoint = std::getenv(kChildEndpointEnv);
  if (endpoint == nullptr) SLUICE_CHILD_ENTRY_ONLY("KilledClientsRingsEnd");
  Result<RemoteQueue> queue = ConnectTransferQueue(endpoint, ClientOptions());
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  TransferQueueClient client = queue->client();
  const std::string partition = "child-" + std::to_string(::getpid());
  TQ_ASSERT_OK(client.CreatePartition(partition));
  std::printf("running\n");
  std::fflush(stdout);
  for (int i = 0; i < 1000000; ++i) RoundTrip(client, partition, 2, i * 10);
}

TEST(ShmRingTest, KilledClientsRingsEnd) {
  Result<std::unique_ptr<TransferQueueServer>> server = TransferQueueServer::Start(RingServerOptions(8));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 3; ++round) {
    Result<testing::ChildProcess> child =
        testing::ChildProcess::Spawn(testing::SelfExe(), {"--gtest_filter=ShmRingChild.TrafficUntilKilled"},
                                     {{kChildEndpointEnv, (*server)->endpoint()}});
    ASSERT_TRUE(child.ok()) << child.status().ToString();
    for (;;) {
      Result<std::string> line = child->ReadLine(20s);
      ASSERT_TRUE(line.ok()) << line.status().ToString();
      if (*line == "running") break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20 + rng() % 80));  // somewhere mid-call
    EXPECT_GE((*server)->counters().rings_open, 1u);
    child->Signal(SIGKILL);
    ASSERT_TRUE(child->Wait(10s).ok());
    const Steady::time_point deadline = Steady::now() + 5s;
    while ((*server)->counters().rings_open > 0 && Steady::now() < deadline) std::this_thread::sleep_for(10ms);
    EXPECT_EQ((*server)->counters().rings_open, 0u) << "round " << round;
  }
  // The server still serves, rings included.
  Result<RemoteQueue> queue = ConnectTransferQueue((*server)->endpoint(), ClientOptions());
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  TransferQueueClient client = queue->client();
  TQ_ASSERT_OK(client.CreatePartition("after"));
  RoundTrip(client, "after", 3, 5);
}

}  // namespace
}  // namespace sluice::transfer_queue::internal
