// A small TCP key-value store by which the hosts of a run find each other
// (the "rendezvous store" of docs/checkpoint_engine.md): the cross-host weight broadcast
// (broadcast.h) announces its publisher, members, generations and per-version
// headers here, and Gloo exchanges its pair addresses through it.
//
// Keys are 1..max_key_bytes printable ASCII characters (0x21..0x7e); values
// are opaque bytes. Operations:
//   Set     store a value; optionally *ephemeral* (deleted when the
//           connection that set it closes: a process that dies, SIGKILL
//           included, loses its ephemeral keys at once, which is how peers
//           learn it is gone) and/or *create-only* (AlreadyExists if the key
//           exists).
//   Get     read a value, optionally waiting (bounded) until the key exists.
//   Add     atomically add to a 64-bit counter (created as 0).
//   Delete  remove a key.
//
// Wire format: every request is a 24-byte little-endian header {u32 magic
// "SLRV", u16 protocol, u8 op, u8 flags, u32 key length, u32 value length,
// i64 argument (Get: wait in ms; Add: delta)} followed by the key and the
// value; every response is a 24-byte header {u32 magic, u16 protocol, u8
// status code, u8 0, u32 payload length, u32 0, i64 argument (Add: the new
// value)} followed by the value (OK Get) or an error message. One request at
// a time per connection. Lengths are checked against the server's limits
// before anything is buffered; a request that breaks the framing (magic,
// protocol, lengths) gets an error response and the connection is closed; a
// well-framed but invalid request (unknown op or flags, bad key characters,
// a full store) gets an error response and the connection stays usable.
// See docs/checkpoint_engine.md.
//
// Not an authenticated service: bind it to loopback (the default) or to a
// private network the hosts of one run share.
//
// Thread safety: RendezvousServer is thread-safe (all serving happens on its
// one owned thread). A RendezvousClient is thread-safe but serializes calls,
// so a Get that waits holds up the client's other calls: give each thread
// that waits its own client.
#ifndef SLUICE_CHECKPOINT_ENGINE_RENDEZVOUS_H_
#define SLUICE_CHECKPOINT_ENGINE_RENDEZVOUS_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::checkpoint_engine {

struct RendezvousServerOptions {
  // IPv4 address to listen on. Default loopback; "0.0.0.0" for every interface.
  std::string bind_address = "127.0.0.1";
  // 0 (default): any free port, reported by port().
  uint16_t port = 0;
  // Limits on what a client may send; requests beyond them are refused with
  // a message naming the limit.
  size_t max_key_bytes = 256;
  size_t max_value_bytes = size_t{1} << 20;  // 1 MiB
  size_t max_keys = 65536;
  size_t max_total_bytes = size_t{256} << 20;  // keys + values held
  size_t max_connections = 1024;
  // Longest wait a Get may ask for (longer requests are clamped).
  std::chrono::milliseconds max_wait{60000};
};

struct RendezvousServerStats {
  size_t keys = 0;
  size_t bytes = 0;                  // keys + values held
  size_t connections = 0;            // open now
  size_t waiting_gets = 0;           // Gets parked until their key appears
  uint64_t requests = 0;             // served, errors included
  uint64_t errors = 0;               // error responses sent
  uint64_t dropped_connections = 0;  // closed for a framing error
  uint64_t ephemeral_deleted = 0;    // keys removed because their connection closed
};

class RendezvousServer {
 public:
  // Binds, listens and starts serving. InvalidArgument for malformed options
  // (the field named); Unavailable if the socket cannot be bound (the
  // address and the OS error named).
  static Result<std::unique_ptr<RendezvousServer>> Start(RendezvousServerOptions options);
  // Stops serving and closes every connection (their ephemeral keys go too).
  ~RendezvousServer();
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  uint16_t port() const;
  // "<bind_address>:<port>", what RendezvousClientOptions::address takes.
  std::string address() const;
  RendezvousServerStats stats() const;

  struct Impl;

 private:
  explicit RendezvousServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct RendezvousClientOptions {
  // "host:port" of a RendezvousServer (host: a name or an IP literal).
  std::string address;
  // Connect retries (the server may start later) up to this long.
  std::chrono::milliseconds connect_timeout{10000};
  // Longest a request may take on the wire, on top of a Get's own wait.
  std::chrono::milliseconds io_timeout{10000};
  // Largest value accepted in a response.
  size_t max_value_bytes = size_t{64} << 20;
};

enum class KeyLifetime : uint8_t {
  kPersistent,  // stays until deleted or the server stops
  kEphemeral,   // deleted when this client's connection closes
};

class RendezvousClient {
 public:
  // InvalidArgument for a malformed address; Unavailable if no server
  // accepted within connect_timeout.
  static Result<std::unique_ptr<RendezvousClient>> Connect(RendezvousClientOptions options);
  ~RendezvousClient();  // closes the connection: ephemeral keys of it vanish
  RendezvousClient(const RendezvousClient&) = delete;
  RendezvousClient& operator=(const RendezvousClient&) = delete;

  // Errors: AlreadyExists (create_only and the key exists); InvalidArgument
  // (bad key, value too large); ResourceExhausted (the server is full).
  Status Set(std::string_view key, std::string_view value, KeyLifetime lifetime = KeyLifetime::kPersistent,
             bool create_only = false);
  // The value of `key`. With wait > 0 blocks until the key exists, at most
  // `wait` (clamped by the server's max_wait): Timeout then. With wait == 0,
  // NotFound if the key does not exist.
  Result<std::string> Get(std::string_view key, std::chrono::milliseconds wait = std::chrono::milliseconds(0));
  // Adds `delta` to the counter `key` (created as 0) and returns the new
  // value. FailedPrecondition if the key holds something that is not a
  // counter.
  Result<int64_t> Add(std::string_view key, int64_t delta);
  // NotFound if the key does not exist.
  Status Delete(std::string_view key);

  // Every call above may also return Unavailable / Timeout (the connection
  // failed or stalled: the error is sticky, every later call returns it, and
  // the ephemeral keys of this client are gone) or FailedPrecondition (the
  // server speaks another protocol version).

  const std::string& address() const;

  struct Impl;

 private:
  explicit RendezvousClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_CHECKPOINT_ENGINE_RENDEZVOUS_H_
