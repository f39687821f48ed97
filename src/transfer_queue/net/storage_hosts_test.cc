// Storage units on other servers (ServerOptions::storage_hosts /
// storage_only): a controller's server and two storage servers, started
// here, with real clients over TCP.
#include <gtest/gtest.h>

#include <memory>
#include <thread>

#include "net/net_test_util.h"
#include "sluice/transfer_queue/remote.h"
#include "sluice/transfer_queue/server.h"
#include "test_util.h"

namespace sluice::transfer_queue {
namespace {

using namespace std::chrono_literals;
using testing::I64;
using testing::Tags;
using testing::ToI64;

constexpr char kPeer[] = "peer-secret";
constexpr uint32_t kUnits = 3;  // unit 0 on the controller's server, 1 and 2 on storage servers

std::unique_ptr<TransferQueueServer> Start(ServerOptions o) {
  Result<std::unique_ptr<TransferQueueServer>> server = TransferQueueServer::Start(std::move(o));
  EXPECT_TRUE(server.ok()) << server.status().ToString();
  return server.ok() ? std::move(server).value() : nullptr;
}

ServerOptions StorageOptions(uint32_t unit) {
  ServerOptions o;
  o.storage_only = true;
  o.storage_units = kUnits;
  o.first_unit = unit;
  o.unit_count = 1;
  o.peer_token = kPeer;
  return o;
}

// A hub whose units 1 and 2 live on storage servers of their own.
struct Hub {
  std::unique_ptr<TransferQueueServer> storage1, storage2, controller;

  explicit Hub(std::chrono::milliseconds open_write_timeout = 60s) {
    storage1 = Start(StorageOptions(1));
    storage2 = Start(StorageOptions(2));
    if (!storage1 || !storage2) return;
    ServerOptions o;
    o.controller.columns = testing::DefaultColumns();
    o.controller.tasks = {"reward", "train"};
    o.storage_units = kUnits;
    o.storage_hosts = {{1, 1, storage1->endpoint()}, {2, 1, storage2->endpoint()}};
    o.peer_token = kPeer;
    o.open_write_timeout = open_write_timeout;
    controller = Start(o);
  }
  bool ok() const { return controller != nullptr; }
  RemoteQueue Connect() const {
    RemoteOptions ro;
    ro.rpc_timeout = 5s;
    Result<RemoteQueue> queue = ConnectTransferQueue(controller->endpoint(), ro);
    EXPECT_TRUE(queue.ok()) << queue.status().ToString();
    return queue.ok() ? std::move(queue).value() : RemoteQueue{};
  }
  // Bytes held by unit u, on the server that holds it.
  uint64_t UnitBytes(uint32_t u) const {
    const TransferQueueServer& s = u == 0 ? *controller : u == 1 ? *storage1 : *storage2;
    Result<StorageStats> stats = s.storage()[u]->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status().ToString();
    return stats.ok() ? stats->bytes : 0;
  }
};

// A hub of three servers and a client of it with partition "p".
class StorageHostsHubTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(hub.ok());
    queue = hub.Connect();
    ASSERT_NE(queue.controller, nullptr);
    client = std::make_unique<TransferQueueClient>(queue.client());
    TQ_ASSERT_OK(client->CreatePartition("p"));
  }
  Hub hub;
  RemoteQueue queue;
  std::unique_ptr<TransferQueueClient> client;
};

TEST(StorageHostsTest, RowsLiveOnTheirUnitsServerAndTheirBytesTravelThereDirectly) {
  Hub hub;
  ASSERT_TRUE(hub.ok());
  RemoteQueue queue = hub.Connect();
  TransferQueueClient client = queue.client();
  EXPECT_EQ(client.fused(), nullptr) << "a put or take in one round trip would pass through the controller";
  TQ_ASSERT_OK(client.CreatePartition("p"));
  const uint64_t storage1_before = hub.storage1->counters().requests;
  std::vector<RowTags> tags;
  ColumnBatch put;
  for (int i = 0; i < 6; ++i) {
    tags.push_back(Tags());
    put["prompt"].push_back(I64({i, i + 10}));
  }
  Result<std::vector<RowId>> rows = client.PutRows("p", tags, put);
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  // Each unit holds its rows' bytes (rows are sharded row % 3), on its own server.
  for (uint32_t u = 0; u < kUnits; ++u) EXPECT_EQ(hub.UnitBytes(u), 2 * 16u) << "unit " << u;
  EXPECT_GT(hub.storage1->counters().requests, storage1_before);
  // Read back through each unit's server, by every consuming task; once both
  // acked, every server has freed its rows.
  testing::TakeAndAckEachTask(client, 6, 10);
  if (::testing::Test::HasFatalFailure()) return;
  for (uint32_t u = 0; u < kUnits; ++u) EXPECT_EQ(hub.UnitBytes(u), 0u) << "unit " << u;
  Result<QueueStats> stats = client.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().ToString();
  EXPECT_EQ(stats->controller.bytes_held, 0u);
  EXPECT_EQ(stats->storage_bytes, 0u);
}

