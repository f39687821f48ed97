// TransferQueueServer: one in-process controller and N storage units served
// over ZeroMQ (a ROUTER socket on a tcp:// or ipc:// endpoint), speaking the
// wire format of docs/transfer_queue.md. Clients connect with
// ConnectTransferQueue (remote.h) and use the ordinary TransferQueueClient.
//
// Contract
//  * Binding. tcp://127.0.0.1:0 by default; port 0 picks a free port and
//    endpoint() reports the bound address. A non-loopback tcp bind (another
//    address, *, an interface name) is refused without a token. ipc://PATH
//    never takes a path over: a socket there that accepts a connection (a
//    live server) is AlreadyExists, as is a file that is not a socket; a
//    socket nobody listens on (a dead server's) is removed and bound anew.
//    Stop removes the socket file it bound, if it is still that file.
//  * Authentication. With a token set, every request must carry it (compared
//    in constant time); others get FailedPrecondition and change nothing.
//    The token is a shared secret sent in clear: it keeps stray and
//    misconfigured clients out, it is not encryption (see the docs).
//  * Concurrency. One I/O thread owns the socket. It answers the smallest
//    calls itself (under 64 KiB, never waiting, no payload copies: Ack,
//    Release, CommitWrite, AbortWrite, ShmStorageRead, Stats, StorageStats,
//    Describe, ServerInfo), saving two thread hops each; other requests run
//    on a fixed pool of `workers` threads, except those that may block
//    (GetMeta, CreateRows, BeginWrite, storage writes), which run on their
//    own threads (up to max_blocking_calls; beyond that ResourceExhausted at
//    once), so a call waiting for rows or capacity never delays anyone else.
//  * Bad input. Malformed, truncated, oversized or unauthenticated messages
//    get an error reply (or, over max_message_bytes, ZeroMQ drops the
//    connection before allocating); nothing is applied and the server keeps
//    serving everyone else.
//  * Dead clients. Leases of a dead consumer expire as usual. A write left
//    open longer than open_write_timeout (its producer died between
//    BeginWrite and CommitWrite) is discarded and aborted by the server, so
//    its reservation is not leaked. Rows freed by Ack/Clear are reclaimed by
//    the server itself (it holds both planes): replies carry no ticket.
//  * Direct connections (direct_connections > 0, an IPv4 tcp:// bind). A
//    second listener on the bind's address, a free port, takes plain TCP
//    connections: each gets a thread that reads length-prefixed wire
//    messages, puts them through the same door (token included) and runs
//    them itself. A connection whose first message does not come within 10 s,
//    or is refused at the door, is closed; a frame over max_message_bytes
//    closes it before anything is allocated.
//  * Same-host rings (shm_bytes > 0, shm_rings > 0). A client that attached
//    to the arena asks for a ring per connection (OpenRing over the socket)
//    and then sends its requests through it: each ring has its own server
//    thread, which runs every call itself (blocking ones included), so a
//    call costs no socket and no thread hop. The ring is checked like the
//    socket (shm_ring.h): garbage or a client dying mid-request ends that
//    ring only. The ring's thread ends when its client closes it or dies.
//  * Shared memory (shm_bytes > 0). Every cell lives in one arena segment,
//    /sluice.tq.<pid>-<start>.<n>, created at start (sweeping arenas of dead
//    servers) and unlinked at Stop; clients hold no segments of their own,
//    so a killed client leaks none. Its reader slot and pins are ignored once
//    it is dead.
//  * Storage writes are accepted only for the cells a BeginWrite declared
//    (same dtype, shape, nbytes) on the unit that owns the row, and remote
//    Discard drops only cells of open writes, so bytes in storage never
//    exceed the controller's accounting; remote FreeRows is refused.
//  * Storage units on other hosts (storage_hosts, storage_only). A storage
//    server holds some units of a hub whose controller's server is
//    elsewhere; clients read and write those units' bytes there directly
//    (ServerInfo.unit_hosts). The controller's server declares each write
//    to the storage servers holding its rows before it answers BeginWrite,
//    so a storage server checks storage writes as above; it frees the rows
//    the controller frees, discards aborted writes' cells and stores what
//    the controller's server's own process writes (storage() used in
//    process), on the controller's server's word only (requests carrying
//    peer_token, which clients never have). A write that touches other
//    hosts is not put or taken in one round trip (PutRows, TakeBatch are
//    refused): clients do those in steps. A storage server that dies takes
//    its rows' bytes with it: reads and writes of them fail (Unavailable).
//
// Thread safety: endpoint(), counters(), controller() and storage() may be
// called from any thread; Stop() and the destructor by the owner.
#ifndef SLUICE_TRANSFER_QUEUE_SERVER_H_
#define SLUICE_TRANSFER_QUEUE_SERVER_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/controller.h"
#include "sluice/transfer_queue/storage.h"

