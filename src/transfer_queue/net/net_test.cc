// The TransferQueue server and remote client in one process (fast, and the
// sanitizers see both sides): binding and options, concurrency of blocking
// calls, the server's write tracking, reclaim and shutdown.
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <thread>

#include "net/net_test_util.h"
#include "net/rpc_channel.h"
#include "sluice/common/file_util.h"
#include "sluice/transfer_queue/remote.h"
#include "sluice/transfer_queue/server.h"
#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

using namespace std::chrono_literals;
using testing::I64;
using testing::Tags;
using testing::ToI64;

ServerOptions DefaultServerOptions() {
  ServerOptions o;
  o.controller.columns = testing::DefaultColumns();
  o.controller.tasks = {"reward", "train"};
  o.storage_units = 2;
  return o;
}

std::unique_ptr<TransferQueueServer> StartServer(ServerOptions options = DefaultServerOptions()) {
  Result<std::unique_ptr<TransferQueueServer>> server = TransferQueueServer::Start(std::move(options));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

RemoteQueue Connect(const TransferQueueServer& server, RemoteOptions options = {}) {
  options.rpc_timeout = 10s;
  Result<RemoteQueue> queue = ConnectTransferQueue(server.endpoint(), options);
  EXPECT_TRUE(queue.ok()) << queue.status().ToString();
  return queue.ok() ? std::move(queue).value() : RemoteQueue{};
}

TEST(NetServerTest, LoopbackDetection) {
  for (const std::string e : {"tcp://127.0.0.1:0", "tcp://127.5.6.7:80", "tcp://[::1]:5555", "tcp://lo:0",
                              "tcp://[::ffff:127.0.0.1]:1", "ipc:///tmp/x.sock"}) {
    EXPECT_TRUE(IsLoopbackEndpoint(e)) << e;
  }
  for (const std::string e : {"tcp://0.0.0.0:0", "tcp://*:0", "tcp://10.0.0.1:80", "tcp://eth0:0", "tcp://[::]:1",
                              "tcp://example.com:1", "inproc://x", "tcp://128.0.0.1:1"}) {
    EXPECT_FALSE(IsLoopbackEndpoint(e)) << e;
  }
}

TEST(NetServerTest, OptionsAreValidated) {
  ServerOptions o = DefaultServerOptions();
  o.bind = "tcp://0.0.0.0:0";
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "refusing to bind tcp://0.0.0.0:0 without a token");
  o = DefaultServerOptions();
  o.bind = "udp://127.0.0.1:1";
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "unsupported transport");
  o.bind = "tcp://127.0.0.1:99999";
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "port '99999' is not a number in 0..65535");
  o = DefaultServerOptions();
  o.max_message_bytes = o.controller.max_tensor_bytes;
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "max_message_bytes");
  o = DefaultServerOptions();
  o.storage_units = 0;
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "storage_units");
  o = DefaultServerOptions();
  o.controller.capacity_rows = 0;
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "capacity");
  // A port in use is Unavailable.
  std::unique_ptr<TransferQueueServer> first = StartServer();
  ASSERT_NE(first, nullptr);
  o = DefaultServerOptions();
  o.bind = first->endpoint();
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kUnavailable, "cannot bind");
  // Client-side endpoint checks.
  TQ_EXPECT_ERROR(ConnectTransferQueue("http://x"), kInvalidArgument, "unsupported transport");
  TQ_EXPECT_ERROR(ConnectTransferQueue("tcp://127.0.0.1:99999"), kInvalidArgument, "not a number in 0..65535");
}

TEST(NetServerTest, IpcEndpointRoundTrip) {
  const std::string dir = testing::TempDir();
  ServerOptions o = DefaultServerOptions();
  o.bind = "ipc://" + dir + "/tq.sock";
  std::unique_ptr<TransferQueueServer> server = StartServer(o);
  ASSERT_NE(server, nullptr);
  EXPECT_EQ(server->endpoint(), o.bind);
  TransferQueueClient client = Connect(*server).client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  Result<std::vector<RowId>> rows = client.PutRows("p", {Tags()}, {{"prompt", {I64({7, 8, 9})}}});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  Result<BatchMeta> meta = client.GetMeta("train", {"prompt"}, 1, "p");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  Result<BatchData> data = client.GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(ToI64(data->columns["prompt"][0]), (std::vector<int64_t>{7, 8, 9}));
  // A renewal travels too: the deadline comes back on this process's clock.
  const auto before = std::chrono::steady_clock::now();
  Result<RenewResponse> renewed = client.Renew(meta->lease_id, std::chrono::milliseconds(90000));
  ASSERT_TRUE(renewed.ok()) << renewed.status().ToString();
  EXPECT_GE(renewed->deadline, before + std::chrono::milliseconds(89000));
  EXPECT_LE(renewed->deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(91000));
  TQ_ASSERT_OK(client.Ack(meta->lease_id).status());
  EXPECT_EQ(client.Renew(meta->lease_id).status().code(), StatusCode::kFailedPrecondition);
  server->Stop();
  static_cast<void>(sluice::RemoveTree(dir));
}

