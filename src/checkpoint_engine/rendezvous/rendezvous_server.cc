// RendezvousServer: one owned thread runs a poll loop over the listening
// socket, an eventfd (stop) and every connection. Each connection has at
// most one request in progress: the loop reads exactly one frame (the header,
// then exactly the lengths it announced, already checked against the
// limits), answers it, and reads the next only once the answer is flushed.
// So a connection buffers at most one frame and one answer, and a Get that
// waits parks its connection until the key is set or the wait ends.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "core/socket_util.h"
#include "rendezvous/rendezvous_wire.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {

using internal::UniqueFd;
namespace wire = rendezvous;
using Clock = std::chrono::steady_clock;

namespace {

struct Connection {
  uint64_t id = 0;
  UniqueFd fd;
  std::vector<std::byte> in;  // the frame being read
  size_t in_len = 0;
  std::string out;  // the answer being written
  size_t out_pos = 0;
  bool close_after_flush = false;
  bool parked = false;
  std::string parked_key;
  Clock::time_point parked_deadline;
  std::set<std::string> owned;  // ephemeral keys set by this connection
};

struct Entry {
  std::string value;
  uint64_t owner = 0;  // connection id of an ephemeral key; 0 when persistent
};

}  // namespace

struct RendezvousServer::Impl {
  RendezvousServerOptions options;
  UniqueFd listen_fd;
  UniqueFd wake_fd;
  uint16_t port = 0;
  BackgroundThread thread{"sl-rendezvous"};

  mutable Mutex stats_mu;
  RendezvousServerStats stats SLUICE_GUARDED_BY(stats_mu);

  // Everything below is touched by the serving thread only.
  std::map<uint64_t, std::unique_ptr<Connection>> conns;
  uint64_t next_id = 1;
  std::unordered_map<std::string, Entry> kv;
  size_t bytes = 0;
  std::multimap<std::string, uint64_t> waiters;  // key -> parked connection
  uint64_t requests = 0, errors = 0, dropped = 0, ephemeral_deleted = 0;

  void Serve(std::stop_token stop);
  void Accept();
  void OnReadable(Connection& c);
  void OnWritable(Connection& c);
  void Handle(Connection& c);
  void Respond(Connection& c, const Status& status, std::string_view value = {}, int64_t arg = 0, bool closing = false);
  void Unpark(Connection& c);
  void WakeWaiters(const std::string& key);
  void Close(uint64_t id);
  void Erase(std::unordered_map<std::string, Entry>::iterator it);
  void PublishStats();
};

void RendezvousServer::Impl::Respond(Connection& c, const Status& status, std::string_view value, int64_t arg,
                                     bool closing) {
  ++requests;
  wire::ResponseHeader h;
  h.code = static_cast<uint8_t>(status.code());
  h.flags = closing ? wire::kFlagClosing : 0;
  h.arg = arg;
  std::string_view payload = status.ok() ? value : std::string_view(status.message());
  if (!status.ok()) ++errors;
  h.payload_len = static_cast<uint32_t>(payload.size());
  auto header = wire::Encode(h);
  c.out.assign(reinterpret_cast<const char*>(header.data()), header.size());
  c.out.append(payload);
  c.out_pos = 0;
}

void RendezvousServer::Impl::Erase(std::unordered_map<std::string, Entry>::iterator it) {
  if (it->second.owner != 0) {
    if (auto owner = conns.find(it->second.owner); owner != conns.end()) owner->second->owned.erase(it->first);
  }
  bytes -= it->first.size() + it->second.value.size();
  kv.erase(it);
}

void RendezvousServer::Impl::Unpark(Connection& c) {
  if (!c.parked) return;
  auto [lo, hi] = waiters.equal_range(c.parked_key);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == c.id) {
      waiters.erase(it);
      break;
    }
  }
  c.parked = false;
  c.parked_key.clear();
}

void RendezvousServer::Impl::WakeWaiters(const std::string& key) {
  auto [lo, hi] = waiters.equal_range(key);
  std::vector<uint64_t> woken;
  for (auto it = lo; it != hi; ++it) woken.push_back(it->second);
  waiters.erase(lo, hi);
  const std::string& value = kv.at(key).value;
  for (uint64_t id : woken) {
    Connection& c = *conns.at(id);
    c.parked = false;
    c.parked_key.clear();
    Respond(c, Status::Ok(), value);
  }
}

