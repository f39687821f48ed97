// The TransferQueue server's lifecycle, I/O thread and front door. Requests
// are checked here in the order cheapest first (framing, header, target,
// token) before any work is queued; see server_dispatch.cc for the rest.
#include "sluice/transfer_queue/server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "net/rpc_channel.h"
#include "net/server_impl.h"
#include "sluice/common/logging.h"

namespace sluice::transfer_queue {
namespace {

using Steady = std::chrono::steady_clock;

void FreeMessage(void* data, void* /*hint*/) { delete[] static_cast<std::byte*>(data); }

// Constant time in the length of `expected`, whatever `got` is.
bool TokensEqual(std::string_view expected, std::string_view got) {
  volatile uint8_t diff = expected.size() == got.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    const char g = i < got.size() ? got[i] : '\0';
    diff = static_cast<uint8_t>(diff | static_cast<uint8_t>(expected[i] ^ g));
  }
  return diff == 0;
}

// Requests that may wait inside the controller (rows, capacity).
bool MayBlock(wire::MessageType type) {
  // Storage writes may wait for room in the shared-memory arena.
  return type == wire::MessageType::kGetMeta || type == wire::MessageType::kCreateRows ||
         type == wire::MessageType::kBeginWrite || type == wire::MessageType::kStorageWrite ||
         type == wire::MessageType::kShmStorageWrite || type == wire::MessageType::kPutRows ||
         type == wire::MessageType::kTakeBatch;
}

// Requests answered on the I/O thread itself, without the hop to a worker
// and back: calls that never wait and do little work (no payload copies,
// no bulk frees), in small messages. ClearPartition, KvClear, reads and
// writes of payloads over the socket go to the workers.
constexpr size_t kInlineMaxBytes = 64 << 10;
bool ServedInline(wire::MessageType type) {
  switch (type) {
    case wire::MessageType::kServerInfo:
    case wire::MessageType::kDescribe:
    case wire::MessageType::kStats:
    case wire::MessageType::kStorageStats:
    case wire::MessageType::kCommitWrite:
    case wire::MessageType::kAbortWrite:
    case wire::MessageType::kAck:
    case wire::MessageType::kRelease:
    case wire::MessageType::kRenew:
    case wire::MessageType::kShmStorageRead:
      return true;
    default:
      return false;
  }
}

std::string HostOf(const std::string& endpoint) {
  const std::string rest = endpoint.substr(6);
  const size_t colon = rest.rfind(':');
  std::string host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

Status ValidateOptions(const ServerOptions& o) {
  auto bad = [](const std::string& what) { return Status::InvalidArgument("ServerOptions." + what); };
  if (Status endpoint = internal::ValidateEndpoint(o.bind); !endpoint.ok()) return bad("bind: " + endpoint.message());
  if (o.token.size() > wire::kMaxTokenBytes) {
    return bad("token has " + std::to_string(o.token.size()) + " bytes, at most " +
               std::to_string(wire::kMaxTokenBytes) + " allowed");
  }
  if (o.token.empty() && !IsLoopbackEndpoint(o.bind)) {
    return Status::InvalidArgument("refusing to bind " + o.bind +
                                   " without a token: a non-loopback endpoint is reachable from other hosts. Set a "
                                   "token (sluice_queue_server --token-file) or bind 127.0.0.1");
  }
  if (o.storage_units == 0 || o.storage_units > wire::kMaxStorageUnits) {
    return bad("storage_units is " + std::to_string(o.storage_units) + ", must be in 1.." +
               std::to_string(wire::kMaxStorageUnits));
  }
  if (o.workers == 0 || o.workers > 256) return bad("workers is " + std::to_string(o.workers) + ", must be in 1..256");
  if (o.max_blocking_calls == 0) return bad("max_blocking_calls must be > 0");
  if (o.max_message_bytes > uint64_t{INT64_MAX} ||
      o.max_message_bytes < o.controller.max_tensor_bytes + (uint64_t{64} << 10)) {
    return bad("max_message_bytes is " + std::to_string(o.max_message_bytes) +
               ", must be at least controller.max_tensor_bytes (" + std::to_string(o.controller.max_tensor_bytes) +
               ") + 64 KiB so a tensor fits in a message");
  }
  if (o.open_write_timeout.count() < 0) return bad("open_write_timeout is negative");
  if (o.shm_bytes > 0 && (o.shm_max_readers == 0 || o.shm_max_readers > 65536)) {
    return bad("shm_max_readers is " + std::to_string(o.shm_max_readers) + ", must be in 1..65536");
  }
  if (o.shm_alloc_timeout.count() < 0) return bad("shm_alloc_timeout is negative");
  if (o.shm_rings > 4096) return bad("shm_rings is " + std::to_string(o.shm_rings) + ", must be at most 4096");
  if (o.shm_rings > 0 && (o.shm_ring_bytes < internal::kRingMinCapacity ||
                          o.shm_ring_bytes > internal::kRingMaxCapacity || o.shm_ring_bytes % 64 != 0)) {
    return bad("shm_ring_bytes is " + std::to_string(o.shm_ring_bytes) + ", must be a multiple of 64 in " +
               std::to_string(internal::kRingMinCapacity) + ".." + std::to_string(internal::kRingMaxCapacity));
  }
  if (o.direct_connections > 4096) {
    return bad("direct_connections is " + std::to_string(o.direct_connections) + ", must be at most 4096");
  }
  if (o.shm_ring_spin.count() < 0 || o.shm_ring_spin > std::chrono::seconds(1)) {
    return bad("shm_ring_spin must be in 0..1 s");
  }
  if (o.peer_token.size() > wire::kMaxTokenBytes) {
    return bad("peer_token has " + std::to_string(o.peer_token.size()) + " bytes, at most " +
               std::to_string(wire::kMaxTokenBytes) + " allowed");
  }
  if (!o.peer_token.empty() && o.peer_token == o.token) return bad("peer_token must differ from token");
  if (o.storage_only) {
    if (o.peer_token.empty()) return bad("storage_only needs a peer_token (shared with the controller's server)");
    if (!o.storage_hosts.empty()) return bad("storage_only: a storage server has no storage_hosts of its own");
    if (o.shm_bytes > 0) return bad("storage_only: a storage server has no shared-memory arena (shm_bytes 0)");
    if (o.open_write_timeout.count() == 0) {
      return bad("storage_only: open_write_timeout must be > 0 (how long a declared write is kept)");
    }
    if (o.unit_count == 0 || uint64_t{o.first_unit} + o.unit_count > o.storage_units) {
      return bad("storage_only: units " + std::to_string(o.first_unit) + "+" + std::to_string(o.unit_count) +
                 " are not a non-empty range of the hub's " + std::to_string(o.storage_units));
    }
  }
  if (!o.storage_hosts.empty()) {
    if (o.peer_token.empty()) return bad("storage_hosts need a peer_token (shared with the storage servers)");
    std::vector<wire::UnitHost> hosts;
    for (const StorageHost& h : o.storage_hosts) hosts.push_back({h.first_unit, h.count, h.endpoint});
    SLUICE_RETURN_IF_ERROR(internal::CheckUnitHosts(hosts, o.storage_units, "ServerOptions.storage_hosts"));
  }
  return Status::Ok();
}

// The file an ipc:// endpoint binds ("" for none: the abstract namespace
// "@name", or "*", a name ZeroMQ picks).
std::string IpcPathOf(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) != 0) return "";
  const std::string path = endpoint.substr(6);
  if (path.empty() || path == "*" || path.front() == '@') return "";
  return path;
}

