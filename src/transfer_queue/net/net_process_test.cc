// Multi-process tests of the TransferQueue network transport: the server is
// the real sluice_queue_server binary, clients run in this process (and, for
// the killed consumer, in a child that is this binary re-executed).
// Loopback only; every wait is bounded.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "common/testing/skip.h"
#include "net/net_test_util.h"
#include "sluice/common/file_util.h"
#include "sluice/common/random.h"
#include "sluice/common/shm.h"
#include "sluice/transfer_queue/remote.h"
#include "test_util.h"
#include "wire/wire.h"
#include "wire/wire_samples.h"

namespace sluice::transfer_queue {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcess;
using testing::I64;
using testing::ServerProcess;
using testing::Tags;
using testing::ToI64;

constexpr char kChildEndpointEnv[] = "SLUICE_TQ_CHILD_ENDPOINT";
constexpr char kChildShmEnv[] = "SLUICE_TQ_CHILD_SHM";

std::vector<std::string> ServerArgs(std::vector<std::string> extra = {}) {
  std::vector<std::string> args = {
      "--columns", "prompt:I64:*,response:I64:*,reward:F32:", "--tasks", "reward,train", "--storage-units", "3"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

RemoteOptions Options(std::string token = "", ShmMode shm = ShmMode::kOff) {
  RemoteOptions o;
  o.token = std::move(token);
  o.rpc_timeout = 10s;
  o.shm = shm;
  return o;
}

// The payload transports the process tests run over: bytes in messages over
// TCP, or the server's shared-memory arena (written and read in place).
enum class Transport { kTcp, kShm };
std::string TransportName(const ::testing::TestParamInfo<Transport>& info) {
  return info.param == Transport::kShm ? "Shm" : "Tcp";
}
std::vector<std::string> TransportArgs(Transport t, std::vector<std::string> extra = {}) {
  if (t == Transport::kShm) {
    extra.push_back("--shm-bytes");
    extra.push_back("64M");
  }
  return ServerArgs(std::move(extra));
}
RemoteOptions TransportOptions(Transport t) {
  return Options("", t == Transport::kShm ? ShmMode::kRequired : ShmMode::kOff);
}

// The TransferQueue arenas in /dev/shm now.
std::set<std::string> ArenaSegments() {
  Result<std::vector<std::string>> names = ListShmSegments({"sluice", "tq"});
  EXPECT_TRUE(names.ok()) << names.status().ToString();
  return names.ok() ? std::set<std::string>(names->begin(), names->end()) : std::set<std::string>();
}

// True if `p` lies in this process's mapping of shared-memory segment `name`
// (read from /proc/self/maps): the bytes are read in place, not copied.
bool InShmMapping(const void* p, const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  const auto address = reinterpret_cast<uintptr_t>(p);
  for (std::string line; std::getline(maps, line);) {
    if (line.size() < name.size() || line.compare(line.size() - name.size(), name.size(), name) != 0) continue;
    uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &begin, &end) == 2 && address >= begin && address < end) return true;
  }
  return false;
}

void ExpectCleanExit(ServerProcess& server) {
  Result<int> status = server.Stop();
  ASSERT_TRUE(status.ok()) << status.status().ToString();
  EXPECT_TRUE(WIFEXITED(*status)) << "server did not exit normally, wait status " << *status;
  EXPECT_EQ(WEXITSTATUS(*status), 0) << "server exit status (a sanitizer report exits non-zero)";
}

TEST(NetProcessTest, PutGetAckRoundTripOverTcp) {
  Result<ServerProcess> server = ServerProcess::Start(ServerArgs());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  EXPECT_EQ(server->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << server->endpoint();
  Result<RemoteQueue> queue = ConnectTransferQueue(server->endpoint(), Options());
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  EXPECT_EQ(queue->storage.size(), 3u);
  EXPECT_FALSE(queue->token_required);
  TransferQueueClient client = queue->client();

  TQ_ASSERT_OK(client.CreatePartition("step-0", 2));
  std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {4, 5, 6, 7, 8}, {9, 9}, {}};
  ColumnBatch put;
  for (const auto& p : prompts) put["prompt"].push_back(I64(p));
  Result<std::vector<RowId>> rows =
      client.PutRows("step-0", {Tags(0, 1, 3), Tags(0, 1, 5), Tags(1, 1, 2), Tags(1, 1, 0)}, put);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();

  SamplingPolicy groups;
  groups.mode = SamplingMode::kWholeGroup;
  Result<BatchMeta> meta = client.GetMeta("reward", {"prompt"}, 4, "step-0", groups, 2s);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  ASSERT_EQ(meta->rows.size(), 4u);
  EXPECT_GT(meta->deadline, std::chrono::steady_clock::now() + 50s);  // default lease 60 s
  Result<BatchData> data = client.GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ColumnBatch rewards;
  for (size_t i = 0; i < data->rows.size(); ++i) {
    const size_t index = static_cast<size_t>(std::find(rows->begin(), rows->end(), data->rows[i]) - rows->begin());
    ASSERT_LT(index, prompts.size());
    EXPECT_EQ(ToI64(data->columns["prompt"][i]), prompts[index]);
    EXPECT_EQ(meta->rows[i].tags.token_length, static_cast<int64_t>(prompts[index].size()));
    rewards["reward"].push_back(testing::F32Scalar(static_cast<float>(index) + 0.5f));
  }
  TQ_ASSERT_OK(client.PutColumns(data->rows, rewards));
  Result<AckResponse> acked = client.Ack(meta->lease_id);
  ASSERT_TRUE(acked.ok()) << acked.status().ToString();
  EXPECT_EQ(acked->rows_acked, 4u);
  EXPECT_EQ(acked->rows_freed, 0u);  // "train" still needs them

  Result<BatchMeta> train = client.GetMeta("train", {"prompt", "reward"}, 4, "step-0", groups, 2s);
  ASSERT_TRUE(train.ok()) << train.status().ToString();
  Result<BatchData> train_data = client.GetData(*train, {"reward"});
  ASSERT_TRUE(train_data.ok()) << train_data.status().ToString();
  for (size_t i = 0; i < train_data->rows.size(); ++i) {
    const size_t index =
        static_cast<size_t>(std::find(rows->begin(), rows->end(), train_data->rows[i]) - rows->begin());
    EXPECT_EQ(testing::ToF32(train_data->columns["reward"][i]), static_cast<float>(index) + 0.5f);
  }
  acked = client.Ack(train->lease_id);
  ASSERT_TRUE(acked.ok()) << acked.status().ToString();
  EXPECT_EQ(acked->rows_freed, 4u);
  EXPECT_EQ(acked->reclaim.id, 0u);  // the server reclaimed them itself

  Result<QueueStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->controller.rows, 0u);
  EXPECT_EQ(stats->controller.bytes_held, 0u);
  EXPECT_EQ(stats->storage_bytes, 0u);
  EXPECT_EQ(stats->controller.leases_acked, 2u);