// Leaves a Unix socket file at `path` with nobody listening, as a process
// that died while serving there does. False if it could not.
bool LeaveStaleSocket(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (fd < 0 || path.size() >= sizeof(addr.sun_path)) return false;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(fd, 1) == 0;
  ::close(fd);  // closed without unlink: the file stays, refusing connections
  return bound;
}

// Regression: ZeroMQ unlinks and rebinds an ipc:// path, so a second server
// started on a live server's path silently took it over.
TEST(NetServerTest, SecondServerOnALiveIpcPathIsRefusedAndTheFirstKeepsServing) {
  const std::string dir = testing::TempDir();
  ServerOptions o = DefaultServerOptions();
  o.bind = "ipc://" + dir + "/tq.sock";
  std::unique_ptr<TransferQueueServer> first = StartServer(o);
  ASSERT_NE(first, nullptr);
  Result<std::unique_ptr<TransferQueueServer>> second = TransferQueueServer::Start(o);
  TQ_EXPECT_ERROR(second, kAlreadyExists, o.bind + ": another server is listening there");
  // The path still leads to the first server.
  {
    const uint64_t before = first->counters().requests;
    RemoteOptions quick;
    quick.rpc_timeout = 3s;
    Result<RemoteQueue> queue = ConnectTransferQueue(o.bind, quick);
    ASSERT_TRUE(queue.ok()) << queue.status().ToString();
    TQ_EXPECT_OK(queue->client().Stats().status());
    EXPECT_GT(first->counters().requests, before);
  }
  // A path holding something other than a socket is not replaced either.
  testing::WriteFile(dir + "/notes.txt", "keep me");
  o.bind = "ipc://" + dir + "/notes.txt";
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kAlreadyExists, "is not a socket");
  EXPECT_TRUE(std::filesystem::is_regular_file(dir + "/notes.txt"));
  if (second.ok()) (*second)->Stop();
  first->Stop();
  static_cast<void>(sluice::RemoveTree(dir));
}

// Regression (same defect, other side): the probe must not mistake a socket
// file a dead server left behind for a live server.
TEST(NetServerTest, StaleIpcSocketFileIsReclaimed) {
  const std::string dir = testing::TempDir();
  const std::string path = dir + "/tq.sock";
  ASSERT_TRUE(LeaveStaleSocket(path));
  ASSERT_TRUE(std::filesystem::is_socket(path));
  ServerOptions o = DefaultServerOptions();
  o.bind = "ipc://" + path;
  std::unique_ptr<TransferQueueServer> server = StartServer(o);
  ASSERT_NE(server, nullptr);
  TransferQueueClient client = Connect(*server).client();
  TQ_EXPECT_OK(client.Stats().status());
  server->Stop();
  static_cast<void>(sluice::RemoveTree(dir));
}

// Regression: the socket file was left behind after a clean shutdown.
TEST(NetServerTest, CleanShutdownRemovesTheIpcSocketFile) {
  const std::string dir = testing::TempDir();
  ServerOptions o = DefaultServerOptions();
  o.bind = "ipc://" + dir + "/stopped.sock";
  std::unique_ptr<TransferQueueServer> stopped = StartServer(o);
  ASSERT_NE(stopped, nullptr);
  EXPECT_TRUE(std::filesystem::is_socket(dir + "/stopped.sock"));
  stopped->Stop();
  EXPECT_FALSE(std::filesystem::exists(dir + "/stopped.sock"));
  o.bind = "ipc://" + dir + "/destroyed.sock";
  std::unique_ptr<TransferQueueServer> destroyed = StartServer(o);
  ASSERT_NE(destroyed, nullptr);
  EXPECT_TRUE(std::filesystem::is_socket(dir + "/destroyed.sock"));
  destroyed.reset();
  EXPECT_FALSE(std::filesystem::exists(dir + "/destroyed.sock"));
  static_cast<void>(sluice::RemoveTree(dir));
}