// Makes `path` free for an ipc:// bind. ZeroMQ unlinks whatever is at the
// path before binding, which would silently take it over from a live server
// (leaving that one unreachable) or delete a file that is not a socket, so
// this looks first: nothing there, or a socket nobody listens on (a dead
// server's, connect() refused), is fine (the latter removed); a socket that
// accepts a connection (or whose backlog is full) is a live server.
Status ClaimIpcPath(const std::string& endpoint, const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::Unavailable(endpoint + ": cannot inspect " + path + ": " + std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return Status::AlreadyExists(endpoint + ": " + path + " exists and is not a socket; refusing to replace it");
  }
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    return Status::InvalidArgument(endpoint + ": the path has " + std::to_string(path.size()) + " bytes, at most " +
                                   std::to_string(sizeof(addr.sun_path) - 1) + " fit a Unix socket address");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  net::UniqueFd probe(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!probe.valid()) return Status::Unavailable(endpoint + ": socket: " + std::strerror(errno));
  int rc = -1;
  for (int attempt = 0; attempt < 100; ++attempt) {
    rc = ::connect(probe.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr));
    if (rc == 0 || errno != EINTR) break;
  }
  if (rc == 0 || errno == EAGAIN || errno == EINPROGRESS) {
    return Status::AlreadyExists(endpoint + ": another server is listening there");
  }
  if (errno != ECONNREFUSED) {
    return Status::Unavailable(endpoint + ": cannot tell whether a server is listening there (connect: " +
                               std::strerror(errno) + "); remove " + path + " if none is");
  }
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
    return Status::Unavailable(endpoint + ": cannot remove the stale socket " + path + ": " + std::strerror(errno));
  }
  SLUICE_LOG(INFO) << "TransferQueue server: removed the stale socket " << path << " (no server listened there)";
  return Status::Ok();
}

}  // namespace