  // Key-value view.
  TQ_ASSERT_OK(client.CreatePartition("kv"));
  TQ_ASSERT_OK(client.KvPut("kv", "alpha", Tags(), {{"prompt", I64({42, 43})}}));
  Result<KvValue> value = client.KvGet("kv", "alpha");
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  EXPECT_EQ(ToI64(value->columns["prompt"]), (std::vector<int64_t>{42, 43}));
  Result<std::vector<KvEntry>> listed = client.KvList("kv");
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].key, "alpha");
  Result<ClearResponse> cleared = client.KvClear("kv", {"alpha"});
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(cleared->rows_cleared, 1u);

  // Errors come back with the controller's code and message.
  TQ_EXPECT_ERROR(client.GetMeta("nope", {"prompt"}, 1, "step-0"), kNotFound, "'nope'");
  TQ_EXPECT_ERROR(client.ClearPartition("missing"), kNotFound, "'missing'");
  TQ_EXPECT_OK(client.ClearPartition("step-0").status());
  ExpectCleanExit(*server);
}

// Several producer and consumer threads over TCP: every row reaches every
// task exactly once, and whole-group batches never split a group.
class NetTransportTest : public ::testing::TestWithParam<Transport> {};
INSTANTIATE_TEST_SUITE_P(Transports, NetTransportTest, ::testing::Values(Transport::kTcp, Transport::kShm),
                         TransportName);

