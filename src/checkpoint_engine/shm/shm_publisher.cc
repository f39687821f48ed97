// ShmPublisher: attaches as the one writer of a shared-memory store and
// stages each version in its own segment, a recycled one when it can
// (protocol: shm_store.h).
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "core/checksum.h"
#include "core/layout_check.h"
#include "shm/shm_control.h"
#include "shm/shm_format.h"
#include "shm/shm_segment_file.h"
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/common/check.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {
namespace shm {

// Mappings the publisher keeps of segments it staged: the latest version,
// the spare, and one more (a version pinned when it was superseded).
inline constexpr size_t kPublisherIdleMappings = 3;

// Shared by the ShmPublisher and its open ShmPublishHandle; detaches from
// the store when the last of them goes.
struct PublisherCore {
  ShmPublisherOptions options;
  std::unique_ptr<Control> control;
  std::map<std::string, size_t, std::less<>> index;  // tensor name -> layout position
  size_t version_bytes = 0;

  Mutex mu;
  bool publishing SLUICE_GUARDED_BY(mu) = false;  // a handle is open
  // Mappings of committed or parked segments this publisher staged, reused
  // when the spare it stages into is one of them (no page faults).
  MappingCache idle_mappings SLUICE_GUARDED_BY(mu){kPublisherIdleMappings};

  ~PublisherCore() { Detach(); }

  // FailedPrecondition unless this process still owns the store. Lock held.
  Status CheckOwner(const Control::Locked&, const std::string& what) const {
    ControlBlock* block = control->block();
    if (block->destroyed.load(std::memory_order_acquire) != 0) {
      return Status::FailedPrecondition(what + ": store " + control->names().control() + " was destroyed");
    }
    if (Control::Owner(block->publisher) != control->self()) {
      return Status::FailedPrecondition(what + ": this process is no longer the publisher of " +
                                        control->names().control());
    }
    return Status::Ok();
  }

  void Detach() {
    Result<Control::Locked> lock = control->Lock(options.lock_timeout);
    if (!lock.ok()) {
      SLUICE_LOG(WARNING) << "cannot detach the publisher cleanly: " << lock.status().ToString()
                          << "; the next process to attach will retire it";
      return;
    }
    ControlBlock* block = control->block();
    if (block->destroyed.load(std::memory_order_acquire) != 0) return;
    if (Control::Owner(block->publisher) == control->self()) {
      block->publisher.pid.store(0, std::memory_order_release);
      block->recycle_segments.store(0, std::memory_order_release);
    }
    control->Collect(*lock);  // removes the spare: no publisher stages into it now
    if (!control->HasLiveParticipant(*lock)) control->Destroy(*lock);
  }
};

}  // namespace shm

using shm::Control;
using shm::ControlBlock;
using shm::PublisherCore;
using sluice::Quoted;

// The open staging segment of one publish. `file` holds the segment's
// exclusive flock until the version is sealed (or the publish ends).
struct ShmPublishHandle::Staging {
  shm::SegmentFd file;
  shm::Mapping mapping;
  shm::VersionHeader* header = nullptr;
  shm::TensorRecord* records = nullptr;
  std::vector<bool> put;       // put, or staged in place and sealed
  std::vector<bool> in_place;  // handed out by StageInPlace
  size_t bytes_staged = 0;
};

// ------------------------------------------------------------- PublishHandle

ShmPublishHandle::ShmPublishHandle(std::shared_ptr<PublisherCore> core, int64_t version,
                                   std::unique_ptr<Staging> staging)
    : core_(std::move(core)), version_(version), staging_(std::move(staging)) {}

ShmPublishHandle::~ShmPublishHandle() { Abort(); }

namespace {

// Removes the segment `file` is open on if it is still the one named
// `name` (another process may have replaced it since): truncated when no one
// else holds a flock on it, then unlinked.
void RemoveOwnSegment(shm::SegmentFd& file, const std::string& name) {
  Result<shm::FileStatus> mine = file.Stat();
  if (!mine.ok() || !mine->linked) return;
  Result<shm::SegmentFd> named = shm::SegmentFd::Open(name, ShmAccess::kReadOnly);
  if (!named.ok()) return;
  Result<shm::FileStatus> theirs = named->Stat();
  if (!theirs.ok() || theirs->id != mine->id) return;
  if (file.TryLockExclusive()) (void)file.Truncate();
  Status unlinked = SharedMemorySegment::Unlink(name);
  if (!unlinked.ok() && unlinked.code() != StatusCode::kNotFound) SLUICE_LOG(WARNING) << unlinked.ToString();
}

}  // namespace

void ShmPublishHandle::Abort() {
  if (staging_ == nullptr) return;
  std::unique_ptr<Staging> staging = std::move(staging_);
  Control& control = *core_->control;
  const std::string name = control.names().Version(version_);
  bool parked = false;
  if (Result<Control::Locked> lock = control.Lock(core_->options.lock_timeout); lock.ok()) {
    ControlBlock* block = control.block();
    if (block->staging.load(std::memory_order_acquire) == version_ &&
        Control::Owner(block->publisher) == control.self()) {
      // Staging cleared first: the segment may then take its place as the
      // spare. RetireSegment takes the exclusive flock itself.
      block->staging.store(kNoVersion, std::memory_order_release);
      block->aborts.fetch_add(1, std::memory_order_relaxed);
      staging->file.Unlock();
      parked = control.RetireSegment(*lock, name, /*may_park=*/core_->options.recycle_segments);
    } else {
      RemoveOwnSegment(staging->file, name);  // the reservation was cleared by another process
    }
  } else {
    // The staging name is ours (reserved under the lock), so it can go
    // without the lock; the next BeginPublish clears the stale reservation.
    RemoveOwnSegment(staging->file, name);
  }
  MutexLock lock(&core_->mu);
  if (parked) core_->idle_mappings.Put(std::move(staging->file), std::move(staging->mapping));
  core_->publishing = false;
}

Status ShmPublishHandle::Put(std::string_view name, const HostTensor& tensor) {
  const std::string where = "version " + std::to_string(version_) + ", tensor " + Quoted(name);
  if (staging_ == nullptr)
    return Status::FailedPrecondition(where + ": Put after the publish was committed or aborted");
  auto it = core_->index.find(name);
  if (it == core_->index.end()) return Status::InvalidArgument(where + ": not in the registered layout");
  const size_t t = it->second;
  const TensorSpec& spec = core_->control->layout()[t];
  SLUICE_RETURN_IF_ERROR(internal::CheckTensorMatchesSpec(where, spec, tensor, core_->options.max_tensor_bytes));
  if (staging_->put[t])
    return Status::AlreadyExists(where + ": already put; each tensor is put exactly once per version");
  if (staging_->in_place[t]) {
    return Status::AlreadyExists(where + ": already staged in place; seal it instead of putting it");
  }

  shm::TensorRecord& record = staging_->records[t];
  std::byte* dst = staging_->mapping.data() + record.offset;
  // Checksum the copy, not the source: what readers will see is what is
  // hashed (in the same pass over memory as the copy).
  record.checksum = CopyAndChecksum64(dst, tensor.data, tensor.nbytes);
  staging_->put[t] = true;
  staging_->bytes_staged += tensor.nbytes;
  if (core_->options.test_hooks.after_put) core_->options.test_hooks.after_put(version_, staging_->bytes_staged);
  return Status::Ok();
}

Result<std::span<std::byte>> ShmPublishHandle::StageInPlace(std::string_view name) {
  const std::string where = "version " + std::to_string(version_) + ", tensor " + Quoted(name);
  if (staging_ == nullptr) {
    return Status::FailedPrecondition(where + ": StageInPlace after the publish was committed or aborted");
  }
  auto it = core_->index.find(name);
  if (it == core_->index.end()) return Status::InvalidArgument(where + ": not in the registered layout");
  const size_t t = it->second;
  if (staging_->put[t])
    return Status::AlreadyExists(where + ": already put; each tensor is put exactly once per version");
  staging_->in_place[t] = true;
  const shm::TensorRecord& record = staging_->records[t];
  return std::span<std::byte>(staging_->mapping.data() + record.offset, record.nbytes);
}

Status ShmPublishHandle::SealInPlace(std::string_view name, uint64_t expected_checksum) {
  const std::string where = "version " + std::to_string(version_) + ", tensor " + Quoted(name);
  if (staging_ == nullptr) {
    return Status::FailedPrecondition(where + ": SealInPlace after the publish was committed or aborted");
  }
  auto it = core_->index.find(name);
  if (it == core_->index.end()) return Status::InvalidArgument(where + ": not in the registered layout");
  const size_t t = it->second;
  if (staging_->put[t]) return Status::AlreadyExists(where + ": already put or sealed");
  if (!staging_->in_place[t])
    return Status::FailedPrecondition(where + ": not staged in place (call StageInPlace first)");
  shm::TensorRecord& record = staging_->records[t];
  const uint64_t actual = Checksum64(staging_->mapping.data() + record.offset, record.nbytes);
  if (actual != expected_checksum) {
    std::ostringstream msg;
    msg << where << ": staged bytes do not match the expected checksum (0x" << std::hex << expected_checksum
        << " expected, 0x" << actual << " staged); the tensor stays unsealed";
    return Status::DataLoss(msg.str());
  }
  record.checksum = actual;
  staging_->put[t] = true;
  staging_->bytes_staged += record.nbytes;
  if (core_->options.test_hooks.after_put) core_->options.test_hooks.after_put(version_, staging_->bytes_staged);
  return Status::Ok();
}

Status ShmPublishHandle::Commit() {
  const std::string what = "cannot commit version " + std::to_string(version_);
  if (staging_ == nullptr) return Status::FailedPrecondition(what + ": the publish was already committed or aborted");
  const Layout& layout = core_->control->layout();
  std::string missing;
  size_t missing_count = 0;
  for (size_t t = 0; t < layout.size(); ++t) {
    if (!staging_->put[t]) {
      missing += (missing_count++ ? ", " : "") + Quoted(layout[t].name) +
                 (staging_->in_place[t] ? " (staged in place, not sealed)" : "");
    }
  }
  if (missing_count > 0) {
    return Status::FailedPrecondition(what + ": " + std::to_string(missing_count) + " of " +
                                      std::to_string(layout.size()) + " layout tensors were not put: " + missing);
  }
  // Re-verify every staged byte before it can become visible: a stray write
  // into the staging segment must never reach a reader.
  for (size_t t = 0; t < layout.size(); ++t) {
    const shm::TensorRecord& r = staging_->records[t];
    const uint64_t now = Checksum64(staging_->mapping.data() + r.offset, r.nbytes);
    if (now != r.checksum) {
      std::ostringstream msg;
      msg << what << " (publish aborted): version " << version_ << ": bytes of tensor " << Quoted(layout[t].name)
          << " changed after Put (checksum 0x" << std::hex << r.checksum << " recorded, 0x" << now << " now)";
      Abort();
      return Status::DataLoss(msg.str());
    }
  }
  staging_->header->sealed.store(1, std::memory_order_release);
  // Readers take a shared flock once they can pin the version, from the
  // critical section below on.
  staging_->file.Unlock();

  Control& control = *core_->control;
  ControlBlock* block = control.block();
  Status refused;
  {
    Result<Control::Locked> lock = control.Lock(core_->options.lock_timeout);
    if (!lock.ok()) {
      (void)staging_->file.TryLockExclusive();  // the publish stays open
      return lock.status().WithContext(what);
    }
    refused = core_->CheckOwner(*lock, what);
    if (refused.ok() && block->staging.load(std::memory_order_acquire) != version_) {
      refused = Status::FailedPrecondition(what + ": its staging reservation in " + control.names().control() +
                                           " was cleared by another process");
    }
    if (refused.ok()) {
      shm::VersionEntry* entry = control.FreeEntryOrNull(*lock);
      // Entries are sized so this cannot happen (see ComputeGeometry).
      SLUICE_CHECK(entry != nullptr) << "version table of " << control.names().control() << " is full";
      // Order matters for crash repair: entry, then latest, then staging (see
      // Control::Collect for how each prefix is repaired).
      entry->version.store(version_, std::memory_order_release);
      if (core_->options.test_hooks.inside_commit_lock) core_->options.test_hooks.inside_commit_lock(version_);
      const int64_t previous = block->latest.load(std::memory_order_acquire);
      block->latest.store(version_, std::memory_order_release);
      block->staging.store(kNoVersion, std::memory_order_release);
      block->commits.fetch_add(1, std::memory_order_relaxed);
      control.FreeIfUnreachable(*lock, previous);
      control.Collect(*lock);
    }
  }
  if (!refused.ok()) {
    Abort();  // takes the lock itself, so only after it was released above
    return refused;
  }
  block->commit_seq.fetch_add(1, std::memory_order_release);
  ShmFutexWakeAll(&block->commit_seq);
  std::unique_ptr<Staging> committed = std::move(staging_);
  MutexLock lock(&core_->mu);
  // Kept mapped: once superseded and freed, it may come back as the spare.
  if (core_->options.recycle_segments) {
    core_->idle_mappings.Put(std::move(committed->file), std::move(committed->mapping));
  }
  core_->publishing = false;
  return Status::Ok();
}

std::span<std::byte> ShmPublishHandle::MutableStagedBytesForTesting(std::string_view name) {
  if (staging_ == nullptr) return {};
  auto it = core_->index.find(name);
  if (it == core_->index.end() || !staging_->put[it->second]) return {};
  const shm::TensorRecord& r = staging_->records[it->second];
  return {staging_->mapping.data() + r.offset, r.nbytes};
}

// --------------------------------------------------------------- ShmPublisher

Result<std::unique_ptr<ShmPublisher>> ShmPublisher::Attach(ShmPublisherOptions options) {
  SLUICE_ASSIGN_OR_RETURN(shm::StoreNames names, shm::StoreNames::Make(options.shm_prefix, options.store_name));
  SLUICE_ASSIGN_OR_RETURN(std::vector<size_t> bytes,
                          internal::ValidateLayout(options.layout, options.max_tensor_bytes, "ShmPublisherOptions"));
  if (options.max_readers < 1 || options.max_readers > 4096) {
    return Status::InvalidArgument("ShmPublisherOptions.max_readers must be 1..4096, got " +
                                   std::to_string(options.max_readers));
  }
  if (options.max_pins_per_reader < 1 || options.max_pins_per_reader > 64) {
    return Status::InvalidArgument("ShmPublisherOptions.max_pins_per_reader must be 1..64, got " +
                                   std::to_string(options.max_pins_per_reader));
  }
  const std::string what = "cannot attach a publisher to store " + names.control();
  std::unique_ptr<Control> control;
  // Retries are bounded in time: each one means the store was torn down or
  // created concurrently, or is still being initialized.
  const auto start = std::chrono::steady_clock::now();
  const auto init_deadline = start + std::chrono::seconds(2);
  const auto deadline = start + std::chrono::seconds(5);
  for (int attempt = 0; control == nullptr; ++attempt) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Unavailable(what + ": the store kept changing under us for 5 s");
    }
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    Result<std::unique_ptr<Control>> created =
        Control::Create(names, options.layout, bytes, options.max_tensor_bytes, options.max_readers,
                        options.max_pins_per_reader, options.recycle_segments);
    if (created.ok()) {
      control = std::move(created).value();
      break;
    }
    if (created.status().code() != StatusCode::kAlreadyExists) return created.status().WithContext(what);

    Result<std::unique_ptr<Control>> opened = Control::Open(names);
    if (opened.status().code() == StatusCode::kNotFound) continue;  // torn down meanwhile
    if (opened.status().code() == StatusCode::kUnavailable) {
      // Magic still 0. Initialization takes microseconds; one that is still
      // unfinished after the deadline was abandoned by a dead creator.
      if (std::chrono::steady_clock::now() < init_deadline) continue;
      SLUICE_LOG(WARNING) << names.control() << " was never initialized; removing it";
      (void)SharedMemorySegment::Unlink(names.control());
      continue;
    }
    if (!opened.ok()) return opened.status().WithContext(what);
    std::unique_ptr<Control> candidate = std::move(opened).value();
    const std::string diff = shm::DescribeLayoutDifference(candidate->layout(), options.layout);
    if (!diff.empty()) {
      return Status::FailedPrecondition(what + ": its layout differs (" + diff +
                                        "); use another store name or DestroyShmStore it first");
    }
    SLUICE_ASSIGN_OR_RETURN(Control::Locked lock, candidate->Lock(options.lock_timeout));
    ControlBlock* block = candidate->block();
    if (block->destroyed.load(std::memory_order_acquire) != 0) continue;  // being torn down: start over
    const ProcessIdentity previous = Control::Owner(block->publisher);
    if (previous.pid != 0 && IsProcessAlive(previous)) {
      return Status::FailedPrecondition(what + ": it already has a live publisher (pid " +
                                        std::to_string(previous.pid) +
                                        (previous == candidate->self() ? ", this process" : "") + ")");
    }
    // Retires a dead predecessor, removes its staging, frees what it can.
    candidate->Repair(lock);
    Control::SetOwner(&block->publisher, candidate->self());
    block->recycle_segments.store(options.recycle_segments ? 1 : 0, std::memory_order_release);
    if (options.max_readers != candidate->geometry().max_readers ||
        options.max_pins_per_reader != candidate->geometry().pins_per_reader) {
      SLUICE_LOG(INFO) << names.control() << " keeps its own limits: max_readers " << candidate->geometry().max_readers
                       << ", max_pins_per_reader " << candidate->geometry().pins_per_reader;
    }
    control = std::move(candidate);
  }
  auto core = std::make_shared<PublisherCore>();
  core->options = std::move(options);
  for (size_t t = 0; t < control->layout().size(); ++t) core->index.emplace(control->layout()[t].name, t);
  for (size_t n : control->geometry().tensor_bytes) core->version_bytes += n;
  core->control = std::move(control);
  return std::unique_ptr<ShmPublisher>(new ShmPublisher(std::move(core)));
}