bool IsLoopbackEndpoint(const std::string& endpoint) {
  if (endpoint.rfind("ipc://", 0) == 0) return true;
  if (endpoint.rfind("tcp://", 0) != 0) return false;
  const std::string host = HostOf(endpoint);
  if (host == "lo" || host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) {
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  }
  return false;  // "*", interface names, host names: assume reachable
}

// ------------------------------------------------------------ lifecycle

TransferQueueServer::Impl::Impl(ServerOptions options) : options_(std::move(options)), context_(1) {}

TransferQueueServer::Impl::~Impl() { Stop(); }

Status TransferQueueServer::Impl::Init() {
  SLUICE_RETURN_IF_ERROR(ValidateOptions(options_));
  clock_ = options_.controller.clock ? options_.controller.clock : std::make_shared<SteadyClock>();
  options_.controller.clock = clock_;
  const uint64_t max_tensor_bytes = options_.controller.max_tensor_bytes;
  limits_.max_message_bytes = options_.max_message_bytes;
  limits_.max_batch_rows = options_.controller.max_batch_rows;
  limits_.max_tensor_bytes = max_tensor_bytes;
  if (!options_.storage_only) {
    SLUICE_ASSIGN_OR_RETURN(controller_, NewInProcessController(options_.controller));
  }
  if (options_.shm_bytes > 0) {
    internal::ShmArena::Options arena;
    arena.data_bytes = options_.shm_bytes;
    arena.max_readers = options_.shm_max_readers;
    arena.alloc_timeout = options_.shm_alloc_timeout;
    Result<std::shared_ptr<internal::ShmArena>> created = internal::ShmArena::Create(arena);
    if (!created.ok()) return created.status().WithContext("creating the shared-memory arena (shm_bytes)");
    arena_ = std::move(*created);
  }
  // Units elsewhere (a controller's server): reached through their storage
  // servers, which must be up within the connect timeout.
  units_.resize(options_.storage_units);
  for (const StorageHost& h : options_.storage_hosts) {
    SLUICE_ASSIGN_OR_RETURN(
        std::unique_ptr<internal::StorageHostLink> link,
        internal::StorageHostLink::Connect({h.first_unit, h.count, h.endpoint}, options_.storage_units,
                                           options_.peer_token, options_.storage_connect_timeout));
    for (uint32_t i = 0; i < h.count; ++i) units_[h.first_unit + i] = link->units()[i];
    hosts_.push_back(std::move(link));
  }
  for (uint32_t u = 0; u < options_.storage_units; ++u) {
    const bool held =
        !options_.storage_only || (u >= options_.first_unit && u - options_.first_unit < options_.unit_count);
    if (!units_[u] && held) {
      units_[u] = NewInProcessStorageUnit(StorageUnitOptions{u, max_tensor_bytes, nullptr, arena_});
    }
  }
  open_writes_ = std::make_unique<internal::OpenWrites>(options_.open_write_timeout, options_.storage_units);

  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return Status::Unavailable(std::string("eventfd failed: ") + std::strerror(errno));
  try {
    router_ = std::make_unique<zmq::socket_t>(context_, zmq::socket_type::router);
    router_->set(zmq::sockopt::linger, 0);
    // ZeroMQ drops a bigger frame (and the connection) before allocating it.
    router_->set(zmq::sockopt::maxmsgsize, static_cast<int64_t>(options_.max_message_bytes));
    if (options_.bind.rfind("tcp://[", 0) == 0) router_->set(zmq::sockopt::ipv6, 1);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("cannot create the server's socket: " + std::string(e.what()));
  }
  const std::string ipc_path = IpcPathOf(options_.bind);
  if (!ipc_path.empty()) SLUICE_RETURN_IF_ERROR(ClaimIpcPath(options_.bind, ipc_path));
  try {
    router_->bind(options_.bind);
    endpoint_ = router_->get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return Status::Unavailable("cannot bind " + options_.bind + ": " + e.what());
  }
  if (struct stat st{}; !ipc_path.empty() && ::stat(ipc_path.c_str(), &st) == 0) {
    ipc_socket_ = IpcSocket{ipc_path, st.st_dev, st.st_ino};
  }

  quick_pool_ = std::make_unique<internal::WorkerPool>("tq-quick", options_.workers, options_.workers,
                                                       options_.max_queued_requests);
  // The door admits at most max_blocking_calls; the queue only absorbs a
  // thread that is between posting a reply and taking the next job.
  blocking_pool_ =
      std::make_unique<internal::WorkerPool>("tq-block", 0, options_.max_blocking_calls, options_.max_blocking_calls);
  SLUICE_RETURN_IF_ERROR(quick_pool_->Start());
  SLUICE_RETURN_IF_ERROR(blocking_pool_->Start());
  SLUICE_RETURN_IF_ERROR(StartDirect().WithContext("starting the direct TCP listener"));
  return io_thread_.Start([this](std::stop_token stop) { IoLoop(stop); });
}