TEST_P(NetTransportTest, ManyProducersAndConsumersExactlyOncePerTask) {
  Result<ServerProcess> server = ServerProcess::Start(TransportArgs(GetParam(), {"--capacity-rows", "64"}));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  constexpr int kProducers = 3;
  constexpr int kGroupsPerProducer = 12;
  constexpr int kGroupSize = 4;
  constexpr size_t kRows = kProducers * kGroupsPerProducer * kGroupSize;
  Result<RemoteQueue> producers_queue = ConnectTransferQueue(server->endpoint(), TransportOptions(GetParam()));
  ASSERT_TRUE(producers_queue.ok()) << producers_queue.status().ToString();
  TQ_ASSERT_OK(producers_queue->client().CreatePartition("p", kGroupSize));

  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&, p] {
      TransferQueueClient client = producers_queue->client();  // shared connection pool
      for (int g = 0; g < kGroupsPerProducer; ++g) {
        const GroupId group = p * 1000 + g;
        std::vector<RowTags> tags;
        ColumnBatch columns;
        for (int i = 0; i < kGroupSize; ++i) {
          tags.push_back(Tags(group, 0, i + 1));
          columns["prompt"].push_back(I64(std::vector<int64_t>(static_cast<size_t>(i + 1), group * 10 + i)));
        }
        // capacity-rows 64 < 144 rows: producers block until consumers free rows.
        Result<std::vector<RowId>> put = client.PutRows("p", tags, columns, CapacityWait{true, 20000ms});
        if (!put.ok()) {
          ADD_FAILURE() << put.status().ToString();
          failures.fetch_add(1);
          return;
        }
      }
    });
  }

  std::mutex mu;
  std::map<std::string, std::set<RowId>> seen;
  std::map<std::string, size_t> deliveries;
  const auto deadline = std::chrono::steady_clock::now() + 25s;
  for (const std::string task : {"reward", "train"}) {
    for (int c = 0; c < 2; ++c) {
      threads.emplace_back([&, task] {
        Result<RemoteQueue> own =
            ConnectTransferQueue(server->endpoint(), TransportOptions(GetParam()));  // own connection
        if (!own.ok()) {
          ADD_FAILURE() << own.status().ToString();
          return;
        }
        TransferQueueClient client = own->client();
        SamplingPolicy groups;
        groups.mode = SamplingMode::kWholeGroup;
        for (;;) {
          {
            std::lock_guard<std::mutex> lock(mu);
            if (deliveries[task] >= kRows) return;
          }
          if (std::chrono::steady_clock::now() > deadline || failures.load() > 0) return;
          Result<BatchMeta> meta = client.GetMeta(task, {"prompt"}, 2 * kGroupSize, "p", groups, 200ms);
          if (!meta.ok()) {
            if (meta.status().code() != StatusCode::kTimeout) ADD_FAILURE() << meta.status().ToString();
            continue;
          }
          Result<BatchData> data = client.GetData(*meta);
          if (!data.ok()) {
            ADD_FAILURE() << data.status().ToString();
            failures.fetch_add(1);
            return;
          }
          std::map<GroupId, int> per_group;
          for (size_t i = 0; i < meta->rows.size(); ++i) {
            const RowTags& t = meta->rows[i].tags;
            ++per_group[t.group_id];
            const std::vector<int64_t> expected(static_cast<size_t>(t.token_length),
                                                t.group_id * 10 + (t.token_length - 1));
            EXPECT_EQ(ToI64(data->columns["prompt"][i]), expected) << "row " << meta->rows[i].id;
            if (!own->shm_segment.empty() && t.token_length > 0) {
              EXPECT_TRUE(InShmMapping(data->columns["prompt"][i].data, own->shm_segment)) << "copied, not in place";
            }
          }
          for (const auto& [group, count] : per_group) EXPECT_EQ(count, kGroupSize) << "group " << group << " split";
          {
            std::lock_guard<std::mutex> lock(mu);
            for (const RowMeta& r : meta->rows) {
              EXPECT_TRUE(seen[task].insert(r.id).second) << task << " got row " << r.id << " twice";
            }
            deliveries[task] += meta->rows.size();
          }
          Result<AckResponse> acked = client.Ack(meta->lease_id);
          if (!acked.ok()) ADD_FAILURE() << acked.status().ToString();
        }
      });
    }
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(seen["reward"].size(), kRows);
  EXPECT_EQ(seen["train"].size(), kRows);
  EXPECT_EQ(seen["reward"], seen["train"]);
  Result<QueueStats> stats = producers_queue->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->controller.rows, 0u);  // acked by both tasks: freed
  EXPECT_EQ(stats->controller.rows_freed, kRows);
  EXPECT_EQ(stats->storage_bytes, 0u);
  EXPECT_EQ(stats->controller.leases_expired, 0u);
  ExpectCleanExit(*server);
}

