// A thin Status-returning wrapper over one Gloo full-mesh context: the
// process group of one broadcast generation. Gloo's exceptions (IoException
// for a peer that closed, reset or timed out; EnforceNotMet for misuse) are
// caught here and become Unavailable / Internal; after any error the group is
// broken and must be destroyed (Gloo's pairs are closed or in an unknown
// state).
//
// Thread safety: Broadcast and Gather may run concurrently from several
// threads provided their tags differ (Gloo matches operations by tag). The
// group must outlive every call into it.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_GLOO_GROUP_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_GLOO_GROUP_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "sluice/checkpoint_engine/rendezvous.h"
#include "sluice/common/mutex.h"
#include "sluice/common/status.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace sluice::checkpoint_engine::internal {

// A Gloo TCP device bound to `bind_address` (one per process role; it owns
// Gloo's event-loop thread). Unavailable if it cannot be created.
Result<std::shared_ptr<gloo::transport::Device>> MakeGlooDevice(const std::string& bind_address);

// Sets SIGPIPE to SIG_IGN if it is SIG_DFL (Gloo writes with writev).
void IgnoreSigpipe();

class GlooGroup {
 public:
  // Joins the full mesh of `size` ranks as `rank`, exchanging addresses
  // through `kv` under `key_prefix`; every step is bounded by `timeout`.
  // Unavailable (naming the step) if a peer does not show up or connect.
  static Result<std::unique_ptr<GlooGroup>> Connect(std::shared_ptr<gloo::transport::Device> device,
                                                    RendezvousClient* kv, const std::string& key_prefix, int rank,
                                                    int size, std::chrono::milliseconds timeout);
  ~GlooGroup();

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Broadcasts `nbytes` at `data` from rank 0 (read there, written on every
  // other rank).
  Status Broadcast(void* data, size_t nbytes, uint32_t tag);
  // Gathers `nbytes` from every rank into `out` on rank 0 (size * nbytes
  // bytes, rank order); `out` is ignored elsewhere.
  Status Gather(const void* in, size_t nbytes, void* out, uint32_t tag);

  // Breaks the group now: every operation in flight on it, on any thread,
  // fails at once (Aborted), later ones fail too, and every peer sees its
  // connections to this rank close. Needed because an operation that failed
  // on one thread (a dead peer) leaves this rank's other operations waiting
  // on live peers that may in turn wait on it; without this they would all
  // sit until the timeout. Idempotent; callable from any thread.
  void Abort();
  bool aborted() const;

 private:
  GlooGroup(std::shared_ptr<gloo::Context> context, int rank, int size, std::chrono::milliseconds timeout)
      : context_(std::move(context)), rank_(rank), size_(size), timeout_(timeout) {}
  // Runs one Gloo collective over buffers it registers as in flight, so
  // Abort can interrupt their waits.
  template <typename Run>
  Status Collective(const std::string& what, std::vector<gloo::transport::UnboundBuffer*> buffers, Run run);

  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  mutable Mutex mu_;
  bool aborted_ SLUICE_GUARDED_BY(mu_) = false;
  std::set<gloo::transport::UnboundBuffer*> in_flight_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace sluice::checkpoint_engine::internal

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_GLOO_GROUP_H_