void TransferQueueServer::Impl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  // Blocked GetMeta/producer calls return Aborted, so the pools drain fast.
  if (controller_) controller_->Close();
  if (blocking_pool_) blocking_pool_->Stop();
  if (quick_pool_) quick_pool_->Stop();
  StopRings();
  StopDirect();
  io_thread_.Stop();  // sends the replies still queued, then exits
  router_.reset();
  context_.close();
  // The socket file this server bound, unless someone has replaced it since.
  if (struct stat st{}; ipc_socket_ && ::stat(ipc_socket_->path.c_str(), &st) == 0 && st.st_dev == ipc_socket_->dev &&
                        st.st_ino == ipc_socket_->ino) {
    ::unlink(ipc_socket_->path.c_str());
  }
  ipc_socket_.reset();
  // Clients' mappings stay valid; no new client can attach.
  if (arena_) arena_->Unlink();
  if (wake_fd_ >= 0) close(wake_fd_);
  wake_fd_ = -1;
}

wire::ServerInfo TransferQueueServer::Impl::Info() const {
  wire::ServerInfo info;
  info.storage_units = static_cast<uint32_t>(units_.size());
  info.max_message_bytes = limits_.max_message_bytes;
  info.max_batch_rows = limits_.max_batch_rows;
  info.max_tensor_bytes = limits_.max_tensor_bytes;
  info.token_required = !options_.token.empty();
  if (arena_) {
    info.shm_segment = arena_->name();
    info.shm_data_bytes = arena_->data_bytes();
    info.shm_rings = options_.shm_rings;
  }
  info.direct_port = direct_port_;
  for (const auto& link : hosts_) info.unit_hosts.push_back(link->host());
  return info;
}

const internal::StorageHostLink* TransferQueueServer::Impl::ServedElsewhere(uint32_t u) const {
  for (const auto& link : hosts_) {
    if (link->Holds(u)) return link.get();
  }
  return nullptr;
}

// ------------------------------------------------------------ I/O thread

void TransferQueueServer::Impl::Wake() {
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0 && errno != EAGAIN) {
    SLUICE_LOG(ERROR) << "TransferQueue server: waking the I/O thread failed: " << std::strerror(errno);
  }
}

