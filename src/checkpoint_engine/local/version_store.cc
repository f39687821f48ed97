#include "sluice/checkpoint_engine/version_store.h"

#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <utility>

#include "core/checksum.h"
#include "core/layout_check.h"
#include "core/pin_views.h"
#include "sluice/common/check.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {
namespace internal {

// One tensor's bytes, owned by staging and then, after a commit, by its
// Snapshot. A single heap buffer per tensor: the shared-memory transport
// will swap this for a slice of a mapped segment.
struct StoredTensor {
  const TensorSpec* spec = nullptr;
  std::unique_ptr<std::byte[]> bytes;
  size_t nbytes = 0;
  uint64_t checksum = 0;
};

// An immutable committed version. Readers touch it without the lock: nothing
// mutates it after Commit, and it is destroyed only once unpinned and
// superseded.
struct Snapshot {
  int64_t version = kNoVersion;
  std::map<std::string, StoredTensor, std::less<>> tensors;
  size_t nbytes = 0;
};

struct Staging {
  std::map<std::string, StoredTensor, std::less<>> tensors;   // put or sealed
  std::map<std::string, StoredTensor, std::less<>> in_place;  // staged in place, not sealed yet
  size_t nbytes = 0;                                          // bytes of both maps
};

namespace {
// The store whose subscribers this thread is notifying, if any: publishing
// from a callback would self-deadlock on notify_mu, so it is refused instead.
thread_local const StoreCore* tls_notifying = nullptr;
}  // namespace

struct StoreCore {
  struct Entry {
    std::unique_ptr<Snapshot> snapshot;
    int64_t pins = 0;
  };

  VersionStoreOptions options;
  std::map<std::string, const TensorSpec*, std::less<>> specs;  // into options.layout
  size_t version_bytes = 0;

  // Lock order: notify_mu before mu.
  Mutex notify_mu;
  Mutex mu;
  CondVar committed_cv;  // signalled (with mu) on every commit
  std::map<int64_t, Entry> versions SLUICE_GUARDED_BY(mu);
  int64_t latest SLUICE_GUARDED_BY(mu) = kNoVersion;
  int64_t staging_version SLUICE_GUARDED_BY(mu) = kNoVersion;
  size_t staging_bytes SLUICE_GUARDED_BY(mu) = 0;
  uint64_t commits SLUICE_GUARDED_BY(mu) = 0;
  uint64_t aborts SLUICE_GUARDED_BY(mu) = 0;
  std::map<uint64_t, std::function<void(int64_t)>> subscribers SLUICE_GUARDED_BY(mu);
  uint64_t next_subscriber_id SLUICE_GUARDED_BY(mu) = 1;
  // reuse_buffers: the buffers of one freed version, by tensor name.
  std::map<std::string, std::unique_ptr<std::byte[]>, std::less<>> spare SLUICE_GUARDED_BY(mu);
  size_t spare_bytes SLUICE_GUARDED_BY(mu) = 0;

  // Takes `doomed`'s buffers as the spare if reuse is on and there is none;
  // whatever is left of it is freed by the caller, outside mu.
  void KeepAsSpareLocked(Snapshot* doomed) SLUICE_REQUIRES(mu);

  // A buffer for tensor `name` of `nbytes`: the spare one if there is one,
  // else a fresh allocation (outside mu). Its contents are undefined.
  std::unique_ptr<std::byte[]> TakeBuffer(std::string_view name, size_t nbytes) SLUICE_EXCLUDES(mu) {
    {
      MutexLock lock(&mu);
      auto it = spare.find(name);
      if (it != spare.end()) {
        std::unique_ptr<std::byte[]> reused = std::move(it->second);
        spare.erase(it);
        spare_bytes -= nbytes;
        return reused;
      }
    }
    return std::unique_ptr<std::byte[]>(new std::byte[nbytes > 0 ? nbytes : 1]);
  }

  size_t PinnedCountLocked() const SLUICE_REQUIRES(mu) {
    size_t n = 0;
    for (const auto& [v, e] : versions) n += e.pins > 0 ? 1 : 0;
    return n;
  }