namespace sluice::transfer_queue {

// Storage units [first_unit, first_unit + count) of a hub, served by the
// storage server at `endpoint`.
struct StorageHost {
  uint32_t first_unit = 0;
  uint32_t count = 0;
  std::string endpoint;
};

struct ServerOptions {
  // tcp://HOST:PORT or ipc://PATH. HOST is a numeric address or interface
  // name (ZeroMQ does not resolve names for bind).
  std::string bind = "tcp://127.0.0.1:0";
  // Empty: no authentication (refused for non-loopback binds). At most 256
  // bytes.
  std::string token;
  ControllerOptions controller;
  uint32_t storage_units = 2;  // 1..1024
  // Threads for requests that do not block (and are not answered on the I/O thread).
  uint32_t workers = 4;
  // Requests that may block (GetMeta, CreateRows, BeginWrite) in flight at once.
  uint32_t max_blocking_calls = 256;
  // Quick requests queued behind busy workers before ResourceExhausted.
  uint32_t max_queued_requests = 1024;
  // Largest message accepted (header + body); bigger ones are dropped by
  // ZeroMQ. Must exceed controller.max_tensor_bytes by at least 64 KiB.
  uint64_t max_message_bytes = (uint64_t{1} << 30) + (uint64_t{1} << 20);
  // A write open longer than this without activity is aborted. 0: never.
  std::chrono::milliseconds open_write_timeout{60000};
  // Same-host shared-memory data plane: the size of one arena segment
  // holding the bytes of every stored cell (0: none; payloads then travel in
  // messages). Clients on this host that use it (RemoteOptions::shm) write a
  // payload straight into the arena and read it in place; others are served
  // from it through messages. Give it room above controller.capacity_bytes:
  // views a reader still holds keep freed cells pinned (see shm_arena.h).
  uint64_t shm_bytes = 0;
  // Client processes attached to the arena at once.
  uint32_t shm_max_readers = 256;
  // A write that finds the arena full waits this long for room, then fails
  // with ResourceExhausted. Keep it under the clients' rpc_timeout.
  std::chrono::milliseconds shm_alloc_timeout{5000};
  // Same-host request path (with an arena only): client connections served
  // through a shared-memory ring each, by a thread of their own, instead of
  // the socket (0: none; clients then use the socket). Beyond this many,
  // clients fall back to the socket.
  uint32_t shm_rings = 64;
  // Bytes per direction of one ring (4 KiB..1 GiB, a multiple of 64); larger
  // messages cross it in chunks. Two of these per ring are reserved in /dev/shm.
  uint64_t shm_ring_bytes = 256 << 10;
  // How long a ring thread busy-waits for the next request before sleeping
  // (latency against CPU: a sleeping thread takes a futex wake-up, a few us).
  std::chrono::microseconds shm_ring_spin{50};
  // Direct connections (tcp:// binds on an IPv4 address): clients served over
  // a plain TCP connection each, by a thread of their own, with
  // length-prefixed wire messages, instead of through ZeroMQ's queues and
  // threads. The listener takes a free port on the bind's address
  // (ServerInfo.direct_port). Beyond this many, clients use ZeroMQ. 0: none.
  uint32_t direct_connections = 64;

  // ---- Storage units on other hosts (docs/transfer_queue.md).
  // A controller's server: which of its `storage_units` storage servers
  // elsewhere serve (each a range at an endpoint; the ranges may not
  // overlap); it serves the rest itself. Needs peer_token.
  std::vector<StorageHost> storage_hosts;
  // A storage server: serves units [first_unit, first_unit + unit_count) of
  // a hub of `storage_units` units, refuses controller requests. Needs
  // peer_token; has no arena (shm_bytes 0).
  bool storage_only = false;
  uint32_t first_unit = 0;
  uint32_t unit_count = 0;
  // The secret a controller's server and its storage servers share (never
  // given to clients; at most 256 bytes): what the controller's server asks
  // of a storage server (declaring writes, freeing rows, discarding cells)
  // carries it in place of `token`.
  std::string peer_token;
  // How long a controller's server waits at Start for its storage servers to answer.
  std::chrono::milliseconds storage_connect_timeout{30000};
};

// Requests seen by the server since it started.
struct ServerCounters {
  uint64_t requests = 0;         // well-formed, authenticated requests run
  uint64_t error_replies = 0;    // replies carrying an error (any cause)
  uint64_t malformed = 0;        // refused before running: bad framing, header or body
  uint64_t unauthenticated = 0;  // refused: missing or wrong token
  uint64_t busy = 0;             // refused: worker queue or blocking calls full
  uint64_t writes_expired = 0;   // open writes aborted by the server
  uint64_t rings_open = 0;       // same-host shared-memory rings served now
  uint64_t direct_open = 0;      // direct TCP connections served now
  uint64_t ring_requests = 0;    // requests that came through a shared-memory ring (part of the above)
  uint64_t direct_requests = 0;  // requests that came through a direct TCP connection
  // Since the I/O thread last went round its loop (it does at least every
  // 200 ms while it serves; it has no turn yet just after Start: 0).
  int64_t io_loop_age_ms = 0;
};

class TransferQueueServer {
 public:
  // Binds and starts serving. Errors: InvalidArgument (bad options, a bad
  // endpoint, a non-loopback bind without a token), AlreadyExists (an
  // ipc:// path where a server is listening, or that is not a socket),
  // Unavailable (the bind failed, e.g. the address is in use).
  static Result<std::unique_ptr<TransferQueueServer>> Start(ServerOptions options);
  ~TransferQueueServer();  // Stop()
  TransferQueueServer(const TransferQueueServer&) = delete;
  TransferQueueServer& operator=(const TransferQueueServer&) = delete;

  // The bound endpoint, e.g. "tcp://127.0.0.1:40123".
  const std::string& endpoint() const;
  // Closes the controller (blocked calls return Aborted), stops the threads
  // and closes the socket (removing an ipc:// socket file). Idempotent.
  void Stop();

  ServerCounters counters() const;
  // The served objects, for in-process inspection (tests, a co-located role).
  const std::shared_ptr<Controller>& controller() const;
  const std::vector<std::shared_ptr<StorageUnit>>& storage() const;

  class Impl;

 private:
  explicit TransferQueueServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// True for binds reachable only from this host: ipc://, and tcp:// on
// 127.0.0.0/8, ::1 or the "lo" interface.
bool IsLoopbackEndpoint(const std::string& endpoint);

}  // namespace sluice::transfer_queue

#endif  // SLUICE_TRANSFER_QUEUE_SERVER_H_