void TransferQueueServer::Impl::IoLoop(std::stop_token stop) {
  std::stop_callback wake_on_stop(stop, [this] { Wake(); });
  zmq::pollitem_t items[2] = {{static_cast<void*>(*router_), 0, ZMQ_POLLIN, 0}, {nullptr, wake_fd_, ZMQ_POLLIN, 0}};
  const auto expiry_period = std::clamp<std::chrono::milliseconds>(
      options_.open_write_timeout / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  Steady::time_point next_expiry = Steady::now() + expiry_period;
  while (!stop.stop_requested()) {
    counters_.io_turn_ns.store(Steady::now().time_since_epoch().count(), std::memory_order_relaxed);
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(200));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      SLUICE_LOG(ERROR) << "TransferQueue server: poll failed: " << e.what();
      break;
    }
    if (items[1].revents & ZMQ_POLLIN) {
      uint64_t ignored;
      (void)!read(wake_fd_, &ignored, sizeof(ignored));
    }
    FlushOutbox();
    if (items[0].revents & ZMQ_POLLIN) ReceiveBatch();
    if (options_.open_write_timeout.count() > 0 && Steady::now() >= next_expiry) {
      // With units elsewhere, discarding an expired write's cells is a call
      // to their server: a worker's, never this thread's to wait for.
      if (hosts_.empty()) {
        ExpireOpenWrites();
      } else if (!expiring_.exchange(true)) {
        if (!quick_pool_->TrySubmit([this] {
              ExpireOpenWrites();
              expiring_.store(false);
            })) {
          expiring_.store(false);
        }
      }
      next_expiry = Steady::now() + expiry_period;
    }
  }
  FlushOutbox();
}

void TransferQueueServer::Impl::ReceiveBatch() {
  // Bounded, so replies keep flowing under a flood of requests.
  for (int i = 0; i < 256; ++i) {
    zmq::message_t identity;
    if (!router_->recv(identity, zmq::recv_flags::dontwait)) return;
    if (!identity.more()) continue;  // ROUTER always adds a payload; defensive
    auto payload = std::make_shared<zmq::message_t>();
    // The parts of a multipart message arrive together.
    if (!router_->recv(*payload, zmq::recv_flags::dontwait)) continue;
    size_t frames = 1;
    for (bool more = payload->more(); more; ++frames) {
      zmq::message_t extra;
      if (!router_->recv(extra, zmq::recv_flags::dontwait)) break;
      more = extra.more();
    }
    HandleFrame(std::move(identity), std::move(payload), frames);
  }
}

wire::Message TransferQueueServer::Impl::Reject(std::span<const std::byte> bytes, const Status& status) {
  counters_.malformed.fetch_add(1);
  SLUICE_LOG(DEBUG) << "TransferQueue server: refused a message: " << status.ToString();
  // Echo the type and request id when the header got that far.
  wire::MessageType type = wire::MessageType::kServerInfo;
  uint64_t request_id = 0;
  if (bytes.size() >= wire::kHeaderBytes && wire::LoadU32(bytes.data()) == wire::kMagic) {
    const uint16_t raw = wire::LoadU16(bytes.data() + 6);
    if (wire::IsKnownMessageType(raw)) type = static_cast<wire::MessageType>(raw);
    request_id = wire::LoadU64(bytes.data() + 16);
  }
  counters_.error_replies.fetch_add(1);
  return wire::EncodeErrorReply(type, request_id, status);
}