TEST(NetProcessTest, ShmReadsInPlaceAndViewsOutliveAClear) {
  Result<ServerProcess> server = ServerProcess::Start(ServerArgs({"--shm-bytes", "16M"}));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  // kAuto attaches; kOff does not; a server without an arena refuses kRequired.
  Result<RemoteQueue> off = ConnectTransferQueue(server->endpoint(), Options("", ShmMode::kOff));
  ASSERT_TRUE(off.ok()) << off.status().ToString();
  EXPECT_EQ(off->shm_segment, "");
  Result<RemoteQueue> queue = ConnectTransferQueue(server->endpoint(), Options("", ShmMode::kAuto));
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  ASSERT_EQ(queue->shm_segment.rfind("/sluice.tq.", 0), 0u) << queue->shm_segment;
  TransferQueueClient client = queue->client();
  // Arena space only goes to cells an open write declared.
  StorageWriteRequest stray{12345, {StorageItem{1, "prompt", I64({1, 2})}}};
  TQ_EXPECT_ERROR(queue->storage[1]->Write(stray), kNotFound, "12345");

  TQ_ASSERT_OK(client.CreatePartition("a"));
  ColumnBatch put;
  for (int i = 0; i < 6; ++i) put["prompt"].push_back(I64(std::vector<int64_t>(100, i)));
  put["prompt"].push_back(I64({}));  // an empty cell
  Result<std::vector<RowId>> rows = client.PutRows("a", {Tags(), Tags(), Tags(), Tags(), Tags(), Tags(), Tags()}, put);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  Result<BatchMeta> meta = client.GetMeta("train", {"prompt"}, 7, "a", {}, 2s);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  Result<BatchData> data = client.GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  for (int i = 0; i < 6; ++i) {
    const HostTensor& t = data->columns["prompt"][static_cast<size_t>(i)];
    EXPECT_TRUE(InShmMapping(t.data, queue->shm_segment)) << "row " << i << " was copied, not read in place";
    EXPECT_EQ(ToI64(t), std::vector<int64_t>(100, i));
  }
  EXPECT_EQ(data->columns["prompt"][6].nbytes, 0u);
  // A client without the arena reads the same bytes through messages.
  Result<BatchData> copied = off->client().GetData(*meta);
  ASSERT_TRUE(copied.ok()) << copied.status().ToString();
  EXPECT_EQ(ToI64(copied->columns["prompt"][3]), std::vector<int64_t>(100, 3));
  EXPECT_FALSE(InShmMapping(copied->columns["prompt"][3].data, queue->shm_segment));

  // Clear: a new read is NotFound; the views already held stay intact even
  // while new rows (other values) are written, because they pin their blocks.
  TQ_ASSERT_OK(client.ClearPartition("a").status());
  TQ_EXPECT_ERROR(client.GetData(*meta).status(), kNotFound, "");
  TQ_ASSERT_OK(client.CreatePartition("b"));
  for (int round = 0; round < 4; ++round) {
    ColumnBatch more;
    for (int i = 0; i < 6; ++i) more["prompt"].push_back(I64(std::vector<int64_t>(100, -1)));
    ASSERT_TRUE(client.PutRows("b", {Tags(), Tags(), Tags(), Tags(), Tags(), Tags()}, more).ok());
  }
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(ToI64(data->columns["prompt"][static_cast<size_t>(i)]), std::vector<int64_t>(100, i)) << "row " << i;
  }
  data = Result<BatchData>(Status::NotFound("dropped"));
  off = Result<RemoteQueue>(Status::NotFound("closed"));
  ExpectCleanExit(*server);

  // kRequired against a server without an arena: refused with the reason.
  Result<ServerProcess> plain = ServerProcess::Start(ServerArgs());
  ASSERT_TRUE(plain.ok()) << plain.status().ToString();
  TQ_EXPECT_ERROR(ConnectTransferQueue(plain->endpoint(), Options("", ShmMode::kRequired)).status(),
                  kFailedPrecondition, "no shared-memory arena");
  Result<RemoteQueue> fallback = ConnectTransferQueue(plain->endpoint(), Options("", ShmMode::kAuto));
  ASSERT_TRUE(fallback.ok()) << fallback.status().ToString();
  EXPECT_EQ(fallback->shm_segment, "");
  ExpectCleanExit(*plain);
}

// Child mode of KilledConsumerRowsAreRedelivered: lease rows, report them on
// stdout, then hang until killed.
TEST(NetChildProcess, LeaseAndHang) {
  const char* endpoint = std::getenv(kChildEndpointEnv);
  if (endpoint == nullptr) SLUICE_CHILD_ENTRY_ONLY("KilledConsumerRowsAreRedelivered");
  const bool shm = std::getenv(kChildShmEnv) != nullptr;
  Result<RemoteQueue> queue = ConnectTransferQueue(endpoint, Options("", shm ? ShmMode::kRequired : ShmMode::kOff));
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  GetMetaRequest request;
  request.task = "train";
  request.columns = {"prompt"};
  request.n = 4;
  request.partition = "p";
  request.timeout = 10s;
  request.lease_timeout = 1500ms;
  Result<BatchMeta> meta = queue->client().GetMeta(request);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  // Over shm the views pin the arena: the kill must not leave that pin behind.
  Result<BatchData> data = queue->client().GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  std::ostringstream line;
  line << "leased " << meta->lease_id;
  for (const RowMeta& r : meta->rows) line << " " << r.id;
  std::printf("%s\n", line.str().c_str());
  std::fflush(stdout);
  std::this_thread::sleep_for(60s);  // killed long before
}