  // Pins `it`'s version and returns a handle on it. Refuses only a first pin
  // beyond max_pinned_versions.
  Result<VersionHandle> PinLocked(const std::shared_ptr<StoreCore>& self, std::map<int64_t, Entry>::iterator it)
      SLUICE_REQUIRES(mu) {
    if (it->second.pins == 0 && options.max_pinned_versions > 0 && PinnedCountLocked() >= options.max_pinned_versions) {
      return Status::ResourceExhausted(
          "cannot pin version " + std::to_string(it->first) + ": " + std::to_string(PinnedCountLocked()) +
          " versions are pinned (max_pinned_versions=" + std::to_string(options.max_pinned_versions) +
          "); release an older VersionHandle first");
    }
    ++it->second.pins;
    return VersionHandle(self, it->second.snapshot.get());
  }

  // Adds a pin to a version that is already pinned (handle copy).
  void AddPin(int64_t version) SLUICE_EXCLUDES(mu) {
    MutexLock lock(&mu);
    auto it = versions.find(version);
    SLUICE_CHECK(it != versions.end() && it->second.pins > 0) << "copying a handle of unpinned version " << version;
    ++it->second.pins;
  }

  // Drops a pin; frees the version if it is now unpinned and superseded. The
  // bytes are released after the lock is dropped.
  void RemovePin(int64_t version) SLUICE_EXCLUDES(mu) {
    std::unique_ptr<Snapshot> doomed;
    {
      MutexLock lock(&mu);
      auto it = versions.find(version);
      SLUICE_CHECK(it != versions.end() && it->second.pins > 0) << "unpinning unpinned version " << version;
      if (--it->second.pins == 0 && version != latest) {
        doomed = std::move(it->second.snapshot);
        versions.erase(it);
        // Not while a publish is staging: the staging holds the spare's
        // place in the bound (it may have taken the spare's buffers already).
        if (staging_version == kNoVersion) KeepAsSpareLocked(doomed.get());
      }
    }
  }

  void ReleaseStaging(int64_t version) SLUICE_EXCLUDES(mu) {
    MutexLock lock(&mu);
    SLUICE_CHECK_EQ(staging_version, version);
    staging_version = kNoVersion;
    staging_bytes = 0;
    ++aborts;
  }
};

void StoreCore::KeepAsSpareLocked(Snapshot* doomed) {
  if (!options.reuse_buffers || !spare.empty() || doomed == nullptr) return;
  for (auto& [name, t] : doomed->tensors) {
    spare_bytes += t.nbytes;
    spare.emplace(name, std::move(t.bytes));
  }
}

}  // namespace internal

using internal::Snapshot;
using internal::StoreCore;
using internal::StoredTensor;
using sluice::Quoted;