std::optional<wire::Message> TransferQueueServer::Impl::Admit(std::span<const std::byte> bytes, size_t frames,
                                                              wire::Header* header, bool* peer) {
  if (frames != 1) {
    return Reject(bytes, Status::InvalidArgument("expected one frame per message, got " + std::to_string(frames)));
  }
  Result<wire::Header> decoded = wire::DecodeHeader(bytes, limits_);
  if (!decoded.ok()) return Reject(bytes, decoded.status());
  if (decoded->is_reply()) {
    return Reject(bytes, Status::InvalidArgument(wire::Describe(*decoded) + " sent to the server"));
  }
  if (wire::IsStorageMessage(decoded->type) && decoded->target >= units_.size()) {
    return Reject(
        bytes, Status::InvalidArgument(wire::Describe(*decoded) + ": storage unit " + std::to_string(decoded->target) +
                                       " does not exist (the server has " + std::to_string(units_.size()) + ")"));
  }
  if (wire::IsStorageMessage(decoded->type)) {
    if (const internal::StorageHostLink* elsewhere = ServedElsewhere(decoded->target)) {
      return Reject(bytes, Status::InvalidArgument(wire::Describe(*decoded) + ": storage unit " +
                                                   std::to_string(decoded->target) + " is served by " +
                                                   elsewhere->host().endpoint + ", not here"));
    }
    if (!units_[decoded->target]) {
      return Reject(bytes, Status::InvalidArgument(
                               wire::Describe(*decoded) + ": storage unit " + std::to_string(decoded->target) +
                               " is not on this storage server (it holds " + std::to_string(options_.first_unit) +
                               ".." + std::to_string(options_.first_unit + options_.unit_count - 1) + ")"));
    }
  }
  *peer = false;
  if (!options_.token.empty() || !options_.peer_token.empty()) {
    Result<std::string> token = wire::DecodeRequestToken(bytes, *decoded, limits_);
    if (!token.ok()) return Reject(bytes, token.status());
    *peer = !options_.peer_token.empty() && TokensEqual(options_.peer_token, *token);
    if (!*peer && !options_.token.empty() && !TokensEqual(options_.token, *token)) {
      counters_.unauthenticated.fetch_add(1);
      counters_.error_replies.fetch_add(1);
      return wire::EncodeErrorReply(
          decoded->type, decoded->request_id,
          Status::FailedPrecondition("authentication failed: this TransferQueue server requires a token and the "
                                     "request's token is " +
                                     std::string(token->empty() ? "missing" : "wrong")));
    }
  }
  *header = *decoded;
  return std::nullopt;
}

wire::Message TransferQueueServer::Impl::Answer(std::shared_ptr<const void> owner, std::span<const std::byte> bytes,
                                                bool* admitted) {
  wire::Header header;
  bool peer = false;
  if (std::optional<wire::Message> refused = Admit(bytes, 1, &header, &peer)) {
    *admitted = false;
    return std::move(*refused);
  }
  *admitted = true;
  return Execute(Job{zmq::message_t(), std::move(owner), bytes, header, peer});
}

void TransferQueueServer::Impl::HandleFrame(zmq::message_t identity, std::shared_ptr<zmq::message_t> payload,
                                            size_t frames) {
  const std::span<const std::byte> bytes(static_cast<const std::byte*>(payload->data()), payload->size());
  wire::Header header;
  bool peer = false;
  if (std::optional<wire::Message> refused = Admit(bytes, frames, &header, &peer)) {
    SendNow(identity, std::move(*refused));
    return;
  }
  // (Ack and AbortWrite free or discard cells: with units elsewhere that is
  // a call to their server, which this thread does not wait for.)
  const bool calls_elsewhere =
      !hosts_.empty() && (header.type == wire::MessageType::kAck || header.type == wire::MessageType::kAbortWrite);
  if (ServedInline(header.type) && bytes.size() <= kInlineMaxBytes && !calls_elsewhere) {
    Job job{std::move(identity), std::move(payload), bytes, header, peer};
    SendNow(job.identity, Execute(job));
    return;
  }
  const bool blocking = MayBlock(header.type);
  auto job = std::make_shared<Job>(Job{std::move(identity), std::move(payload), bytes, header, peer});
  // Blocking calls are counted here, and uncounted before the reply is
  // posted, so a client that sends its next call on receiving a reply always
  // finds the slot free again.
  if (blocking && blocking_in_flight_.fetch_add(1) >= options_.max_blocking_calls) {
    blocking_in_flight_.fetch_sub(1);
    return Busy(*job, std::to_string(options_.max_blocking_calls) + " blocking calls in progress (max_blocking_calls)");
  }
  internal::WorkerPool& pool = blocking ? *blocking_pool_ : *quick_pool_;
  const bool queued = pool.TrySubmit([this, job, blocking] {
    wire::Message reply = Execute(*job);
    if (blocking) blocking_in_flight_.fetch_sub(1);
    Post(std::move(job->identity), std::move(reply));
  });
  if (!queued) {
    if (blocking) blocking_in_flight_.fetch_sub(1);
    Busy(*job, std::to_string(options_.max_queued_requests) + " requests queued (max_queued_requests)");
  }
}

void TransferQueueServer::Impl::Busy(const Job& job, const std::string& why) {
  counters_.busy.fetch_add(1);
  counters_.error_replies.fetch_add(1);
  SendNow(job.identity,
          wire::EncodeErrorReply(job.header.type, job.header.request_id,
                                 Status::ResourceExhausted("TransferQueue server busy: " + why + "; retry later")));
}