TEST_P(NetTransportTest, KilledConsumerRowsAreRedelivered) {
  Result<ServerProcess> server = ServerProcess::Start(TransportArgs(GetParam()));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<RemoteQueue> queue = ConnectTransferQueue(server->endpoint(), TransportOptions(GetParam()));
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  TransferQueueClient client = queue->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ColumnBatch put;
  for (int i = 0; i < 4; ++i) put["prompt"].push_back(I64({i}));
  ASSERT_TRUE(client.PutRows("p", {Tags(), Tags(), Tags(), Tags()}, put).ok());

  std::map<std::string, std::string> env = {{kChildEndpointEnv, server->endpoint()}};
  if (GetParam() == Transport::kShm) env[kChildShmEnv] = "1";
  Result<ChildProcess> child =
      ChildProcess::Spawn(testing::SelfExe(), {"--gtest_filter=NetChildProcess.LeaseAndHang"}, env);
  ASSERT_TRUE(child.ok()) << child.status().ToString();
  std::vector<RowId> leased;
  LeaseId child_lease = 0;
  for (;;) {  // skip gtest's banner lines
    Result<std::string> line = child->ReadLine(20s);
    ASSERT_TRUE(line.ok()) << line.status().ToString();
    if (line->rfind("leased ", 0) != 0) continue;
    std::istringstream in(line->substr(7));
    in >> child_lease;
    for (RowId r; in >> r;) leased.push_back(r);
    break;
  }
  ASSERT_EQ(leased.size(), 4u);
  child->Signal(SIGKILL);
  Result<int> status = child->Wait(10s);
  ASSERT_TRUE(status.ok());
  EXPECT_TRUE(WIFSIGNALED(*status));

  // Nothing is ready until the dead consumer's lease expires (1.5 s).
  TQ_EXPECT_ERROR(client.GetMeta("train", {"prompt"}, 4, "p", {}, 0ms), kTimeout, "");
  const auto start = std::chrono::steady_clock::now();
  Result<BatchMeta> again = client.GetMeta("train", {"prompt"}, 4, "p", {}, 10s);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  std::vector<RowId> redelivered = again->row_ids();
  std::sort(redelivered.begin(), redelivered.end());
  std::sort(leased.begin(), leased.end());
  EXPECT_EQ(redelivered, leased);
  Result<BatchData> data = client.GetData(*again);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  // The dead consumer's lease is over: its ack is refused with the reason.
  TQ_EXPECT_ERROR(client.Ack(child_lease), kFailedPrecondition, "expired");
  TQ_ASSERT_OK(client.Ack(again->lease_id).status());
  Result<QueueStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->controller.leases_expired, 1u);
  EXPECT_EQ(stats->controller.rows_redelivered, 4u);

  if (GetParam() == Transport::kShm) {
    // The dead consumer created no segment (named by its creator's pid; other
    // tests running in parallel may create their own meanwhile), and the
    // server's arena is there.
    const std::set<std::string> arenas = ArenaSegments();
    EXPECT_EQ(arenas.count(queue->shm_segment), 1u);
    for (const std::string& name : arenas) {
      EXPECT_EQ(name.rfind("/sluice.tq." + std::to_string(child->pid()) + "-", 0), std::string::npos) << name;
    }
    // Its pin (taken while it held views) does not block reuse: fill most of
    // the 64 MiB arena twice; the second round must reuse freed blocks.
    data = Result<BatchData>(Status::NotFound("dropped"));  // drop our own views too
    TQ_ASSERT_OK(client.ClearPartition("p").status());
    for (int round = 0; round < 2; ++round) {
      const std::string partition = "fill-" + std::to_string(round);
      TQ_ASSERT_OK(client.CreatePartition(partition));
      ColumnBatch big;
      std::vector<RowTags> tags;
      for (int i = 0; i < 5; ++i) {
        big["prompt"].push_back(I64(std::vector<int64_t>(size_t{1} << 20, round * 10 + i)));  // 8 MiB
        tags.push_back(Tags());
      }
      Result<std::vector<RowId>> put = client.PutRows(partition, tags, big, CapacityWait{true, 10000ms});
      ASSERT_TRUE(put.ok()) << "round " << round << ": " << put.status().ToString();
      TQ_ASSERT_OK(client.ClearPartition(partition).status());
    }
  }
  const std::string arena = queue->shm_segment;
  queue = Result<RemoteQueue>(Status::NotFound("closed"));
  ExpectCleanExit(*server);
  if (!arena.empty()) {
    EXPECT_EQ(ArenaSegments().count(arena), 0u) << arena << " left behind by a clean stop";
  }
}

// ---------------------------------------------------------------- raw peers

// Sends frames on a raw DEALER socket and reads the replies.
class RawPeer {
 public:
  explicit RawPeer(const std::string& endpoint) : context_(1), socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    socket_.connect(endpoint);
  }
  void Send(const std::vector<std::byte>& bytes) {
    socket_.send(zmq::buffer(bytes.data(), bytes.size()), zmq::send_flags::none);
  }
  void SendFrames(const std::vector<std::vector<std::byte>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i) {
      socket_.send(zmq::buffer(frames[i].data(), frames[i].size()),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    }
  }
  // The reply's Status (decoded error), OK for a success reply, or nullopt
  // if nothing came within `timeout`.
  std::optional<Status> Reply(std::chrono::milliseconds timeout) {
    zmq::pollitem_t item{static_cast<void*>(socket_), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, timeout);
    if ((item.revents & ZMQ_POLLIN) == 0) return std::nullopt;
    zmq::message_t reply;
    (void)socket_.recv(reply);
    const std::span<const std::byte> bytes(static_cast<const std::byte*>(reply.data()), reply.size());
    wire::WireLimits limits;
    Result<wire::Header> h = wire::DecodeHeader(bytes, limits);
    if (!h.ok()) return Status::Internal("unreadable reply: " + h.status().ToString());
    if (!h->is_reply()) return Status::Internal("not a reply");
    if (!h->is_error()) return Status::Ok();
    return wire::DecodeErrorReply(bytes, *h, limits);
  }

 private:
  zmq::context_t context_;
  zmq::socket_t socket_;
};