void RendezvousServer::Impl::Close(uint64_t id) {
  auto it = conns.find(id);
  if (it == conns.end()) return;
  Connection& c = *it->second;
  Unpark(c);
  // Ephemeral keys die with the connection that set them.
  for (const std::string& key : std::set<std::string>(c.owned)) {
    auto e = kv.find(key);
    if (e != kv.end() && e->second.owner == id) {
      Erase(e);
      ++ephemeral_deleted;
    }
  }
  conns.erase(it);
}

void RendezvousServer::Impl::Handle(Connection& c) {
  const wire::RequestHeader h = wire::DecodeRequest(c.in.data());
  const std::string key(reinterpret_cast<const char*>(c.in.data()) + wire::kHeaderBytes, h.key_len);
  const std::string_view value(reinterpret_cast<const char*>(c.in.data()) + wire::kHeaderBytes + h.key_len,
                               h.value_len);
  c.in_len = 0;
  if (Status bad = wire::CheckRequest(h, key); !bad.ok()) return Respond(c, bad);
  const std::string quoted = "'" + key + "'";
  switch (static_cast<wire::Op>(h.op)) {
    case wire::Op::kSet: {
      auto it = kv.find(key);
      if (it != kv.end() && (h.flags & wire::kFlagCreateOnly) != 0) {
        return Respond(c, Status::AlreadyExists("key " + quoted + " exists (create-only Set)"));
      }
      const size_t old_bytes = it == kv.end() ? 0 : key.size() + it->second.value.size();
      if (it == kv.end() && kv.size() >= options.max_keys) {
        return Respond(c, Status::ResourceExhausted("the store holds max_keys=" + std::to_string(options.max_keys) +
                                                    " keys; delete some first"));
      }
      if (bytes - old_bytes + key.size() + value.size() > options.max_total_bytes) {
        return Respond(c, Status::ResourceExhausted("the store would exceed max_total_bytes=" +
                                                    std::to_string(options.max_total_bytes)));
      }
      if (it != kv.end()) Erase(it);
      Entry e;
      e.value.assign(value);
      if ((h.flags & wire::kFlagEphemeral) != 0) {
        e.owner = c.id;
        c.owned.insert(key);
      }
      bytes += key.size() + e.value.size();
      kv.emplace(key, std::move(e));
      Respond(c, Status::Ok());
      WakeWaiters(key);
      return;
    }
    case wire::Op::kGet: {
      auto it = kv.find(key);
      if (it != kv.end()) return Respond(c, Status::Ok(), it->second.value);
      if (h.arg == 0) return Respond(c, Status::NotFound("no key " + quoted));
      c.parked = true;
      c.parked_key = key;
      c.parked_deadline = Clock::now() + std::min(std::chrono::milliseconds(h.arg), options.max_wait);
      waiters.emplace(key, c.id);
      return;
    }
    case wire::Op::kAdd: {
      auto it = kv.find(key);
      int64_t current = 0;
      if (it != kv.end()) {
        if (it->second.value.size() != sizeof(int64_t)) {
          return Respond(
              c, Status::FailedPrecondition("key " + quoted + " holds " + std::to_string(it->second.value.size()) +
                                            " bytes, not an 8-byte counter"));
        }
        current = internal::LoadLe<int64_t>(reinterpret_cast<const std::byte*>(it->second.value.data()));
      } else {
        if (kv.size() >= options.max_keys || bytes + key.size() + 8 > options.max_total_bytes) {
          return Respond(c, Status::ResourceExhausted("the store is full (max_keys / max_total_bytes)"));
        }
        it = kv.emplace(key, Entry{std::string(8, '\0'), 0}).first;
        bytes += key.size() + 8;
      }
      int64_t next;
      if (__builtin_add_overflow(current, h.arg, &next)) {
        return Respond(c, Status::OutOfRange("counter " + quoted + " would overflow"));
      }
      internal::StoreLe<int64_t>(reinterpret_cast<std::byte*>(it->second.value.data()), next);
      Respond(c, Status::Ok(), {}, next);
      WakeWaiters(key);
      return;
    }
    case wire::Op::kDelete: {
      auto it = kv.find(key);
      if (it == kv.end()) return Respond(c, Status::NotFound("no key " + quoted));
      Erase(it);
      return Respond(c, Status::Ok());
    }
  }
  Respond(c, Status::Internal("unknown op " + std::to_string(h.op) + " passed CheckRequest"));
}