// A lease's holder travels with its GetMeta, and a supervisor in another
// process (here: another connection) releases a dead holder's leases.
TEST(NetServerTest, LeasesOfAHolderAreReleasedOverTheWire) {
  std::unique_ptr<TransferQueueServer> server = StartServer(DefaultServerOptions());
  ASSERT_NE(server, nullptr);
  RemoteQueue worker_queue = Connect(*server), supervisor_queue = Connect(*server);
  TransferQueueClient worker = worker_queue.client(), supervisor = supervisor_queue.client();
  TQ_ASSERT_OK(worker.CreatePartition("p"));
  ASSERT_TRUE(worker.PutRows("p", {Tags(), Tags()}, {{"prompt", {I64({1}), I64({2})}}}).ok());
  GetMetaRequest take;
  take.task = "train";
  take.columns = {"prompt"};
  take.n = 2;
  take.partition = "p";
  take.lease_timeout = std::chrono::minutes(10);
  take.holder = "rollout-1/4242";
  Result<BatchMeta> held = worker.GetMeta(take);
  ASSERT_TRUE(held.ok()) << held.status().ToString();
  Result<ReleaseHolderResponse> released = supervisor.ReleaseHolder("rollout-1/4242");
  ASSERT_TRUE(released.ok()) << released.status().ToString();
  EXPECT_EQ(released->leases_released, 1u);
  EXPECT_EQ(released->rows_returned, 2u);
  take.holder = "";
  Result<BatchMeta> again = supervisor.GetMeta(take);  // ready again, long before the 10 minutes
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  TQ_EXPECT_ERROR(worker.Ack(held->lease_id), kFailedPrecondition, "released");
  TQ_EXPECT_ERROR(supervisor.ReleaseHolder(""), kInvalidArgument, "holder is empty");
}

// A GetMeta waiting for rows runs on its own thread: other clients' quick
// calls are served meanwhile, and the waiter gets the rows once written.
TEST(NetServerTest, BlockedGetMetaDoesNotBlockOthers) {
  ServerOptions o = DefaultServerOptions();
  o.workers = 1;
  std::unique_ptr<TransferQueueServer> server = StartServer(o);
  ASSERT_NE(server, nullptr);
  RemoteQueue queue = Connect(*server);
  TransferQueueClient client = queue.client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  std::vector<std::thread> waiters;
  std::atomic<int> served{0};
  for (int i = 0; i < 3; ++i) {
    waiters.emplace_back([&] {
      Result<BatchMeta> meta = client.GetMeta("train", {"prompt"}, 1, "p", {}, 10s);
      EXPECT_TRUE(meta.ok()) << meta.status().ToString();
      if (meta.ok()) served.fetch_add(1);
    });
  }
  while (server->controller()->Stats()->waiting_consumers < 3) std::this_thread::sleep_for(1ms);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(client.Stats().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, 2s);
  EXPECT_EQ(served.load(), 0);
  ColumnBatch put;
  for (int i = 0; i < 3; ++i) put["prompt"].push_back(I64({i}));
  ASSERT_TRUE(client.PutRows("p", {Tags(), Tags(), Tags()}, put).ok());
  for (auto& t : waiters) t.join();
  EXPECT_EQ(served.load(), 3);
}

TEST(NetServerTest, TooManyBlockingCallsIsResourceExhausted) {
  ServerOptions o = DefaultServerOptions();
  o.max_blocking_calls = 1;
  std::unique_ptr<TransferQueueServer> server = StartServer(o);
  ASSERT_NE(server, nullptr);
  // Through ZeroMQ: a direct connection has a thread of its own instead.
  RemoteOptions zmq_only;
  zmq_only.direct_connections = 0;
  TransferQueueClient client = Connect(*server, zmq_only).client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  std::thread waiter([&] { TQ_EXPECT_ERROR(client.GetMeta("train", {"prompt"}, 1, "p", {}, 2500ms), kTimeout, ""); });
  while (server->controller()->Stats()->waiting_consumers < 1) std::this_thread::sleep_for(1ms);
  TQ_EXPECT_ERROR(client.GetMeta("reward", {"prompt"}, 1, "p", {}, 10ms), kResourceExhausted, "max_blocking_calls");
  waiter.join();
  EXPECT_EQ(server->counters().busy, 1u);
  // Capacity for blocking calls comes back.
  TQ_EXPECT_ERROR(client.GetMeta("reward", {"prompt"}, 1, "p", {}, 10ms), kTimeout, "");
}