std::vector<std::byte> ToBytes(const wire::Message& m) { return {m.data.get(), m.data.get() + m.size}; }

// True if the local decoder accepts `bytes` as a request: such a frame could
// legitimately change state, so the malformed-input test does not send it.
bool DecodesAsRequest(const std::vector<std::byte>& bytes, const wire::WireLimits& limits) {
  using wire::DeclareWriteRequest;
  using wire::Empty;
  using wire::PutRequest;
  using wire::ShmWriteRequest;
  using wire::TakeRequest;
  Result<wire::Header> h = wire::DecodeHeader(bytes, limits);
  if (!h.ok() || h->is_reply()) return false;
  std::string token;
  switch (h->type) {
#define TQ_DECODES_(name, number, req, rep)                                                              \
  case wire::MessageType::k##name: {                                                                     \
    req r{};                                                                                             \
    return wire::DecodeRequest(bytes, *h, limits, nullptr, wire::testing::SampleNow(), &token, &r).ok(); \
  }
    SLUICE_TQ_WIRE_MESSAGES(TQ_DECODES_)
#undef TQ_DECODES_
  }
  return false;
}

void ExpectSameState(const ControllerStats& a, const ControllerStats& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.bytes_held, b.bytes_held);
  EXPECT_EQ(a.partitions, b.partitions);
  EXPECT_EQ(a.active_leases, b.active_leases);
  EXPECT_EQ(a.open_writes, b.open_writes);
  EXPECT_EQ(a.rows_created, b.rows_created);
  EXPECT_EQ(a.writes_committed, b.writes_committed);
  EXPECT_EQ(a.leases_granted, b.leases_granted);
}

