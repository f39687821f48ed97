#include "broadcast/gloo_group.h"

#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/gather.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <signal.h>

#include <exception>

namespace sluice::checkpoint_engine::internal {
namespace {

using Clock = std::chrono::steady_clock;

// Gloo's rendezvous Store over our RendezvousClient. Gloo expects get() to
// block until the key exists and reports failures by exception.
class RendezvousGlooStore final : public gloo::rendezvous::Store {
 public:
  RendezvousGlooStore(RendezvousClient* kv, std::string prefix, std::chrono::milliseconds timeout)
      : kv_(kv), prefix_(std::move(prefix)), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Status s = kv_->Set(prefix_ + key, std::string_view(data.data(), data.size()));
    if (!s.ok()) throw gloo::IoException("rendezvous set '" + key + "': " + s.ToString());
  }
  std::vector<char> get(const std::string& key) override {
    Result<std::string> v = kv_->Get(prefix_ + key, timeout_);
    if (!v.ok()) throw gloo::IoException("rendezvous get '" + key + "': " + v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    const auto deadline = Clock::now() + timeout;
    for (const std::string& key : keys) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      Result<std::string> v = kv_->Get(prefix_ + key, std::max(left, std::chrono::milliseconds(1)));
      if (!v.ok()) throw gloo::IoException("rendezvous wait '" + key + "': " + v.status().ToString());
    }
  }

 private:
  RendezvousClient* kv_;
  std::string prefix_;
  std::chrono::milliseconds timeout_;
};

// Runs `op`, turning Gloo's exceptions into a Status.
template <typename Op>
Status Guard(const std::string& what, Op op) {
  try {
    op();
    return Status::Ok();
  } catch (const gloo::IoException& e) {
    return Status::Unavailable(what + ": " + e.what());
  } catch (const std::exception& e) {
    return Status::Internal(what + ": " + e.what());
  }
}

}  // namespace

void IgnoreSigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigemptyset(&ignore.sa_mask);
    (void)::sigaction(SIGPIPE, &ignore, nullptr);
  }
}

Result<std::shared_ptr<gloo::transport::Device>> MakeGlooDevice(const std::string& bind_address) {
  std::shared_ptr<gloo::transport::Device> device;
  Status s = Guard("cannot create a Gloo TCP device on " + bind_address, [&] {
    gloo::transport::tcp::attr attr;
    attr.hostname = bind_address;
    device = gloo::transport::tcp::CreateDevice(attr);
  });
  if (!s.ok()) return s;
  return device;
}

Result<std::unique_ptr<GlooGroup>> GlooGroup::Connect(std::shared_ptr<gloo::transport::Device> device,
                                                      RendezvousClient* kv, const std::string& key_prefix, int rank,
                                                      int size, std::chrono::milliseconds timeout) {
  auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
  Status s =
      Guard("rank " + std::to_string(rank) + " of " + std::to_string(size) + " could not join the Gloo mesh", [&] {
        context->setTimeout(timeout);
        RendezvousGlooStore store(kv, key_prefix, timeout);
        context->connectFullMesh(store, device);
      });
  if (!s.ok()) return s;
  return std::unique_ptr<GlooGroup>(new GlooGroup(std::move(context), rank, size, timeout));
}

GlooGroup::~GlooGroup() = default;

template <typename Run>
Status GlooGroup::Collective(const std::string& what, std::vector<gloo::transport::UnboundBuffer*> buffers, Run run) {
  {
    MutexLock lock(&mu_);
    if (aborted_) return Status::Aborted(what + ": the group was aborted");
    for (auto* b : buffers) in_flight_.insert(b);
  }
  Status s = Guard(what, run);
  MutexLock lock(&mu_);
  for (auto* b : buffers) in_flight_.erase(b);
  // An aborted wait returns normally inside Gloo's collective; whatever it
  // produced is void.
  if (s.ok() && aborted_) return Status::Aborted(what + ": the group was aborted");
  return s;
}

Status GlooGroup::Broadcast(void* data, size_t nbytes, uint32_t tag) {
  std::unique_ptr<gloo::transport::UnboundBuffer> buffer = context_->createUnboundBuffer(data, nbytes);
  gloo::transport::UnboundBuffer* raw = buffer.get();
  gloo::BroadcastOptions opts(context_);
  opts.setOutput<uint8_t>(std::move(buffer));
  opts.setRoot(0);
  opts.setTag(tag);
  opts.setTimeout(timeout_);
  // `opts` (which owns the buffer) outlives the registration.
  return Collective("broadcast of " + std::to_string(nbytes) + " bytes failed on rank " + std::to_string(rank_), {raw},
                    [&] { gloo::broadcast(opts); });
}

Status GlooGroup::Gather(const void* in, size_t nbytes, void* out, uint32_t tag) {
  // Gloo only reads the input buffer.
  std::unique_ptr<gloo::transport::UnboundBuffer> input = context_->createUnboundBuffer(const_cast<void*>(in), nbytes);
  std::vector<gloo::transport::UnboundBuffer*> raw = {input.get()};
  gloo::GatherOptions opts(context_);
  opts.setInput<uint8_t>(std::move(input));
  if (rank_ == 0) {
    std::unique_ptr<gloo::transport::UnboundBuffer> output =
        context_->createUnboundBuffer(out, nbytes * static_cast<size_t>(size_));
    raw.push_back(output.get());
    opts.setOutput<uint8_t>(std::move(output));
  }
  opts.setRoot(0);
  opts.setTag(tag);
  opts.setTimeout(timeout_);
  return Collective("gather failed on rank " + std::to_string(rank_), raw, [&] { gloo::gather(opts); });
}

bool GlooGroup::aborted() const {
  MutexLock lock(&mu_);
  return aborted_;
}

void GlooGroup::Abort() {
  MutexLock lock(&mu_);
  if (aborted_) return;
  aborted_ = true;
  // 1. Fail every pending operation and close every connection. Gloo has
  //    no public abort, but it documents what an unbound buffer does when a
  //    wait times out: it signals an exception on every pair of the
  //    context. So: a receive nobody will ever send to, on a slot no
  //    collective uses, waited for 1 ms. A pair that is broken already
  //    refuses the receive; any healthy one will do.
  constexpr uint64_t kAbortSlot = ~uint64_t{0};
  char byte = 0;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    std::unique_ptr<gloo::transport::UnboundBuffer> buffer = context_->createUnboundBuffer(&byte, 1);
    try {
      buffer->recv(peer, kAbortSlot, 0, 1);
    } catch (const std::exception&) {
      continue;  // this pair has failed already
    }
    try {
      buffer->waitRecv(nullptr, std::chrono::milliseconds(1));
    } catch (const std::exception&) {
      // Expected: the timeout, which signalled every pair.
    }
  }
  // 2. The exception does not reach a receive whose bytes were being read
  //    when its peer died (Gloo keeps that one outside its pending lists),
  //    so release every wait in flight explicitly.
  for (gloo::transport::UnboundBuffer* b : in_flight_) {
    b->abortWaitRecv();
    b->abortWaitSend();
  }
}

}  // namespace sluice::checkpoint_engine::internal