// A producer that dies between BeginWrite and CommitWrite: the server aborts
// the write after open_write_timeout, so its reservation is not leaked.
TEST(NetServerTest, AbandonedWriteIsAbortedByTheServer) {
  ServerOptions o = DefaultServerOptions();
  o.open_write_timeout = 200ms;
  std::unique_ptr<TransferQueueServer> server = StartServer(o);
  ASSERT_NE(server, nullptr);
  RemoteQueue queue = Connect(*server);
  TQ_ASSERT_OK(queue.client().CreatePartition("p"));
  BeginWriteRequest begin;
  begin.partition = "p";
  begin.target = WriteTarget::kNewRows;
  begin.new_rows = {Tags()};
  begin.columns = {{"prompt", {TensorMeta{DType::kI64, {2}, 16}}}};
  Result<BeginWriteResponse> write = queue.controller->BeginWrite(begin);
  ASSERT_TRUE(write.ok()) << write.status().ToString();
  const RowId row = write->rows[0];
  StorageWriteRequest store;
  store.write_id = write->write_id;
  store.items = {{row, "prompt", I64({1, 2})}};
  TQ_ASSERT_OK(queue.storage[StorageUnitFor(row, 2)]->Write(store));
  Result<ControllerStats> stats = queue.controller->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->bytes_reserved, 16u);
  // ... and the producer vanishes.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (server->counters().writes_expired == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(server->counters().writes_expired, 1u);
  stats = queue.controller->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->open_writes, 0u);
  EXPECT_EQ(stats->bytes_held, 0u);
  EXPECT_EQ(stats->rows, 0u);
  Result<StorageStats> unit = queue.storage[StorageUnitFor(row, 2)]->Stats();
  ASSERT_TRUE(unit.ok());
  EXPECT_EQ(unit->bytes, 0u);
  TQ_EXPECT_ERROR(queue.controller->CommitWrite(CommitWriteRequest{write->write_id}), kNotFound,
                  "aborted by the server after being left open longer than open_write_timeout = 200 ms");
}

TEST(NetServerTest, StorageAcceptsOnlyDeclaredCellsOfOpenWrites) {
  std::unique_ptr<TransferQueueServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RemoteQueue queue = Connect(*server);
  TransferQueueClient client = queue.client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  Result<std::vector<RowId>> rows = client.PutRows("p", {Tags(), Tags()}, {{"prompt", {I64({1}), I64({2})}}});
  ASSERT_TRUE(rows.ok());
  const RowId row = (*rows)[0];
  StorageUnit& unit = *queue.storage[StorageUnitFor(row, 2)];
  const WriteId write_id = testing::ExpectOnlyDeclaredCellsStored(*queue.controller, unit, row);
  ASSERT_NE(write_id, 0u);
  // ... only for the write's rows, and only on the unit that owns the row.
  StorageWriteRequest rogue;
  rogue.write_id = write_id;
  rogue.items = {{(*rows)[1], "response", I64({1, 2})}};
  TQ_EXPECT_ERROR(unit.Write(rogue), kInvalidArgument, "not a target of the write");
  StorageUnit& other = *queue.storage[1 - StorageUnitFor(row, 2)];
  rogue.items = {{row, "response", I64({1, 2})}};
  TQ_EXPECT_ERROR(other.Write(rogue), kInvalidArgument, "belongs to storage unit");

  // Remote Discard touches only open writes' cells: the committed prompt stays.
  TQ_ASSERT_OK(unit.Discard(StorageDiscardRequest{{row}, {"prompt", "response"}}));
  Result<StorageReadResponse> read = unit.Read(StorageReadRequest{{row}, {"prompt"}});
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  TQ_EXPECT_ERROR(unit.Read(StorageReadRequest{{row}, {"response"}}), kNotFound, "response");
  // AbortWrite discards on the server too; FreeRows is not served remotely.
  TQ_ASSERT_OK(queue.controller->AbortWrite(AbortWriteRequest{write_id}));
  TQ_EXPECT_ERROR(unit.FreeRows(StorageFreeRequest{{row}}), kFailedPrecondition, "not served remotely");
  Result<QueueStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->controller.bytes_held, stats->storage_bytes);
}