TEST(NetProcessTest, MalformedFramesGetErrorsAndStateSurvives) {
  Result<ServerProcess> server =
      ServerProcess::Start(ServerArgs({"--max-tensor-bytes", "64K", "--max-message-bytes", "1M"}));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  Result<RemoteQueue> queue = ConnectTransferQueue(server->endpoint(), Options());
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  TransferQueueClient client = queue->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ASSERT_TRUE(client.PutRows("p", {Tags(), Tags()}, {{"prompt", {I64({1}), I64({2, 3})}}}).ok());
  Result<QueueStats> before = client.Stats();
  ASSERT_TRUE(before.ok());

  wire::WireLimits limits;
  limits.max_message_bytes = 1 << 20;
  limits.max_tensor_bytes = 64 << 10;
  RawPeer peer(server->endpoint());
  auto expect_error = [&](const std::vector<std::byte>& frame, const std::string& needle) {
    peer.Send(frame);
    std::optional<Status> reply = peer.Reply(10s);
    ASSERT_TRUE(reply.has_value()) << "no reply to a malformed frame (" << needle << ")";
    EXPECT_FALSE(reply->ok()) << needle;
    EXPECT_NE(reply->message().find(needle), std::string::npos) << reply->ToString();
  };
  expect_error({}, "shorter than the 32-byte header");
  expect_error(std::vector<std::byte>(3, std::byte{0x53}), "shorter than the 32-byte header");
  expect_error(std::vector<std::byte>(64, std::byte{0}), "magic");
  std::vector<std::byte> get =
      ToBytes(wire::EncodeRequest(wire::MessageType::kGetMeta, 0, 5, "", wire::testing::Sample<GetMetaRequest>()));
  {
    auto other = get;
    const int v = wire::kProtocolVersion;
    wire::StoreU16(other.data() + 4, static_cast<uint16_t>(v + 1));
    expect_error(other, "protocol version " + std::to_string(v + 1) + " is not supported: this build speaks version " +
                            std::to_string(v));
  }
  {
    auto cut = get;
    cut.resize(cut.size() - 3);
    expect_error(cut, "body bytes");
    wire::StoreU64(cut.data() + 24, cut.size() - wire::kHeaderBytes);
    expect_error(cut, "truncated");
  }
  {
    auto huge = get;  // columns count (after token and task) = 0xFFFFFFFF
    wire::StoreU32(huge.data() + wire::kHeaderBytes + 4 + 4 + 5, 0xFFFFFFFFu);
    expect_error(huge, "at most 64 allowed");
  }
  {
    StorageWriteRequest write = wire::testing::Sample<StorageWriteRequest>();
    expect_error(ToBytes(wire::EncodeRequest(wire::MessageType::kStorageWrite, 99, 6, "", write)),
                 "storage unit 99 does not exist");
    write.items[0].tensor = HostTensor::Copy(DType::kU8, {70000}, std::vector<uint8_t>(70000).data(), 70000);
    expect_error(ToBytes(wire::EncodeRequest(wire::MessageType::kStorageWrite, 1, 7, "", write)),
                 "max_tensor_bytes is 65536");
  }
  expect_error(ToBytes(wire::EncodeReply(wire::MessageType::kAck, 1, AckResponse{})), "sent to the server");
  peer.SendFrames({get, get});
  std::optional<Status> two = peer.Reply(10s);
  ASSERT_TRUE(two.has_value());
  EXPECT_NE(two->message().find("expected one frame per message, got 2"), std::string::npos) << two->ToString();

  // Random and mutated frames (only those the decoder refuses).
  std::vector<std::vector<std::byte>> seeds;
  for (const wire::Message& m : wire::testing::SampleMessages()) seeds.push_back(ToBytes(m));
  uint64_t rng = 7;
  int sent = 0;
  for (int i = 0; i < 400 && sent < 150; ++i) {
    std::vector<std::byte> frame = seeds[(rng = SplitMix64(rng)) % seeds.size()];
    for (int e = 0; e < 3; ++e) {
      rng = SplitMix64(rng);
      if (frame.empty()) break;
      frame[rng % frame.size()] = static_cast<std::byte>(rng >> 32);
    }
    if (i % 5 == 0) frame.resize((rng >> 16) % (frame.size() + 1));
    if (DecodesAsRequest(frame, limits)) continue;
    ++sent;
    peer.Send(frame);
    std::optional<Status> reply = peer.Reply(10s);
    ASSERT_TRUE(reply.has_value()) << "no reply to mutated frame " << i;
    EXPECT_FALSE(reply->ok()) << "mutated frame " << i << " was accepted";
  }
  EXPECT_GT(sent, 50);

  // Over max_message_bytes: ZeroMQ drops the connection, no reply.
  {
    RawPeer big(server->endpoint());
    big.Send(std::vector<std::byte>(2 << 20, std::byte{1}));
    EXPECT_FALSE(big.Reply(500ms).has_value());
  }

  // The well-behaved client still works, and nothing changed.
  Result<QueueStats> after = client.Stats();
  ASSERT_TRUE(after.ok()) << after.status().ToString();
  ExpectSameState(before->controller, after->controller);
  EXPECT_EQ(before->storage_bytes, after->storage_bytes);
  Result<BatchMeta> meta = client.GetMeta("reward", {"prompt"}, 2, "p", {}, 2s);
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  Result<BatchData> data = client.GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  TQ_EXPECT_OK(client.Ack(meta->lease_id).status());
  ExpectCleanExit(*server);
}

TEST(NetProcessTest, TokenIsRequiredAndChecked) {
  const std::string dir = testing::TempDir();
  const std::string token_file = dir + "/token";
  testing::WriteFile(token_file, "correct-horse-battery-staple\n");
  Result<ServerProcess> server = ServerProcess::Start(ServerArgs({"--token-file", token_file}));
  ASSERT_TRUE(server.ok()) << server.status().ToString();

  TQ_EXPECT_ERROR(ConnectTransferQueue(server->endpoint(), Options()), kFailedPrecondition,
                  "requires a token and the request's token is missing");
  TQ_EXPECT_ERROR(ConnectTransferQueue(server->endpoint(), Options("correct-horse-battery-stapler")),
                  kFailedPrecondition, "token is wrong");
  Result<RemoteQueue> queue = ConnectTransferQueue(server->endpoint(), Options("correct-horse-battery-staple"));
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  EXPECT_TRUE(queue->token_required);
  TQ_EXPECT_OK(queue->client().CreatePartition("p"));
  // A raw request without the token changes nothing.
  RawPeer peer(server->endpoint());
  peer.Send(ToBytes(wire::EncodeRequest(wire::MessageType::kClearPartition, 0, 1, "", ClearPartitionRequest{"p"})));
  std::optional<Status> reply = peer.Reply(10s);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->code(), StatusCode::kFailedPrecondition);
  Result<QueueStats> stats = queue->client().Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->controller.partitions, 1u);
  ExpectCleanExit(*server);
  static_cast<void>(sluice::RemoveTree(dir));
}