void TransferQueueServer::Impl::SendNow(const zmq::message_t& identity, wire::Message reply) {
  try {
    zmq::message_t to(identity.data(), identity.size());
    const size_t size = reply.size;
    zmq::message_t body(reply.data.release(), size, &FreeMessage, nullptr);
    // ROUTER drops messages to peers that left; it never blocks here.
    if (!router_->send(to, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
    (void)router_->send(body, zmq::send_flags::dontwait);
  } catch (const zmq::error_t& e) {
    SLUICE_LOG(DEBUG) << "TransferQueue server: reply not sent: " << e.what();
  }
}

void TransferQueueServer::Impl::Post(zmq::message_t identity, wire::Message reply) {
  {
    MutexLock lock(&outbox_mu_);
    outbox_.emplace_back(std::move(identity), std::move(reply));
  }
  Wake();
}

void TransferQueueServer::Impl::FlushOutbox() {
  std::deque<std::pair<zmq::message_t, wire::Message>> ready;
  {
    MutexLock lock(&outbox_mu_);
    ready.swap(outbox_);
  }
  for (auto& [identity, reply] : ready) SendNow(identity, std::move(reply));
}

void TransferQueueServer::Impl::ExpireOpenWrites() {
  if (!controller_) {
    // A storage server forgets a declared write it has not heard of for a
    // while; what became of it is the controller's server's to say (it
    // discards an abandoned write's cells here itself).
    (void)open_writes_->Expire(Steady::now(), [](WriteId, const internal::WriteCells&) {});
    return;
  }
  const size_t expired = open_writes_->Expire(Steady::now(), [this](WriteId id, const internal::WriteCells& cells) {
    DiscardCells(cells);
    Status aborted = controller_->AbortWrite(AbortWriteRequest{id});
    SLUICE_LOG(WARNING) << "TransferQueue server: aborted write " << id << " (" << cells.rows.size()
                        << " rows), left open longer than open_write_timeout = " << options_.open_write_timeout.count()
                        << " ms (its producer died?)" << (aborted.ok() ? "" : ": " + aborted.ToString());
  });
  counters_.writes_expired.fetch_add(expired);
}

// ------------------------------------------------------------ public

TransferQueueServer::TransferQueueServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferQueueServer::~TransferQueueServer() { Stop(); }

Result<std::unique_ptr<TransferQueueServer>> TransferQueueServer::Start(ServerOptions options) {
  auto impl = std::make_unique<Impl>(std::move(options));
  Status started = impl->Init();
  if (!started.ok()) {
    impl->Stop();
    return started;
  }
  return std::unique_ptr<TransferQueueServer>(new TransferQueueServer(std::move(impl)));
}

ServerCounters TransferQueueServer::Impl::counters() const {
  const Counters& c = counters_;
  ServerCounters out{c.requests.load(),        c.error_replies.load(), c.malformed.load(),
                     c.unauthenticated.load(), c.busy.load(),          c.writes_expired.load()};
  out.ring_requests = c.ring_requests.load();
  out.direct_requests = c.direct_requests.load();
  if (const int64_t turn = c.io_turn_ns.load(std::memory_order_relaxed); turn > 0) {
    out.io_loop_age_ms = std::max<int64_t>(0, (Steady::now().time_since_epoch().count() - turn) / 1000000);
  }
  {
    MutexLock lock(&rings_mu_);
    for (const auto& ring : rings_) out.rings_open += ring->done.load() ? 0 : 1;
  }
  MutexLock lock(&direct_mu_);
  for (const auto& c : direct_) out.direct_open += c->done.load() ? 0 : 1;
  return out;
}

const std::string& TransferQueueServer::endpoint() const { return impl_->endpoint(); }
void TransferQueueServer::Stop() { impl_->Stop(); }
ServerCounters TransferQueueServer::counters() const { return impl_->counters(); }
const std::shared_ptr<Controller>& TransferQueueServer::controller() const { return impl_->controller(); }
const std::vector<std::shared_ptr<StorageUnit>>& TransferQueueServer::storage() const { return impl_->storage(); }

}  // namespace sluice::transfer_queue