void RendezvousServer::Impl::OnReadable(Connection& c) {
  // Read exactly what the current frame still lacks: the header, then the
  // lengths it announced (validated before the buffer grows).
  size_t need = wire::kHeaderBytes;
  if (c.in_len >= wire::kHeaderBytes) {
    const wire::RequestHeader h = wire::DecodeRequest(c.in.data());
    need = wire::kHeaderBytes + h.key_len + h.value_len;
  }
  if (c.in.size() < need) c.in.resize(need);
  const ssize_t r = ::recv(c.fd.get(), c.in.data() + c.in_len, need - c.in_len, MSG_DONTWAIT);
  if (r == 0) {
    Close(c.id);
    return;
  }
  if (r < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) Close(c.id);
    return;
  }
  c.in_len += static_cast<size_t>(r);
  if (c.in_len == wire::kHeaderBytes) {
    const wire::RequestHeader h = wire::DecodeRequest(c.in.data());
    const Status bad = wire::CheckRequestHeader(h, options.max_key_bytes, options.max_value_bytes);
    if (!bad.ok()) {
      // The framing cannot be trusted any more: answer, then hang up.
      Respond(c, bad, {}, 0, /*closing=*/true);
      c.close_after_flush = true;
      c.in_len = 0;
      ++dropped;
      return;
    }
  }
  if (c.in_len >= wire::kHeaderBytes) {
    const wire::RequestHeader h = wire::DecodeRequest(c.in.data());
    if (c.in_len == wire::kHeaderBytes + h.key_len + h.value_len) Handle(c);
  }
}

void RendezvousServer::Impl::OnWritable(Connection& c) {
  const ssize_t w = ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w < 0) {
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) Close(c.id);
    return;
  }
  c.out_pos += static_cast<size_t>(w);
  if (c.out_pos == c.out.size()) {
    c.out.clear();
    c.out_pos = 0;
    if (c.close_after_flush) Close(c.id);
  }
}

void RendezvousServer::Impl::Accept() {
  while (true) {
    const int fd = ::accept4(listen_fd.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;  // EAGAIN (drained) or a transient error: poll again
    UniqueFd owned(fd);
    if (conns.size() >= options.max_connections) {
      ++dropped;
      continue;  // refused by closing
    }
    int on = 1;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
    // A peer host that vanishes without closing is noticed within ~30 s,
    // and its ephemeral keys go.
    (void)::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
    int idle = 10, interval = 5, count = 4;
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof(interval));
    (void)::setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof(count));
    auto c = std::make_unique<Connection>();
    c->id = next_id++;
    c->fd = std::move(owned);
    conns.emplace(c->id, std::move(c));
  }
}

void RendezvousServer::Impl::PublishStats() {
  size_t parked = waiters.size();
  MutexLock lock(&stats_mu);
  stats.keys = kv.size();
  stats.bytes = bytes;
  stats.connections = conns.size();
  stats.waiting_gets = parked;
  stats.requests = requests;
  stats.errors = errors;
  stats.dropped_connections = dropped;
  stats.ephemeral_deleted = ephemeral_deleted;
}