TEST(NetProcessTest, NonLoopbackBindWithoutTokenIsRefused) {
  for (const std::string bind : {"tcp://0.0.0.0:0", "tcp://*:0"}) {
    Result<ChildProcess> child = ChildProcess::Spawn(SLUICE_QUEUE_SERVER_PATH, {"--bind", bind}, {}, true);
    ASSERT_TRUE(child.ok());
    const std::string err = child->ReadAllStderr(20s);
    Result<int> status = child->Wait(20s);
    ASSERT_TRUE(status.ok());
    EXPECT_TRUE(WIFEXITED(*status));
    EXPECT_EQ(WEXITSTATUS(*status), 2) << err;
    EXPECT_NE(err.find("is not a loopback endpoint"), std::string::npos) << err;
    EXPECT_NE(err.find("--token-file is required"), std::string::npos) << err;
  }
  // Bad flags are refused with the flag named.
  Result<ChildProcess> child = ChildProcess::Spawn(SLUICE_QUEUE_SERVER_PATH, {"--storage-units", "0"}, {}, true);
  ASSERT_TRUE(child.ok());
  const std::string err = child->ReadAllStderr(20s);
  Result<int> status = child->Wait(20s);
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(WEXITSTATUS(*status), 2) << err;
  EXPECT_NE(err.find("storage-units"), std::string::npos) << err;
}

TEST(NetProcessTest, DeadServerIsUnavailableNotAHang) {
  Result<ServerProcess> server = ServerProcess::Start(ServerArgs());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  RemoteOptions options = Options();
  options.rpc_timeout = 1s;  // short, so that the dead server's errors come quickly
  // On a loaded machine the live server's first reply can take longer than
  // that: a few bounded attempts.
  Result<RemoteQueue> queue = Status::Unavailable("not tried");
  for (int attempt = 0; attempt < 5 && !queue.ok(); ++attempt)
    queue = ConnectTransferQueue(server->endpoint(), options);
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  ExpectCleanExit(*server);
  const auto start = std::chrono::steady_clock::now();
  TQ_EXPECT_ERROR(queue->client().Stats(), kUnavailable, server->endpoint());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
  TQ_EXPECT_ERROR(ConnectTransferQueue(server->endpoint(), options), kUnavailable, "no reply");
}

// Storage units in a process of their own (--serve-units), the controller's
// server pointed at it (--storage-hosts): clients read and write those units
// there, and its death fails their rows' reads, not the others'.
TEST(NetProcessTest, StorageServerProcessHoldsItsUnits) {
  const std::string dir = testing::TempDir();
  testing::WriteFile(dir + "/peer", "peer secret");
  Result<ServerProcess> storage =
      ServerProcess::Start({"--storage-units", "3", "--serve-units", "1-2", "--peer-token-file", dir + "/peer"});
  ASSERT_TRUE(storage.ok()) << storage.status().ToString();
  Result<ServerProcess> server = ServerProcess::Start(
      ServerArgs({"--storage-hosts", "1-2@" + storage->endpoint(), "--peer-token-file", dir + "/peer"}));
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  // A client of the storage server alone finds no controller there.
  Result<RemoteQueue> direct = ConnectTransferQueue(storage->endpoint(), Options());
  ASSERT_TRUE(direct.ok()) << direct.status().ToString();
  TQ_EXPECT_ERROR(direct->client().CreatePartition("p", 1), kFailedPrecondition,
                  "holds storage units 1..2 of a hub only");
  RemoteOptions options = Options();
  options.rpc_timeout = 3s;  // what a read of the dead storage server's rows waits at most, below
  Result<RemoteQueue> queue = ConnectTransferQueue(server->endpoint(), options);
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  ASSERT_EQ(queue->storage.size(), 3u);
  TransferQueueClient client = queue->client();
  EXPECT_EQ(client.fused(), nullptr);
  TQ_ASSERT_OK(client.CreatePartition("p", 1));
  auto put = [&](int n, int base) {
    std::vector<RowTags> tags;
    ColumnBatch columns;
    for (int i = 0; i < n; ++i) {
      tags.push_back(Tags(base + i, 0, 2));
      columns["prompt"].push_back(I64({base + i, base + i + 100}));
    }
    return client.PutRows("p", tags, columns);
  };
  Result<std::vector<RowId>> rows = put(6, 0);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  testing::TakeAndAckEachTask(client, 6, 100);
  if (::testing::Test::HasFatalFailure()) return;
  for (uint32_t u = 0; u < 3; ++u) {
    Result<StorageStats> stats = queue->storage[u]->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().ToString();
    EXPECT_EQ(stats->bytes, 0u) << "unit " << u << " after both tasks acked";
  }

  rows = put(3, 10);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  storage->process().Signal(SIGKILL);
  ASSERT_TRUE(storage->process().Wait(10s).ok());
  const auto started = std::chrono::steady_clock::now();
  for (RowId row : *rows) {
    const uint32_t unit = StorageUnitFor(row, 3);
    Result<StorageReadResponse> read = queue->storage[unit]->Read(StorageReadRequest{{row}, {"prompt"}});
    EXPECT_EQ(read.ok(), unit == 0) << "row " << row << " on unit " << unit << ": " << read.status().ToString();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - started, 30s);
  ExpectCleanExit(*server);
  static_cast<void>(sluice::RemoveTree(dir));
}

}  // namespace
}  // namespace sluice::transfer_queue