namespace {

Status VerifyTensor(int64_t version, const std::string& name, const StoredTensor& t) {
  uint64_t now = Checksum64(t.bytes.get(), t.nbytes);
  if (now != t.checksum) {
    std::ostringstream msg;
    msg << "version " << version << ": bytes of tensor " << Quoted(name) << " changed after Put (checksum 0x"
        << std::hex << t.checksum << " recorded, 0x" << now << " now)";
    return Status::DataLoss(msg.str());
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------- VersionHandle

VersionHandle::VersionHandle(const VersionHandle& other) : core_(other.core_), snapshot_(other.snapshot_) {
  if (snapshot_ != nullptr) core_->AddPin(snapshot_->version);
}

VersionHandle& VersionHandle::operator=(const VersionHandle& other) {
  if (this != &other) {
    VersionHandle copy(other);
    *this = std::move(copy);
  }
  return *this;
}

VersionHandle::VersionHandle(VersionHandle&& other) noexcept
    : core_(std::move(other.core_)), snapshot_(std::exchange(other.snapshot_, nullptr)) {}

VersionHandle& VersionHandle::operator=(VersionHandle&& other) noexcept {
  if (this != &other) {
    Release();
    core_ = std::move(other.core_);
    snapshot_ = std::exchange(other.snapshot_, nullptr);
  }
  return *this;
}

VersionHandle::~VersionHandle() { Release(); }

void VersionHandle::Release() {
  if (snapshot_ != nullptr) {
    int64_t version = snapshot_->version;
    snapshot_ = nullptr;
    core_->RemovePin(version);
  }
  core_.reset();
}

int64_t VersionHandle::version() const { return snapshot_ ? snapshot_->version : kNoVersion; }

Result<HostTensor> VersionHandle::tensor(std::string_view name) const {
  if (snapshot_ == nullptr) return Status::FailedPrecondition("tensor(" + Quoted(name) + ") on an empty VersionHandle");
  auto it = snapshot_->tensors.find(name);
  if (it == snapshot_->tensors.end()) {
    return Status::NotFound("version " + std::to_string(snapshot_->version) + " has no tensor " + Quoted(name));
  }
  const StoredTensor& stored = it->second;
  HostTensor view;
  view.dtype = stored.spec->dtype;
  view.shape = stored.spec->shape;
  view.data = stored.bytes.get();
  view.nbytes = stored.nbytes;
  // The owner is a pin, not the buffer: a view that outlives its handle keeps
  // the version counted in stats() and inside the memory bound.
  view.owner = std::make_shared<const VersionHandle>(*this);
  return view;
}

Result<uint64_t> VersionHandle::checksum(std::string_view name) const {
  if (snapshot_ == nullptr)
    return Status::FailedPrecondition("checksum(" + Quoted(name) + ") on an empty VersionHandle");
  auto it = snapshot_->tensors.find(name);
  if (it == snapshot_->tensors.end()) {
    return Status::NotFound("version " + std::to_string(snapshot_->version) + " has no tensor " + Quoted(name));
  }
  return it->second.checksum;
}

Status VersionHandle::Verify() const {
  if (snapshot_ == nullptr) return Status::FailedPrecondition("Verify() on an empty VersionHandle");
  for (const auto& [name, t] : snapshot_->tensors) SLUICE_RETURN_IF_ERROR(VerifyTensor(snapshot_->version, name, t));
  return Status::Ok();
}

// ---------------------------------------------------------------- PublishHandle

PublishHandle::PublishHandle(std::shared_ptr<StoreCore> core, int64_t version)
    : core_(std::move(core)), version_(version), staging_(std::make_unique<internal::Staging>()) {}

PublishHandle::~PublishHandle() { Abort(); }

void PublishHandle::Abort() {
  if (staging_ == nullptr) return;
  staging_.reset();
  core_->ReleaseStaging(version_);
}

Status PublishHandle::Put(std::string_view name, const HostTensor& tensor) {
  const std::string where = "version " + std::to_string(version_) + ", tensor " + Quoted(name);
  if (staging_ == nullptr)
    return Status::FailedPrecondition(where + ": Put after the publish was committed or aborted");
  auto spec_it = core_->specs.find(name);
  if (spec_it == core_->specs.end()) {
    return Status::InvalidArgument(where + ": not in the registered layout");
  }
  const TensorSpec& spec = *spec_it->second;
  SLUICE_RETURN_IF_ERROR(internal::CheckTensorMatchesSpec(where, spec, tensor, core_->options.max_tensor_bytes));
  const size_t expected = tensor.nbytes;
  if (staging_->tensors.count(name) > 0) {
    return Status::AlreadyExists(where + ": already put; each tensor is put exactly once per version");
  }
  if (staging_->in_place.count(name) > 0) {
    return Status::AlreadyExists(where + ": already staged in place; seal it instead of putting it");
  }

  // Copy and checksum without any lock: this is the slow part of a publish.
  StoredTensor stored;
  stored.spec = &spec;
  stored.nbytes = expected;
  stored.bytes = core_->TakeBuffer(spec.name, expected);
  stored.checksum = CopyAndChecksum64(stored.bytes.get(), tensor.data, expected);  // of the copy
  staging_->tensors.emplace(spec.name, std::move(stored));
  staging_->nbytes += expected;
  {
    MutexLock lock(&core_->mu);
    core_->staging_bytes = staging_->nbytes;
  }
  return Status::Ok();
}

Result<std::span<std::byte>> PublishHandle::StageInPlace(std::string_view name) {
  const std::string where = "version " + std::to_string(version_) + ", tensor " + Quoted(name);
  if (staging_ == nullptr) {
    return Status::FailedPrecondition(where + ": StageInPlace after the publish was committed or aborted");
  }
  auto spec_it = core_->specs.find(name);
  if (spec_it == core_->specs.end()) return Status::InvalidArgument(where + ": not in the registered layout");
  if (staging_->tensors.count(name) > 0) {
    return Status::AlreadyExists(where + ": already put; each tensor is put exactly once per version");
  }
  if (auto it = staging_->in_place.find(name); it != staging_->in_place.end()) {
    return std::span<std::byte>(it->second.bytes.get(), it->second.nbytes);
  }
  const TensorSpec& spec = *spec_it->second;
  // ValidateLayout at Create guarantees the size is representable and within max_tensor_bytes.
  const size_t nbytes = CheckedNumel(spec.shape).value() * DTypeSize(spec.dtype);
  StoredTensor stored;
  stored.spec = &spec;
  stored.nbytes = nbytes;
  stored.bytes = core_->TakeBuffer(spec.name, nbytes);  // contents undefined: the caller fills it
  std::span<std::byte> span(stored.bytes.get(), nbytes);
  staging_->in_place.emplace(spec.name, std::move(stored));
  staging_->nbytes += nbytes;
  {
    MutexLock lock(&core_->mu);
    core_->staging_bytes = staging_->nbytes;
  }
  return span;
}

Status PublishHandle::SealInPlace(std::string_view name, uint64_t expected_checksum) {
  const std::string where = "version " + std::to_string(version_) + ", tensor " + Quoted(name);
  if (staging_ == nullptr) {
    return Status::FailedPrecondition(where + ": SealInPlace after the publish was committed or aborted");
  }
  if (staging_->tensors.count(name) > 0) return Status::AlreadyExists(where + ": already put or sealed");
  auto it = staging_->in_place.find(name);
  if (it == staging_->in_place.end()) {
    return Status::FailedPrecondition(where + ": not staged in place (call StageInPlace first)");
  }
  StoredTensor& stored = it->second;
  const uint64_t actual = Checksum64(stored.bytes.get(), stored.nbytes);
  if (actual != expected_checksum) {
    std::ostringstream msg;
    msg << where << ": staged bytes do not match the expected checksum (0x" << std::hex << expected_checksum
        << " expected, 0x" << actual << " staged); the tensor stays unsealed";
    return Status::DataLoss(msg.str());
  }
  stored.checksum = actual;
  staging_->tensors.insert(staging_->in_place.extract(it));
  return Status::Ok();
}

Status PublishHandle::Commit() {
  const std::string what = "cannot commit version " + std::to_string(version_);
  if (staging_ == nullptr) return Status::FailedPrecondition(what + ": the publish was already committed or aborted");
  if (internal::tls_notifying == core_.get()) {
    return Status::FailedPrecondition(what + " from a subscriber callback of the same store");
  }
  std::string missing;
  size_t missing_count = 0;
  for (const TensorSpec& spec : core_->options.layout) {
    if (staging_->tensors.count(spec.name) == 0) {
      missing += (missing_count++ ? ", " : "") + Quoted(spec.name) +
                 (staging_->in_place.count(spec.name) > 0 ? " (staged in place, not sealed)" : "");
    }
  }
  if (missing_count > 0) {
    return Status::FailedPrecondition(what + ": " + std::to_string(missing_count) + " of " +
                                      std::to_string(core_->options.layout.size()) +
                                      " layout tensors were not put: " + missing);
  }
  // Re-verify every staged byte before it becomes visible: a stray write into
  // staging must never reach a reader.
  for (const auto& [name, t] : staging_->tensors) {
    Status s = VerifyTensor(version_, name, t);
    if (!s.ok()) {
      Abort();
      return s.WithContext(what + " (publish aborted)");
    }
  }

  auto snapshot = std::make_unique<Snapshot>();
  snapshot->version = version_;
  snapshot->tensors = std::move(staging_->tensors);
  snapshot->nbytes = staging_->nbytes;
  staging_.reset();

  // notify_mu is held from before the swap until the last callback returns,
  // so notifications are delivered in commit order even when the next
  // publish starts (on another thread) while callbacks are still running.
  MutexLock notify_lock(&core_->notify_mu);
  std::unique_ptr<Snapshot> superseded;
  std::vector<std::function<void(int64_t)>> callbacks;
  {
    MutexLock lock(&core_->mu);
    SLUICE_CHECK_EQ(core_->staging_version, version_);
    SLUICE_CHECK_LT(core_->latest, version_);
    auto old = core_->versions.find(core_->latest);
    if (old != core_->versions.end() && old->second.pins == 0) {
      superseded = std::move(old->second.snapshot);
      core_->versions.erase(old);
      core_->KeepAsSpareLocked(superseded.get());
    }
    core_->versions[version_].snapshot = std::move(snapshot);
    core_->latest = version_;
    core_->staging_version = kNoVersion;
    core_->staging_bytes = 0;
    ++core_->commits;
    callbacks.reserve(core_->subscribers.size());
    for (const auto& [id, cb] : core_->subscribers) callbacks.push_back(cb);
    core_->committed_cv.NotifyAll();
  }
  superseded.reset();  // free the old bytes outside mu

  const StoreCore* previous = internal::tls_notifying;
  internal::tls_notifying = core_.get();
  for (const auto& cb : callbacks) cb(version_);
  internal::tls_notifying = previous;
  return Status::Ok();
}

std::span<std::byte> PublishHandle::MutableStagedBytesForTesting(std::string_view name) {
  if (staging_ == nullptr) return {};
  auto it = staging_->tensors.find(name);
  if (it == staging_->tensors.end()) return {};
  return {it->second.bytes.get(), it->second.nbytes};
}

// ---------------------------------------------------------------- VersionStore

Result<std::unique_ptr<VersionStore>> VersionStore::Create(VersionStoreOptions options) {
  SLUICE_ASSIGN_OR_RETURN(std::vector<size_t> bytes,
                          internal::ValidateLayout(options.layout, options.max_tensor_bytes, "VersionStoreOptions"));
  auto core = std::make_shared<StoreCore>();
  core->options = std::move(options);
  for (size_t i = 0; i < core->options.layout.size(); ++i) {
    const TensorSpec& spec = core->options.layout[i];
    core->specs.emplace(spec.name, &spec);
    core->version_bytes += bytes[i];
  }
  return std::unique_ptr<VersionStore>(new VersionStore(std::move(core)));
}

VersionStore::VersionStore(std::shared_ptr<StoreCore> core) : core_(std::move(core)) {}
VersionStore::~VersionStore() = default;

Result<std::unique_ptr<StagedWeights>> VersionStore::BeginPublish(int64_t version) {
  const std::string what = "cannot begin publishing version " + std::to_string(version);
  SLUICE_RETURN_IF_ERROR(internal::CheckPublishVersion(version, what));
  if (internal::tls_notifying == core_.get()) {
    return Status::FailedPrecondition(what + " from a subscriber callback of the same store");
  }
  MutexLock lock(&core_->mu);
  if (core_->staging_version != kNoVersion) {
    return Status::FailedPrecondition(what + ": version " + std::to_string(core_->staging_version) +
                                      " is being staged; commit or abort it first");
  }
  if (version == core_->latest) return Status::AlreadyExists(what + ": it is already committed");
  if (version < core_->latest) {
    return Status::FailedPrecondition(what + ": it is older than the latest committed version " +
                                      std::to_string(core_->latest) + "; versions only increase");
  }
  core_->staging_version = version;
  core_->staging_bytes = 0;
  return std::unique_ptr<StagedWeights>(new PublishHandle(core_, version));
}

Result<VersionHandle> VersionStore::AcquireLatest() {
  MutexLock lock(&core_->mu);
  if (core_->latest == kNoVersion) return Status::NotFound("no version has been committed yet");
  return core_->PinLocked(core_, core_->versions.find(core_->latest));
}

Result<VersionHandle> VersionStore::Acquire(int64_t version) {
  MutexLock lock(&core_->mu);
  auto it = core_->versions.find(version);
  if (it == core_->versions.end()) {
    return Status::NotFound("version " + std::to_string(version) +
                            " is not in memory (never committed, or superseded and unpinned); latest is " +
                            std::to_string(core_->latest));
  }
  return core_->PinLocked(core_, it);
}

Result<VersionHandle> VersionStore::WaitForVersion(int64_t at_least, std::chrono::milliseconds timeout) {
  StoreCore* core = core_.get();
  MutexLock lock(&core->mu);
  bool arrived = core->committed_cv.WaitFor(&core->mu, timeout, [core, at_least]() SLUICE_NO_THREAD_SAFETY_ANALYSIS {
    return core->latest != kNoVersion && core->latest >= at_least;
  });
  if (!arrived) {
    return Status::Timeout("no version >= " + std::to_string(at_least) + " was committed within " +
                           std::to_string(timeout.count()) + " ms; latest is " + std::to_string(core->latest));
  }
  return core->PinLocked(core_, core->versions.find(core->latest));
}

int64_t VersionStore::latest_version() const {
  MutexLock lock(&core_->mu);
  return core_->latest;
}

VersionStoreStats VersionStore::stats() const {
  VersionStoreStats s;
  MutexLock lock(&core_->mu);
  s.latest_version = core_->latest;
  for (const auto& [v, e] : core_->versions) {
    s.versions_in_memory.push_back(v);
    s.committed_bytes += e.snapshot->nbytes;
    if (e.pins > 0) s.pinned.push_back({v, e.pins});
  }
  s.staging_version = core_->staging_version;
  s.staging_bytes = core_->staging_bytes;
  s.spare_bytes = core_->spare_bytes;
  s.bytes_held = s.committed_bytes + s.staging_bytes + s.spare_bytes;
  s.max_versions_in_memory = s.pinned.size() + 2;
  s.max_bytes_held = s.max_versions_in_memory * core_->version_bytes;
  s.commits = core_->commits;
  s.aborts = core_->aborts;
  return s;
}

uint64_t VersionStore::Subscribe(std::function<void(int64_t version)> callback) {
  MutexLock lock(&core_->mu);
  uint64_t id = core_->next_subscriber_id++;
  core_->subscribers.emplace(id, std::move(callback));
  return id;
}

Status VersionStore::Unsubscribe(uint64_t id) {
  // Inside a callback this thread already holds notify_mu; elsewhere taking
  // it waits out a delivery in progress.
  std::optional<MutexLock> notify_lock;
  if (internal::tls_notifying != core_.get()) notify_lock.emplace(&core_->notify_mu);
  std::function<void(int64_t)> removed;  // destroyed outside mu
  MutexLock lock(&core_->mu);
  auto it = core_->subscribers.find(id);
  if (it == core_->subscribers.end()) return Status::NotFound("subscription " + std::to_string(id) + " does not exist");
  removed = std::move(it->second);
  core_->subscribers.erase(it);
  return Status::Ok();
}

Result<PinnedWeights> VersionStore::PinLatest() {
  SLUICE_ASSIGN_OR_RETURN(VersionHandle handle, AcquireLatest());
  return internal::PinViews(handle, layout());
}

Result<PinnedWeights> VersionStore::WaitAndPin(int64_t at_least, std::chrono::milliseconds timeout) {
  SLUICE_ASSIGN_OR_RETURN(VersionHandle handle, WaitForVersion(at_least, timeout));
  return internal::PinViews(handle, layout());
}

const Layout& VersionStore::layout() const { return core_->options.layout; }
size_t VersionStore::version_bytes() const { return core_->version_bytes; }

}  // namespace sluice::checkpoint_engine