ShmPublisher::~ShmPublisher() = default;

Result<std::unique_ptr<StagedWeights>> ShmPublisher::BeginPublish(int64_t version) {
  const std::string what = "cannot begin publishing version " + std::to_string(version);
  SLUICE_RETURN_IF_ERROR(internal::CheckPublishVersion(version, what));
  {
    MutexLock lock(&core_->mu);
    if (core_->publishing)
      return Status::FailedPrecondition(what + ": another publish is open; commit or abort it first");
    core_->publishing = true;
  }
  auto release = [&](Status s) -> Result<std::unique_ptr<StagedWeights>> {
    MutexLock lock(&core_->mu);
    core_->publishing = false;
    return s;
  };
  Control& control = *core_->control;
  ControlBlock* block = control.block();
  const std::string name = control.names().Version(version);
  Result<shm::SegmentFd> spare = Status::NotFound("recycling is off");
  {
    Result<Control::Locked> lock = control.Lock(core_->options.lock_timeout);
    if (!lock.ok()) return release(lock.status().WithContext(what));
    Status owner = core_->CheckOwner(*lock, what);
    if (!owner.ok()) return release(owner);
    const int64_t latest = block->latest.load(std::memory_order_acquire);
    if (version == latest) return release(Status::AlreadyExists(what + ": it is already committed"));
    if (version < latest) {
      return release(Status::FailedPrecondition(what + ": it is older than the latest committed version " +
                                                std::to_string(latest) + "; versions only increase"));
    }
    // A reservation left by an abort that could not take the lock is ours.
    const int64_t stale = block->staging.load(std::memory_order_acquire);
    if (stale != kNoVersion) {
      block->staging.store(kNoVersion, std::memory_order_release);
      control.RetireSegment(*lock, control.names().Version(stale), /*may_park=*/true);
      block->aborts.fetch_add(1, std::memory_order_relaxed);
    }
    control.Collect(*lock);  // may park a freed segment as the spare
    block->staging.store(version, std::memory_order_release);
    // In the same critical section: the spare becomes the staging segment,
    // so the two never both exist (the memory bound counts one of them).
    if (core_->options.recycle_segments) spare = control.TakeSpare(*lock, name);
  }
  auto unreserve = [&](Status s) {
    if (Result<Control::Locked> lock = control.Lock(core_->options.lock_timeout); lock.ok()) {
      block->staging.store(kNoVersion, std::memory_order_release);
    }
    return release(s.WithContext(what));
  };
  if (!spare.ok() && spare.status().code() != StatusCode::kNotFound) {
    SLUICE_LOG(WARNING) << "shm store " << control.names().control()
                        << ": not recycling the spare segment: " << spare.status().ToString();
  }

  const shm::Geometry& g = control.geometry();
  auto staging = std::make_unique<ShmPublishHandle::Staging>();
  const bool recycled = spare.ok();
  if (recycled) {
    staging->file = std::move(spare).value();
    Result<shm::FileStatus> status = staging->file.Stat();
    if (!status.ok()) {
      RemoveOwnSegment(staging->file, name);
      return unreserve(status.status());
    }
    {
      MutexLock lock(&core_->mu);
      staging->mapping = core_->idle_mappings.Take(*status, ShmAccess::kReadWrite);
    }
  } else {
    Result<shm::SegmentFd> created = shm::SegmentFd::Create(name, g.version_segment_bytes);
    if (created.status().code() == StatusCode::kAlreadyExists) {
      // An orphan of a crashed predecessor; the name is reserved for us now.
      (void)SharedMemorySegment::Unlink(name);
      created = shm::SegmentFd::Create(name, g.version_segment_bytes);
    }
    if (!created.ok()) return unreserve(created.status());
    staging->file = std::move(created).value();
    if (!staging->file.TryLockExclusive()) {  // only if a foreign process locked it meanwhile
      RemoveOwnSegment(staging->file, name);
      return unreserve(Status::Unavailable("cannot lock the fresh segment " + name));
    }
  }
  if (staging->mapping.data() == nullptr) {
    Result<shm::Mapping> mapped = shm::Mapping::Map(staging->file, g.version_segment_bytes);
    if (!mapped.ok()) {
      RemoveOwnSegment(staging->file, name);
      return unreserve(mapped.status());
    }
    staging->mapping = std::move(mapped).value();
  }

  // A recycled segment still holds the header of the version it was: it
  // becomes "being initialized" (magic 0) and unsealed before anything else.
  auto* header = recycled ? reinterpret_cast<shm::VersionHeader*>(staging->mapping.data())
                          : new (staging->mapping.data()) shm::VersionHeader();
  header->preamble.magic.store(0, std::memory_order_release);
  header->sealed.store(0, std::memory_order_release);
  header->layout_hash = control.layout_hash();
  header->version = version;
  header->num_tensors = static_cast<uint32_t>(g.tensor_bytes.size());
  header->data_offset = g.tensor_offsets.empty() ? g.version_segment_bytes : g.tensor_offsets[0];
  auto* records = reinterpret_cast<shm::TensorRecord*>(header + 1);
  for (size_t t = 0; t < g.tensor_bytes.size(); ++t) {
    records[t] = shm::TensorRecord{g.tensor_offsets[t], g.tensor_bytes[t], 0, 0};
  }
  header->preamble.protocol_version = shm::kProtocolVersion;
  header->preamble.segment_bytes = staging->mapping.size();
  header->preamble.magic.store(shm::kVersionMagic, std::memory_order_release);
  staging->header = header;
  staging->records = records;
  staging->put.assign(g.tensor_bytes.size(), false);
  staging->in_place.assign(g.tensor_bytes.size(), false);
  return std::unique_ptr<StagedWeights>(new ShmPublishHandle(core_, version, std::move(staging)));
}

Status ShmPublisher::Sweep() {
  SLUICE_ASSIGN_OR_RETURN(Control::Locked lock, core_->control->Lock(core_->options.lock_timeout));
  SLUICE_RETURN_IF_ERROR(core_->CheckOwner(lock, "cannot sweep"));
  core_->control->Repair(lock);
  return Status::Ok();
}

int64_t ShmPublisher::latest_version() const { return core_->control->block()->latest.load(std::memory_order_acquire); }

Result<ShmStoreStats> ShmPublisher::stats() const {
  SLUICE_ASSIGN_OR_RETURN(Control::Locked lock, core_->control->Lock(core_->options.lock_timeout));
  return core_->control->Stats(lock);
}

const Layout& ShmPublisher::layout() const { return core_->control->layout(); }
size_t ShmPublisher::version_bytes() const { return core_->version_bytes; }
const std::string& ShmPublisher::control_segment_name() const { return core_->control->names().control(); }

}  // namespace sluice::checkpoint_engine
