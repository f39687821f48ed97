// Remote Controller and StorageUnits: the same abstract interfaces as the
// in-process ones (controller.h, storage.h), implemented by sending their
// request structs to a TransferQueueServer (server.h) over ZeroMQ. So
//
//   SLUICE_ASSIGN_OR_RETURN(RemoteQueue queue, ConnectTransferQueue(endpoint));
//   TransferQueueClient client = queue.client();
//
// works exactly like an in-process hub: same calls, same errors (the
// server's Status codes and messages come back unchanged).
//
// Contract
//  * Timeouts. Every call waits at most rpc_timeout for its reply, plus the
//    time the request itself may block (GetMeta's timeout, a producer's
//    CapacityWait). No reply in time: Unavailable naming the endpoint (the
//    server is down, unreachable or overloaded). A dead server never hangs a
//    caller beyond that.
//  * A call that timed out may still have run on the server (e.g. a GetMeta
//    whose reply was lost leaves a lease that will expire; a write that was
//    begun is aborted by the server after its open_write_timeout).
//  * GetData/KvGet tensors are views into the received message (no copy
//    when aligned); they keep it alive.
//  * Shared memory. When the server has an arena (ServerOptions::shm_bytes)
//    and this process can open it (same host, same /dev/shm), payloads skip
//    the socket: a write allocates cells in the arena and copies the bytes
//    into them once; a read returns views of the arena itself (no copy).
//    Such a view stays valid after its row is freed or cleared, as long as
//    it is held; while held it keeps that memory (and anything freed after
//    it was read) from reuse, so drop views when done. RemoteOptions::shm
//    decides whether to use it.
//  * BatchMeta::deadline is the server's "time left" added to this host's
//    steady clock when the reply arrived: slightly late, never early by more
//    than the reply's transit time.
//  * Close() on a remote controller makes later calls from this object
//    return Aborted; it does not close the server.
//  * One round trip per put and per take. A put (PutRows, PutColumns, KvPut,
//    KvPutBatch) is one PutRows message carrying the bytes, except with the
//    arena and over kFusedPutMaxBytes of payload, where the bytes go
//    straight into the arena (three messages, one copy). Take is one
//    TakeBatch message: the ack of the previous batch, GetMeta and the read.
//
//  * Paths. Each call takes the fastest one free: a shared-memory ring
//    (same host, with the arena; shm_rings), else a direct TCP connection
//    (direct_connections, when the server listens for them), else a ZeroMQ
//    DEALER socket. The same messages and errors on every path.
//
// Thread safety: every object is thread-safe. Parts made by one
// ConnectTransferQueue share pools of rings, direct connections and ZeroMQ
// DEALER sockets; each call checks one out for its request and reply (one
// request in flight on each), so concurrent calls from many threads run in
// parallel and never share one. One whose call timed out is closed, not
// reused.
#ifndef SLUICE_TRANSFER_QUEUE_REMOTE_H_
#define SLUICE_TRANSFER_QUEUE_REMOTE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/client.h"
#include "sluice/transfer_queue/controller.h"
#include "sluice/transfer_queue/storage.h"

namespace sluice::transfer_queue {

enum class ShmMode : uint8_t {
  kAuto,      // use the server's arena when it has one and it opens here; else messages
  kOff,       // payloads always travel in messages
  kRequired,  // connecting fails unless the arena can be used
};

struct RemoteOptions {
  // Sent with every request; must match the server's when it has one.
  std::string token;
  // Reply time beyond what the request may block for. Default 10 s.
  std::chrono::milliseconds rpc_timeout{10000};
  // Limits on replies (and on requests this side will send). ConnectTransferQueue
  // raises them to the server's if those are larger.
  uint64_t max_message_bytes = (uint64_t{1} << 30) + (uint64_t{1} << 20);
  uint32_t max_batch_rows = 65536;
  uint64_t max_tensor_bytes = uint64_t{1} << 30;
  // Idle sockets kept for reuse; more are opened when more calls run at once.
  uint32_t max_idle_sockets = 8;
  // Same-host shared-memory data plane (see above). Only ConnectTransferQueue
  // uses it (it learns the arena from the server).
  ShmMode shm = ShmMode::kAuto;
  // With the arena in use and a server that offers rings: requests and
  // replies go through up to this many shared-memory rings (one per call in
  // flight) instead of the socket. 0: always the socket.
  uint32_t shm_rings = 8;
  // How long a call busy-waits for its reply on a ring before sleeping.
  std::chrono::microseconds shm_ring_spin{20};
  // With a server that takes direct connections (ServerOptions::
  // direct_connections): calls not on a ring go through up to this many
  // plain TCP connections (one per call in flight) instead of ZeroMQ.
  // 0: always ZeroMQ.
  uint32_t direct_connections = 8;
};

// Payload bytes above which a put with the arena copies into it directly
// (three messages) instead of sending the bytes in one message.
inline constexpr uint64_t kFusedPutMaxBytes = 64 << 10;

// A connected queue: the server's controller and each of its storage units.
struct RemoteQueue {
  std::string endpoint;
  std::shared_ptr<Controller> controller;
  std::vector<std::shared_ptr<StorageUnit>> storage;
  bool token_required = false;
  // The arena payloads go through, empty if they travel in messages.
  std::string shm_segment;
  // Puts and takes in one round trip each (TransferQueueClient::Take).
  std::shared_ptr<FusedCalls> fused;

  TransferQueueClient client() const { return TransferQueueClient(controller, storage, fused); }
};

// Asks the server for its layout (ServerInfo) and builds the remote parts,
// attaching to its shared-memory arena as options.shm says. Errors:
// InvalidArgument (bad endpoint or options), Unavailable (no reply within
// rpc_timeout), FailedPrecondition (wrong or missing token; kRequired and the
// arena is missing or cannot be opened, with the reason), Unimplemented
// (another protocol version).
Result<RemoteQueue> ConnectTransferQueue(const std::string& endpoint, RemoteOptions options = {});

// The parts alone (no round trip; the first call reports a dead server).
// InvalidArgument for a bad endpoint or options.
Result<std::shared_ptr<Controller>> NewRemoteController(const std::string& endpoint, RemoteOptions options = {});
Result<std::shared_ptr<StorageUnit>> NewRemoteStorageUnit(const std::string& endpoint, uint32_t unit,
                                                          RemoteOptions options = {});

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_REMOTE_H_