// Stores the bytes on the server, then reports a failure: the client's
// rollback (Discard, then AbortWrite) must run over the wire.
class StoreThenFail final : public StorageUnit {
 public:
  explicit StoreThenFail(std::shared_ptr<StorageUnit> unit) : unit_(std::move(unit)) {}
  Status Write(const StorageWriteRequest& r) override {
    SLUICE_RETURN_IF_ERROR(unit_->Write(r));
    return Status::Unavailable("injected failure after storing");
  }
  Result<StorageReadResponse> Read(const StorageReadRequest& r) override { return unit_->Read(r); }
  Status Discard(const StorageDiscardRequest& r) override { return unit_->Discard(r); }
  Status FreeRows(const StorageFreeRequest& r) override { return unit_->FreeRows(r); }
  Result<StorageStats> Stats() override { return unit_->Stats(); }

 private:
  std::shared_ptr<StorageUnit> unit_;
};

TEST(NetServerTest, FailedWritesRollBackOverTheWire) {
  std::unique_ptr<TransferQueueServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RemoteQueue queue = Connect(*server);
  TQ_ASSERT_OK(queue.client().CreatePartition("p"));
  TransferQueueClient faulty(queue.controller, {std::make_shared<StoreThenFail>(queue.storage[0]), queue.storage[1]});
  ColumnBatch put;
  for (int i = 0; i < 4; ++i) put["prompt"].push_back(I64({i, i}));
  TQ_EXPECT_ERROR(faulty.PutRows("p", {Tags(), Tags(), Tags(), Tags()}, put), kUnavailable, "rolled back");
  Result<QueueStats> stats = queue.client().Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->controller.open_writes, 0u);
  EXPECT_EQ(stats->controller.bytes_held, 0u);
  EXPECT_EQ(stats->controller.rows, 0u);
  EXPECT_EQ(stats->storage_bytes, 0u);
  EXPECT_EQ(stats->controller.writes_aborted, 1u);
  // The schema check happens at BeginWrite: nothing is stored or reserved.
  TQ_EXPECT_ERROR(queue.client().PutRows("p", {Tags()}, {{"reward", {I64({1})}}}), kInvalidArgument, "dtype");
  stats = queue.client().Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->controller.bytes_held, 0u);
}