TEST(StorageHostsTest, TheControllersOwnProcessWritesToTheStorageServersToo) {
  Hub hub;
  ASSERT_TRUE(hub.ok());
  // In process, beside the server (a launcher's prompt feeder): its writes
  // reach the storage servers on the peer token's word.
  TransferQueueClient here(hub.controller->controller(), hub.controller->storage());
  TQ_ASSERT_OK(here.CreatePartition("p"));
  Result<std::vector<RowId>> rows =
      here.PutRows("p", {Tags(), Tags(), Tags()}, {{"prompt", {I64({7}), I64({8}), I64({9})}}});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  for (uint32_t u = 0; u < kUnits; ++u) EXPECT_EQ(hub.UnitBytes(u), 8u) << "unit " << u;
  // A client elsewhere reads them where they are.
  RemoteQueue queue = hub.Connect();
  for (RowId row : *rows) {
    Result<StorageReadResponse> read =
        queue.storage[StorageUnitFor(row, kUnits)]->Read(StorageReadRequest{{row}, {"prompt"}});
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    EXPECT_GE(ToI64(read->tensors[0][0])[0], 7);
  }
}

TEST_F(StorageHostsHubTest, AStorageServerStoresOnlyWhatTheControllerDeclared) {
  // A row of unit 1, held on storage server 1.
  CreateRowsRequest create;
  create.partition = "p";
  create.rows = {Tags(), Tags()};
  Result<CreateRowsResponse> created = queue.controller->CreateRows(create);
  ASSERT_TRUE(created.ok()) << created.status().ToString();
  const RowId row = StorageUnitFor(created->rows[0], kUnits) == 1 ? created->rows[0] : created->rows[1];
  ASSERT_EQ(StorageUnitFor(row, kUnits), 1u);
  StorageUnit& unit = *queue.storage[1];
  // The storage server checks the cells the controller's server declared to it.
  const WriteId write_id = testing::ExpectOnlyDeclaredCellsStored(*queue.controller, unit, row);
  ASSERT_NE(write_id, 0u);
  EXPECT_EQ(hub.UnitBytes(1), 16u);
  // What only the controller's server may ask: refused to a client's token.
  TQ_EXPECT_ERROR(unit.FreeRows(StorageFreeRequest{{row}}), kFailedPrecondition, "not served remotely");
  // Aborting the write discards its cells on the storage server too.
  TQ_ASSERT_OK(queue.controller->AbortWrite(AbortWriteRequest{write_id}));
  EXPECT_EQ(hub.UnitBytes(1), 0u);

  // Requests sent to the wrong server are refused, naming the right one.
  RemoteOptions ro;
  ro.rpc_timeout = 5s;
  Result<std::shared_ptr<Controller>> wrong = NewRemoteController(hub.storage1->endpoint(), ro);
  ASSERT_TRUE(wrong.ok());
  TQ_EXPECT_ERROR((*wrong)->Describe(), kFailedPrecondition, "holds storage units 1..1 of a hub only");
  Result<std::shared_ptr<StorageUnit>> misrouted = NewRemoteStorageUnit(hub.controller->endpoint(), 1, ro);
  ASSERT_TRUE(misrouted.ok());
  TQ_EXPECT_ERROR((*misrouted)->Stats(), kInvalidArgument,
                  "storage unit 1 is served by " + hub.storage1->endpoint() + ", not here");
  Result<std::shared_ptr<StorageUnit>> absent = NewRemoteStorageUnit(hub.storage1->endpoint(), 2, ro);
  ASSERT_TRUE(absent.ok());
  TQ_EXPECT_ERROR((*absent)->Stats(), kInvalidArgument, "storage unit 2 is not on this storage server");
}

TEST(StorageHostsTest, AnAbandonedWritesCellsGoFromTheStorageServerToo) {
  Hub hub(200ms);
  ASSERT_TRUE(hub.ok());
  RemoteQueue queue = hub.Connect();
  TQ_ASSERT_OK(queue.client().CreatePartition("p"));
  BeginWriteRequest begin;
  begin.partition = "p";
  begin.target = WriteTarget::kNewRows;
  begin.new_rows = {Tags(), Tags(), Tags()};
  begin.columns = {
      {"prompt",
       {TensorMeta{DType::kI64, {2}, 16}, TensorMeta{DType::kI64, {2}, 16}, TensorMeta{DType::kI64, {2}, 16}}}};
  Result<BeginWriteResponse> write = queue.controller->BeginWrite(begin);
  ASSERT_TRUE(write.ok()) << write.status().ToString();
  for (RowId row : write->rows) {
    StorageWriteRequest store;
    store.write_id = write->write_id;
    store.items = {{row, "prompt", I64({1, 2})}};
    TQ_ASSERT_OK(queue.storage[StorageUnitFor(row, kUnits)]->Write(store));
  }
  for (uint32_t u = 0; u < kUnits; ++u) EXPECT_EQ(hub.UnitBytes(u), 16u) << "unit " << u;
  // ... and the producer vanishes: the controller's server aborts the write
  // and has the storage servers drop its cells.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (hub.controller->counters().writes_expired == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(hub.controller->counters().writes_expired, 1u);
  for (uint32_t u = 0; u < kUnits; ++u) EXPECT_EQ(hub.UnitBytes(u), 0u) << "unit " << u;
}