void RendezvousServer::Impl::Serve(std::stop_token stop) {
  std::stop_callback wake(stop, [this] {
    const uint64_t one = 1;
    (void)!::write(wake_fd.get(), &one, sizeof(one));
  });
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;
  while (!stop.stop_requested()) {
    // Gets whose wait ran out.
    const auto now = Clock::now();
    auto next_deadline = now + std::chrono::seconds(1);
    for (auto& [id, c] : conns) {
      if (!c->parked) continue;
      if (c->parked_deadline <= now) {
        const std::string key = c->parked_key;
        Unpark(*c);
        Respond(*c, Status::Timeout("key '" + key + "' did not appear within the wait"));
      } else {
        next_deadline = std::min(next_deadline, c->parked_deadline);
      }
    }
    PublishStats();

    fds.clear();
    ids.clear();
    fds.push_back({wake_fd.get(), POLLIN, 0});
    fds.push_back({listen_fd.get(), POLLIN, 0});
    for (auto& [id, c] : conns) {
      short events = POLLRDHUP;
      if (!c->out.empty()) {
        events |= POLLOUT;
      } else if (!c->parked) {
        events |= POLLIN;
      }
      fds.push_back({c->fd.get(), events, 0});
      ids.push_back(id);
    }
    const auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now());
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait.count() + 1, 0)));
    if (r < 0) {
      if (errno == EINTR) continue;
      SLUICE_LOG(ERROR) << "rendezvous server: poll failed: " << std::strerror(errno) << "; stopping";
      break;
    }
    if (fds[1].revents & POLLIN) Accept();
    for (size_t i = 0; i < ids.size(); ++i) {
      const short ev = fds[i + 2].revents;
      if (ev == 0) continue;
      auto it = conns.find(ids[i]);
      if (it == conns.end()) continue;  // closed while serving another connection
      Connection& c = *it->second;
      if ((ev & (POLLERR | POLLNVAL)) != 0) {
        Close(c.id);
        continue;
      }
      if ((ev & POLLOUT) != 0) {
        OnWritable(c);
        continue;
      }
      if ((ev & POLLIN) != 0) {
        OnReadable(c);  // reads EOF itself
        continue;
      }
      // Hung up while parked (or idle without data): the client is gone.
      if ((ev & (POLLRDHUP | POLLHUP)) != 0) Close(c.id);
    }
  }
  conns.clear();
  PublishStats();
}

// ------------------------------------------------------------------ server

RendezvousServer::RendezvousServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

RendezvousServer::~RendezvousServer() { impl_->thread.Stop(); }

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(RendezvousServerOptions options) {
  auto limit = [](size_t v, size_t lo, size_t hi, const char* name) -> Status {
    if (v < lo || v > hi) {
      return Status::InvalidArgument(std::string("RendezvousServerOptions.") + name + " must be " + std::to_string(lo) +
                                     ".." + std::to_string(hi) + ", got " + std::to_string(v));
    }
    return Status::Ok();
  };
  SLUICE_RETURN_IF_ERROR(limit(options.max_key_bytes, 1, 4096, "max_key_bytes"));
  SLUICE_RETURN_IF_ERROR(limit(options.max_value_bytes, 0, size_t{1} << 30, "max_value_bytes"));
  SLUICE_RETURN_IF_ERROR(limit(options.max_keys, 1, size_t{1} << 24, "max_keys"));
  SLUICE_RETURN_IF_ERROR(limit(options.max_connections, 1, 60000, "max_connections"));
  if (options.max_wait.count() < 0) return Status::InvalidArgument("RendezvousServerOptions.max_wait must be >= 0");
  auto impl = std::make_unique<Impl>();
  SLUICE_ASSIGN_OR_RETURN(impl->listen_fd, internal::ListenTcp(options.bind_address, options.port, 128));
  SLUICE_ASSIGN_OR_RETURN(impl->port, internal::LocalPort(impl->listen_fd.get()));
  impl->wake_fd = UniqueFd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!impl->wake_fd.valid()) return Status::Unavailable(std::string("eventfd: ") + std::strerror(errno));
  impl->options = std::move(options);
  Impl* raw = impl.get();
  SLUICE_RETURN_IF_ERROR(impl->thread.Start([raw](std::stop_token stop) { raw->Serve(stop); }));
  return std::unique_ptr<RendezvousServer>(new RendezvousServer(std::move(impl)));
}

uint16_t RendezvousServer::port() const { return impl_->port; }

std::string RendezvousServer::address() const {
  return impl_->options.bind_address + ":" + std::to_string(impl_->port);
}

RendezvousServerStats RendezvousServer::stats() const {
  MutexLock lock(&impl_->stats_mu);
  return impl_->stats;
}

}  // namespace sluice::checkpoint_engine