TEST(NetServerTest, StopWakesBlockedCallsWithAborted) {
  std::unique_ptr<TransferQueueServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  TransferQueueClient client = Connect(*server).client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  std::thread waiter([&] { TQ_EXPECT_ERROR(client.GetMeta("train", {"prompt"}, 1, "p", {}, 20s), kAborted, ""); });
  while (server->controller()->Stats()->waiting_consumers < 1) std::this_thread::sleep_for(1ms);
  const auto start = std::chrono::steady_clock::now();
  server->Stop();
  waiter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

// The I/O thread's last turn (a hub storage rank's heartbeat follows it):
// recent while the server serves, idle or not; it ages once the thread stops.
TEST(NetServerTest, IoLoopAgeIsRecentWhileServingAndGrowsOnceStopped) {
  std::unique_ptr<TransferQueueServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  std::this_thread::sleep_for(2000ms);                 // idle: the loop still turns (every 200 ms)
  EXPECT_LT(server->counters().io_loop_age_ms, 1500);  // (room for a loaded machine)
  server->Stop();
  std::this_thread::sleep_for(1700ms);
  EXPECT_GE(server->counters().io_loop_age_ms, 1600);
}

// A client's limits rise to the server's at connect: big tensors pass both ways.
TEST(NetServerTest, ClientLimitsRiseToTheServers) {
  std::unique_ptr<TransferQueueServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RemoteOptions small;
  small.max_message_bytes = 64 << 10;
  small.max_tensor_bytes = 32 << 10;
  TransferQueueClient client = Connect(*server, small).client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  std::vector<int64_t> big(64 << 10);  // 512 KiB
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<int64_t>(i * 7);
  ASSERT_TRUE(client.PutRows("p", {Tags()}, {{"prompt", {I64(big)}}}).ok());
  Result<BatchMeta> meta = client.GetMeta("train", {"prompt"}, 1, "p");
  ASSERT_TRUE(meta.ok()) << meta.status().ToString();
  Result<BatchData> data = client.GetData(*meta);
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  EXPECT_EQ(ToI64(data->columns["prompt"][0]), big);
  // A message over the (raised) limit is refused before sending.
  RemoteOptions tiny;
  tiny.max_message_bytes = 4096;
  Result<std::shared_ptr<StorageUnit>> unit = NewRemoteStorageUnit(server->endpoint(), 0, tiny);
  ASSERT_TRUE(unit.ok());
  StorageWriteRequest write{1, {{0, "prompt", I64(big)}}};
  TQ_EXPECT_ERROR((*unit)->Write(write), kOutOfRange, "exceeds max_message_bytes 4096");
}

// PutRows and TakeBatch, over messages and over the arena: one request per
// put and per take, the same rows and bytes as the calls in steps, the ack
// riding on the next take, and their failures leaving nothing behind.
TEST(NetServerTest, PutsAndTakesInOneRoundTrip) {
  for (const bool shm : {false, true}) {
    SCOPED_TRACE(shm ? "shm" : "messages");
    ServerOptions o = DefaultServerOptions();
    if (shm) o.shm_bytes = 64 << 20;
    std::unique_ptr<TransferQueueServer> server = StartServer(o);
    ASSERT_NE(server, nullptr);
    RemoteOptions ro;
    ro.shm = shm ? ShmMode::kRequired : ShmMode::kOff;
    RemoteQueue queue = Connect(*server, ro);
    TransferQueueClient client = queue.client();
    ASSERT_NE(client.fused(), nullptr);
    TQ_ASSERT_OK(client.CreatePartition("p"));
    auto requests = [&] { return server->counters().requests; };

    uint64_t before = requests();
    ColumnBatch put;
    for (int i = 0; i < 4; ++i) {
      put["prompt"].push_back(I64({i, i + 1}));
      put["reward"].push_back(testing::F32Scalar(0.5f * i));
    }
    Result<std::vector<RowId>> rows = client.PutRows("p", {Tags(), Tags(), Tags(), Tags()}, put);
    ASSERT_TRUE(rows.ok()) << rows.status().ToString();
    EXPECT_EQ(requests() - before, 1u) << "a small put is one PutRows request";

    GetMetaRequest get;
    get.task = "train";
    get.columns = {"prompt", "reward"};
    get.n = 2;
    get.partition = "p";
    get.timeout = 1s;
    before = requests();
    Result<TakenBatch> first = client.Take(get, {"reward", "prompt"});
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    EXPECT_EQ(requests() - before, 1u) << "a take is one TakeBatch request";
    ASSERT_EQ(first->meta.rows.size(), 2u);
    EXPECT_EQ(first->data.rows, first->meta.row_ids());
    for (size_t i = 0; i < 2; ++i) {
      const int64_t v = testing::ToI64(first->data.columns.at("prompt")[i])[0];
      EXPECT_EQ(testing::ToI64(first->data.columns.at("prompt")[i]), (std::vector<int64_t>{v, v + 1}));
      EXPECT_EQ(testing::ToF32(first->data.columns.at("reward")[i]), 0.5f * static_cast<float>(v));
    }
    // The next take acks the first batch: its rows are freed by the train
    // task's ack only once "reward" acks too, so count leases instead.
    Result<TakenBatch> second = client.Take(get, {}, first->meta.lease_id);
    ASSERT_TRUE(second.ok()) << second.status().ToString();
    EXPECT_EQ(second->data.columns.size(), 2u);
    Result<QueueStats> stats = client.Stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->controller.leases_acked, 1u);
    EXPECT_EQ(stats->controller.active_leases, 1u);

    // A failed ack takes nothing: the rows stay for the next take.
    TQ_ASSERT_OK(client.Release(second->meta.lease_id).status());
    TQ_EXPECT_ERROR(client.Take(get, {}, first->meta.lease_id), kFailedPrecondition, "nothing taken");
    // A column outside the batch: refused, and the lease given back at once.
    TQ_EXPECT_ERROR(client.Take(get, {"mask"}), kInvalidArgument, "'mask' is not in the batch");
    TQ_EXPECT_ERROR(client.Take(get, {"prompt", "prompt"}), kInvalidArgument, "listed twice");
    get.timeout = 0ms;
    Result<TakenBatch> third = client.Take(get);
    ASSERT_TRUE(third.ok()) << third.status().ToString();
    EXPECT_EQ(third->meta.rows.size(), 2u);
    TQ_ASSERT_OK(client.Ack(third->meta.lease_id).status());

    // A put that fails at the server rolls back: nothing becomes visible.
    ColumnBatch bad;
    bad["reward"].push_back(I64({1}));  // reward is F32
    TQ_EXPECT_ERROR(client.PutRows("p", {Tags()}, bad), kInvalidArgument, "");
    // So does a PutRows whose bytes are not what it declares (a raw client).
    Result<std::shared_ptr<internal::RpcChannel>> raw = internal::RpcChannel::Create(server->endpoint(), {});
    ASSERT_TRUE(raw.ok());
    wire::PutRequest lying;
    lying.begin.partition = "p";
    lying.begin.target = WriteTarget::kNewRows;
    lying.begin.new_rows = {Tags()};
    lying.begin.columns = {ColumnWriteMeta{"prompt", {TensorMeta{DType::kI64, {1}, 8}}}};
    TQ_EXPECT_ERROR((*raw)->Call<BeginWriteResponse>(wire::MessageType::kPutRows, 0, lying, 0ms), kInvalidArgument,
                    "data for 0 columns");
    lying.data = {{I64({1, 2})}};
    TQ_EXPECT_ERROR((*raw)->Call<BeginWriteResponse>(wire::MessageType::kPutRows, 0, lying, 0ms), kInvalidArgument,
                    "rolled back");
    stats = client.Stats();
    ASSERT_TRUE(stats.ok());
    EXPECT_EQ(stats->controller.open_writes, 0u);
    EXPECT_EQ(stats->controller.rows, 4u);

    // With the arena, a big put copies into it directly (several requests).
    if (shm) {
      before = requests();
      ColumnBatch big;
      big["prompt"].push_back(I64(std::vector<int64_t>(kFusedPutMaxBytes / 8 + 1, 7)));
      ASSERT_TRUE(client.PutRows("p", {Tags()}, big).ok());
      EXPECT_GT(requests() - before, 1u);
    }
  }
}