TEST(StorageHostsTest, BadLayoutsAndUnreachableStorageServersAreClearErrors) {
  ServerOptions o = StorageOptions(1);
  o.peer_token.clear();
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "storage_only needs a peer_token");
  o = StorageOptions(3);
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "are not a non-empty range of the hub's 3");
  o = StorageOptions(1);
  o.shm_bytes = 1 << 20;
  TQ_EXPECT_ERROR(TransferQueueServer::Start(o), kInvalidArgument, "no shared-memory arena");

  ServerOptions c;
  c.controller.columns = testing::DefaultColumns();
  c.storage_units = kUnits;
  c.storage_hosts = {{1, 2, "tcp://127.0.0.1:1"}, {2, 1, "tcp://127.0.0.1:2"}};
  c.peer_token = kPeer;
  TQ_EXPECT_ERROR(TransferQueueServer::Start(c), kInvalidArgument, "storage unit 2 is served by two storage servers");
  c.storage_hosts = {{1, 1, "tcp://127.0.0.1:1"}};
  c.peer_token.clear();
  TQ_EXPECT_ERROR(TransferQueueServer::Start(c), kInvalidArgument, "storage_hosts need a peer_token");
  c.peer_token = c.token = "same";
  c.bind = "tcp://127.0.0.1:0";
  TQ_EXPECT_ERROR(TransferQueueServer::Start(c), kInvalidArgument, "peer_token must differ from token");
  c.token.clear();
  c.peer_token = kPeer;

  // Nobody there: the controller's server gives up after the connect timeout.
  std::unique_ptr<TransferQueueServer> gone = Start(StorageOptions(1));
  ASSERT_NE(gone, nullptr);
  const std::string address = gone->endpoint();
  gone->Stop();
  gone.reset();
  c.storage_hosts = {{1, 1, address}};
  c.storage_connect_timeout = 500ms;
  const auto started = std::chrono::steady_clock::now();
  TQ_EXPECT_ERROR(TransferQueueServer::Start(c), kUnavailable, address);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 20s);
  // A storage server of another layout (a hub of 4 units) is refused.
  ServerOptions four = StorageOptions(1);
  four.storage_units = 4;
  std::unique_ptr<TransferQueueServer> other = Start(four);
  ASSERT_NE(other, nullptr);
  c.storage_hosts = {{1, 1, other->endpoint()}};
  TQ_EXPECT_ERROR(TransferQueueServer::Start(c), kFailedPrecondition, "serves a hub of 4 storage units");

  // A controller's server with the wrong peer token cannot declare writes
  // there: a write touching that server fails at BeginWrite, rolled back.
  std::unique_ptr<TransferQueueServer> storage = Start(StorageOptions(1));
  ASSERT_NE(storage, nullptr);
  c.storage_hosts = {{1, 1, storage->endpoint()}};
  c.peer_token = "not-the-peer-secret";
  std::unique_ptr<TransferQueueServer> impostor = Start(c);
  ASSERT_NE(impostor, nullptr);
  RemoteOptions ro;
  ro.rpc_timeout = 5s;
  Result<RemoteQueue> queue = ConnectTransferQueue(impostor->endpoint(), ro);
  ASSERT_TRUE(queue.ok()) << queue.status().ToString();
  TQ_ASSERT_OK(queue->client().CreatePartition("p"));
  TQ_EXPECT_ERROR(queue->client().PutRows("p", {Tags(), Tags()}, {{"prompt", {I64({1}), I64({2})}}}),
                  kFailedPrecondition, "DeclareWrite comes only from a hub's controller server");
  Result<ControllerStats> stats = queue->controller->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->open_writes, 0u);
  EXPECT_EQ(stats->bytes_reserved, 0u);
}

TEST_F(StorageHostsHubTest, AStorageServerThatDiesFailsCallsWithAClearErrorNotAHang) {
  Result<std::vector<RowId>> rows =
      client->PutRows("p", {Tags(), Tags(), Tags()}, {{"prompt", {I64({1}), I64({2}), I64({3})}}});
  ASSERT_TRUE(rows.ok()) << rows.status().ToString();
  hub.storage2->Stop();
  const RowId row = StorageUnitFor((*rows)[0], kUnits) == 2   ? (*rows)[0]
                    : StorageUnitFor((*rows)[1], kUnits) == 2 ? (*rows)[1]
                                                              : (*rows)[2];
  const auto started = std::chrono::steady_clock::now();
  Result<StorageReadResponse> read = queue.storage[2]->Read(StorageReadRequest{{row}, {"prompt"}});
  EXPECT_FALSE(read.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - started, 30s);
  // The other units' rows are still there.
  for (RowId r : *rows) {
    if (StorageUnitFor(r, kUnits) == 2) continue;
    Result<StorageReadResponse> alive =
        queue.storage[StorageUnitFor(r, kUnits)]->Read(StorageReadRequest{{r}, {"prompt"}});
    EXPECT_TRUE(alive.ok()) << alive.status().ToString();
  }
}

}  // namespace
}  // namespace sluice::transfer_queue
