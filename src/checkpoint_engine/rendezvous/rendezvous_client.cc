// RendezvousClient: one blocking connection; a mutex serializes requests.
// Any wire failure poisons the client (sticky error): after a half-read
// answer the framing is lost, and the server has dropped this connection's
// ephemeral keys anyway, so silently reconnecting would hide that.

#include "core/socket_util.h"
#include "rendezvous/rendezvous_wire.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {

namespace wire = rendezvous;
using Clock = std::chrono::steady_clock;

struct RendezvousClient::Impl {
  RendezvousClientOptions options;
  Mutex mu;
  internal::UniqueFd fd SLUICE_GUARDED_BY(mu);
  Status broken SLUICE_GUARDED_BY(mu);

  struct Answer {
    Status status;
    std::string value;
    int64_t arg = 0;
  };

  // Sends one request and reads its answer. A non-OK `Answer::status` is the
  // server's verdict; a non-OK return is a wire failure (sticky).
  Result<Answer> Call(wire::Op op, uint8_t flags, std::string_view key, std::string_view value, int64_t arg,
                      std::chrono::milliseconds extra_wait) {
    MutexLock lock(&mu);
    if (!broken.ok()) return broken;
    Result<Answer> answer = CallLocked(op, flags, key, value, arg, extra_wait);
    if (!answer.ok()) {
      broken = answer.status().WithContext("rendezvous " + options.address + " (connection closed)");
      fd.Reset();
      return broken;
    }
    return answer;
  }

  Result<Answer> CallLocked(wire::Op op, uint8_t flags, std::string_view key, std::string_view value, int64_t arg,
                            std::chrono::milliseconds extra_wait) SLUICE_REQUIRES(mu) {
    const auto deadline = Clock::now() + options.io_timeout + extra_wait;
    wire::RequestHeader h;
    h.op = static_cast<uint8_t>(op);
    h.flags = flags;
    h.key_len = static_cast<uint32_t>(key.size());
    h.value_len = static_cast<uint32_t>(value.size());
    h.arg = arg;
    auto header = wire::Encode(h);
    std::string frame(reinterpret_cast<const char*>(header.data()), header.size());
    frame.append(key);
    frame.append(value);
    SLUICE_RETURN_IF_ERROR(internal::SendAll(fd.get(), frame.data(), frame.size(), deadline));
    std::array<std::byte, wire::kHeaderBytes> rh;
    SLUICE_RETURN_IF_ERROR(internal::RecvAll(fd.get(), rh.data(), rh.size(), deadline));
    const wire::ResponseHeader r = wire::DecodeResponse(rh.data());
    SLUICE_RETURN_IF_ERROR(wire::CheckResponseHeader(r, options.max_value_bytes));
    Answer answer;
    answer.value.resize(r.payload_len);
    SLUICE_RETURN_IF_ERROR(internal::RecvAll(fd.get(), answer.value.data(), answer.value.size(), deadline));
    answer.arg = r.arg;
    const auto code = static_cast<StatusCode>(r.code);
    if (code != StatusCode::kOk) {
      answer.status = Status(code, "rendezvous " + options.address + ": " + answer.value);
      // The server hangs up after a framing error it reported.
      if ((r.flags & wire::kFlagClosing) != 0) return answer.status;
    }
    return answer;
  }
};

RendezvousClient::RendezvousClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RendezvousClient::~RendezvousClient() = default;

Result<std::unique_ptr<RendezvousClient>> RendezvousClient::Connect(RendezvousClientOptions options) {
  SLUICE_ASSIGN_OR_RETURN(auto host_port, internal::ParseHostPort(options.address));
  if (options.io_timeout.count() <= 0) return Status::InvalidArgument("RendezvousClientOptions.io_timeout must be > 0");
  SLUICE_ASSIGN_OR_RETURN(
      internal::UniqueFd fd,
      internal::ConnectTcp(host_port.first, host_port.second,
                           Clock::now() + std::max(options.connect_timeout, std::chrono::milliseconds(1))));
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  {
    MutexLock lock(&impl->mu);
    impl->fd = std::move(fd);
  }
  return std::unique_ptr<RendezvousClient>(new RendezvousClient(std::move(impl)));
}

namespace {
Status CheckKey(std::string_view key) {
  if (key.empty()) return Status::InvalidArgument("rendezvous keys are not empty");
  for (char c : key) {
    if (c < 0x21 || c > 0x7e) {
      return Status::InvalidArgument("rendezvous key '" + std::string(key) +
                                     "' has a character outside printable ASCII 0x21..0x7e");
    }
  }
  return Status::Ok();
}
}  // namespace

Status RendezvousClient::Set(std::string_view key, std::string_view value, KeyLifetime lifetime, bool create_only) {
  SLUICE_RETURN_IF_ERROR(CheckKey(key));
  uint8_t flags =
      (lifetime == KeyLifetime::kEphemeral ? wire::kFlagEphemeral : 0) | (create_only ? wire::kFlagCreateOnly : 0);
  SLUICE_ASSIGN_OR_RETURN(Impl::Answer a, impl_->Call(wire::Op::kSet, flags, key, value, 0, {}));
  return a.status;
}

Result<std::string> RendezvousClient::Get(std::string_view key, std::chrono::milliseconds wait) {
  SLUICE_RETURN_IF_ERROR(CheckKey(key));
  if (wait.count() < 0) wait = std::chrono::milliseconds(0);
  SLUICE_ASSIGN_OR_RETURN(Impl::Answer a, impl_->Call(wire::Op::kGet, 0, key, {}, wait.count(), wait));
  if (!a.status.ok()) return a.status;
  return std::move(a.value);
}

Result<int64_t> RendezvousClient::Add(std::string_view key, int64_t delta) {
  SLUICE_RETURN_IF_ERROR(CheckKey(key));
  SLUICE_ASSIGN_OR_RETURN(Impl::Answer a, impl_->Call(wire::Op::kAdd, 0, key, {}, delta, {}));
  if (!a.status.ok()) return a.status;
  return a.arg;
}

Status RendezvousClient::Delete(std::string_view key) {
  SLUICE_RETURN_IF_ERROR(CheckKey(key));
  SLUICE_ASSIGN_OR_RETURN(Impl::Answer a, impl_->Call(wire::Op::kDelete, 0, key, {}, 0, {}));
  return a.status;
}

const std::string& RendezvousClient::address() const { return impl_->options.address; }

}  // namespace sluice::checkpoint_engine