// Direct TCP connections: used by default, bounded (the rest go through
// ZeroMQ), and a trust boundary like the ZeroMQ socket.
TEST(NetServerTest, DirectConnectionsCarryCallsAndFallBackToZeroMq) {
  ServerOptions o = DefaultServerOptions();
  o.direct_connections = 2;
  std::unique_ptr<TransferQueueServer> server = StartServer(o);
  ASSERT_NE(server, nullptr);
  {
    RemoteQueue queue = Connect(*server);
    TransferQueueClient client = queue.client();
    TQ_ASSERT_OK(client.CreatePartition("p"));
    EXPECT_EQ(server->counters().direct_open, 1u);
    std::vector<std::thread> threads;
    std::atomic<int> ok{0};
    for (int t = 0; t < 5; ++t) {
      threads.emplace_back([&, t] {
        for (int i = 0; i < 30; ++i) {
          ColumnBatch put;
          put["prompt"].push_back(I64({t, i}));
          Result<std::vector<RowId>> rows = client.PutRows("p", {Tags()}, put);
          ASSERT_TRUE(rows.ok()) << rows.status().ToString();
          GetMetaRequest get;
          get.task = "train";
          get.columns = {"prompt"};
          get.n = 1;
          get.partition = "p";
          get.timeout = 5s;
          Result<TakenBatch> taken = client.Take(get);
          ASSERT_TRUE(taken.ok()) << taken.status().ToString();
          TQ_ASSERT_OK(client.Ack(taken->meta.lease_id).status());
          ok.fetch_add(1);
        }
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(ok.load(), 150);
    EXPECT_EQ(server->counters().direct_open, 2u);  // the others went through ZeroMQ
    const ServerCounters counters = server->counters();
    EXPECT_GT(counters.direct_requests, 0u);  // counted among all requests
    EXPECT_LE(counters.direct_requests, counters.requests);
    EXPECT_EQ(counters.ring_requests, 0u);
  }
  // The client is gone: its connections' threads end.
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server->counters().direct_open > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(server->counters().direct_open, 0u);
}

// A server gone after it took direct connections: calls fail in
// seconds, not after their timeout on ZeroMQ (a dead storage rank's peers).
TEST(NetServerTest, DeadServerFailsCallsFastOverDirectConnections) {
  std::unique_ptr<TransferQueueServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RemoteOptions options;
  options.rpc_timeout = 30s;
  Result<RemoteQueue> queue = ConnectTransferQueue(server->endpoint(), options);
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  TransferQueueClient client = queue->client();
  TQ_ASSERT_OK(client.CreatePartition("p"));
  ASSERT_GT(server->counters().direct_requests, 0u);
  server.reset();
  // The idle connection's call sees it closed; the next ones find nothing
  // listening on the direct port.
  EXPECT_FALSE(client.Stats().ok());
  for (int i = 0; i < 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    TQ_EXPECT_ERROR(client.Stats(), kUnavailable, "the server is down");
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "call " << i;
  }
}

TEST(NetServerTest, DirectConnectionsRefuseGarbageAndStrangers) {
  ServerOptions o = DefaultServerOptions();
  o.token = "secret";
  std::unique_ptr<TransferQueueServer> server = StartServer(o);
  ASSERT_NE(server, nullptr);
  Result<RemoteQueue> good = ConnectTransferQueue(server->endpoint(), RemoteOptions{.token = "secret"});
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  TQ_ASSERT_OK(good->client().CreatePartition("p"));
  // The wrong token over a direct connection: refused, and that connection closed.
  Result<RemoteQueue> stranger = ConnectTransferQueue(server->endpoint(), RemoteOptions{.token = "guess"});
  TQ_EXPECT_ERROR(stranger, kFailedPrecondition, "authentication failed");

  Result<wire::ServerInfo> info = (*internal::RpcChannel::Create(server->endpoint(), {.token = "secret"}))
                                      ->Call<wire::ServerInfo>(wire::MessageType::kServerInfo, 0, wire::Empty{}, 0ms);
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  ASSERT_GT(info->direct_port, 0u);
  auto raw = [&]() -> net::UniqueFd {
    Result<net::UniqueFd> fd =
        net::ConnectTcp("127.0.0.1", static_cast<uint16_t>(info->direct_port), std::chrono::steady_clock::now() + 5s);
    EXPECT_TRUE(fd.ok()) << fd.status().ToString();
    uint64_t greeting = 0;
    EXPECT_TRUE(net::RecvAll(fd->get(), &greeting, 8, std::chrono::steady_clock::now() + 5s).ok());
    EXPECT_EQ(greeting, internal::kDirectAccepted);
    return std::move(*fd);
  };
  auto closed_by_server = [](int fd) {
    char byte;
    return !net::RecvAll(fd, &byte, 1, std::chrono::steady_clock::now() + 5s).ok();
  };
  const uint64_t malformed = server->counters().malformed;
  {
    // A frame longer than max_message_bytes: closed before anything is allocated.
    net::UniqueFd fd = raw();
    const uint64_t huge = uint64_t{1} << 40;
    TQ_ASSERT_OK(net::SendAll(fd.get(), &huge, 8, std::chrono::steady_clock::now() + 5s));
    EXPECT_TRUE(closed_by_server(fd.get()));
  }
  {
    // Garbage of a plausible length: an error reply, then the connection is closed.
    net::UniqueFd fd = raw();
    std::vector<std::byte> junk(64, std::byte{0x5a});
    const uint64_t n = junk.size();
    TQ_ASSERT_OK(net::SendAllParts(fd.get(), &n, 8, junk.data(), n, std::chrono::steady_clock::now() + 5s));
    uint64_t reply = 0;
    TQ_ASSERT_OK(net::RecvAll(fd.get(), &reply, 8, std::chrono::steady_clock::now() + 5s));
    std::vector<std::byte> body(reply);
    TQ_ASSERT_OK(net::RecvAll(fd.get(), body.data(), reply, std::chrono::steady_clock::now() + 5s));
    Result<wire::Header> h = wire::DecodeHeader(body, wire::WireLimits{});
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    EXPECT_TRUE(h->is_error());
    EXPECT_TRUE(closed_by_server(fd.get()));
  }
  {
    // Half a frame, then the client goes away: its thread ends.
    net::UniqueFd fd = raw();
    const uint64_t n = 1000;
    TQ_ASSERT_OK(net::SendAllParts(fd.get(), &n, 8, "partial", 7, std::chrono::steady_clock::now() + 5s));
  }
  EXPECT_GE(server->counters().malformed, malformed + 2);
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (server->counters().direct_open > 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(server->counters().direct_open, 1u);  // the good client's
  // Nothing reached the queue; the good client still works.
  Result<QueueStats> stats = good->client().Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->controller.rows, 0u);
}

TEST(NetServerTest, ClosedRemoteControllerIsAborted) {
  std::unique_ptr<TransferQueueServer> server = StartServer();
  ASSERT_NE(server, nullptr);
  RemoteQueue queue = Connect(*server);
  queue.controller->Close();
  TQ_EXPECT_ERROR(queue.controller->Stats(), kAborted, "closed");
  // The server is untouched: a fresh connection works.
  RemoteQueue other = Connect(*server);
  EXPECT_TRUE(other.controller->Stats().ok());
}

}  // namespace
}  // namespace sluice::transfer_queue
