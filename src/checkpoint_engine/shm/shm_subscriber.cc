// ShmSubscriber: a reader slot in a shared-memory store, the pins taken
// through it, and the read-only mappings they keep alive (protocol:
// shm_store.h).
#include <algorithm>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "core/checksum.h"
#include "core/layout_check.h"
#include "core/pin_views.h"
#include "shm/shm_control.h"
#include "shm/shm_format.h"
#include "shm/shm_segment_file.h"
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/common/check.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {
namespace shm {

// One pinned, mapped version. Shared by every ShmVersionHandle copy and
// tensor view; its destruction releases the segment's flock, keeps the
// mapping idle, then unpins.
struct MappedPin {
  std::shared_ptr<SubscriberCore> core;
  int64_t version = kNoVersion;
  uint32_t pin_index = 0;
  SegmentFd file;   // read-only; holds the segment's shared flock
  Mapping mapping;  // read-only
  const TensorRecord* records = nullptr;

  ~MappedPin();
};

// Idle mappings a subscriber keeps: enough for the few segments a recycling
// publisher cycles through (latest, spare, a version still pinned).
inline constexpr size_t kSubscriberIdleMappings = 4;

struct SubscriberCore : std::enable_shared_from_this<SubscriberCore> {
  ShmSubscriberOptions options;
  std::unique_ptr<Control> control;
  uint32_t slot_index = 0;
  std::map<std::string, size_t, std::less<>> index;  // tensor name -> layout position
  size_t version_bytes = 0;

  // Lock order: mu before the control lock.
  Mutex mu;
  struct Cached {
    std::weak_ptr<const MappedPin> weak;
    const MappedPin* raw = nullptr;  // identifies the entry without locking `weak`
  };
  std::map<int64_t, Cached> cache SLUICE_GUARDED_BY(mu);
  std::vector<bool> pin_used SLUICE_GUARDED_BY(mu);
  // Mappings of segments no longer pinned here, reused when a later version
  // is staged into the same (recycled) segment: no page faults then.
  MappingCache idle_mappings SLUICE_GUARDED_BY(mu){kSubscriberIdleMappings};

  ~SubscriberCore() { Detach(); }

  ReaderSlot* slot() const { return control->slot(slot_index); }

  // FailedPrecondition unless this attachment still owns its slot. Lock held.
  Status CheckAttached(const Control::Locked&, const std::string& what) const {
    if (control->block()->destroyed.load(std::memory_order_acquire) != 0) {
      return Status::FailedPrecondition(what + ": store " + control->names().control() + " was destroyed");
    }
    if (Control::Owner(slot()->owner) != control->self()) {
      return Status::FailedPrecondition(what + ": reader slot " + std::to_string(slot_index) + " of " +
                                        control->names().control() + " was taken from this process");
    }
    return Status::Ok();
  }

  // A live pin of `version` already held by this attachment, or null. Never
  // drops a reference under mu (that could run ~MappedPin, which takes mu).
  std::shared_ptr<const MappedPin> CachedLocked(int64_t version) SLUICE_REQUIRES(mu) {
    auto it = cache.find(version);
    return it == cache.end() ? nullptr : it->second.weak.lock();
  }

  // Pins `version`, or the latest when nullopt.
  Result<ShmVersionHandle> Pin(std::optional<int64_t> version);
  // Validates a mapped version segment (named `name`).
  Status CheckSegment(const Mapping& mapping, const std::string& name, int64_t version) const;
  void Unpin(MappedPin* pinned);
  void Detach();
};

MappedPin::~MappedPin() { core->Unpin(this); }

Status SubscriberCore::CheckSegment(const Mapping& mapping, const std::string& name, int64_t version) const {
  const std::string what = "version segment " + name;
  SLUICE_RETURN_IF_ERROR(CheckPreamble(mapping.data(), mapping.size(), kVersionMagic, what));
  const Geometry& g = control->geometry();
  if (mapping.size() != g.version_segment_bytes) {
    return Status::DataLoss(what + " is " + std::to_string(mapping.size()) + " bytes; this store's versions are " +
                            std::to_string(g.version_segment_bytes));
  }
  const auto* header = reinterpret_cast<const VersionHeader*>(mapping.data());
  if (header->layout_hash != control->layout_hash() || header->version != version ||
      header->num_tensors != g.tensor_bytes.size()) {
    return Status::DataLoss(what + " does not hold version " + std::to_string(version) + " of this layout (it says " +
                            "version " + std::to_string(header->version) + ", " + std::to_string(header->num_tensors) +
                            " tensors)");
  }
  const auto* records = reinterpret_cast<const TensorRecord*>(header + 1);
  for (size_t t = 0; t < g.tensor_bytes.size(); ++t) {
    if (records[t].offset != g.tensor_offsets[t] || records[t].nbytes != g.tensor_bytes[t]) {
      return Status::DataLoss(what + ": record of tensor " + Quoted(control->layout()[t].name) + " says " +
                              std::to_string(records[t].nbytes) + " bytes at " + std::to_string(records[t].offset) +
                              ", the layout puts " + std::to_string(g.tensor_bytes[t]) + " at " +
                              std::to_string(g.tensor_offsets[t]));
    }
  }
  if (header->sealed.load(std::memory_order_acquire) != 1) {
    return Status::DataLoss(what + " is committed but not sealed (its checksums were never verified)");
  }
  return Status::Ok();
}

Result<ShmVersionHandle> SubscriberCore::Pin(std::optional<int64_t> version) {
  MutexLock lock(&mu);
  ControlBlock* block = control->block();
  // Fast path, no control lock: a version this attachment already pins is
  // live for as long as the pin.
  const int64_t wanted = version.value_or(block->latest.load(std::memory_order_acquire));
  if (auto pinned = CachedLocked(wanted)) return ShmVersionHandle(std::move(pinned));

  auto free_pin = std::find(pin_used.begin(), pin_used.end(), false);
  if (free_pin == pin_used.end()) {
    std::string held;
    for (const auto& [v, c] : cache) held += (held.empty() ? "" : ", ") + std::to_string(v);
    return Status::ResourceExhausted("this subscriber already pins " + std::to_string(pin_used.size()) +
                                     " versions (max_pins_per_reader of " + control->names().control() + "): " + held +
                                     "; release a handle first");
  }
  const uint32_t pin_index = static_cast<uint32_t>(free_pin - pin_used.begin());

  int64_t resolved = kNoVersion;
  {
    const std::string what =
        version ? "cannot pin version " + std::to_string(*version) : "cannot pin the latest version";
    SLUICE_ASSIGN_OR_RETURN(Control::Locked control_lock, control->Lock(options.lock_timeout));
    SLUICE_RETURN_IF_ERROR(CheckAttached(control_lock, what));
    const int64_t latest = block->latest.load(std::memory_order_acquire);
    resolved = version.value_or(latest);
    if (resolved == kNoVersion)
      return Status::NotFound("no version has been committed yet to " + control->names().control());
    if (control->FindEntry(control_lock, resolved) == nullptr) {
      return Status::NotFound("version " + std::to_string(resolved) + " is not in shared memory (never committed, " +
                              "or superseded and freed); latest is " + std::to_string(latest));
    }
    if (auto pinned = CachedLocked(resolved)) return ShmVersionHandle(std::move(pinned));
    // Registered while the entry is known live; the freer checks pins under
    // this same lock, so the segment cannot be unlinked from here on.
    SlotPins(slot())[pin_index].store(resolved, std::memory_order_release);
  }

  // The shared flock before anything is read: from then on no one rewrites
  // or truncates the segment, even if this slot's pins were reclaimed.
  const std::string name = control->names().Version(resolved);
  Result<SegmentFd> file = SegmentFd::Open(name, ShmAccess::kReadOnly);
  Status checked = file.status();
  if (checked.ok() && !file->TryLockShared()) {
    checked = Status::Unavailable("segment " + name + " is locked by a process rewriting it");
  }
  Mapping mapping;
  if (checked.ok()) {
    Result<FileStatus> status = file->Stat();
    checked = status.status();
    if (checked.ok()) mapping = idle_mappings.Take(*status, ShmAccess::kReadOnly);
    if (checked.ok() && mapping.data() == nullptr && status->size > 0) {
      Result<Mapping> mapped = Mapping::Map(*file, status->size);
      checked = mapped.status();
      if (mapped.ok()) mapping = std::move(mapped).value();
    }
  }
  if (checked.ok()) checked = CheckSegment(mapping, name, resolved);
  if (!checked.ok()) {
    mapping.Reset();
    if (file.ok()) file->Close();
    if (Result<Control::Locked> control_lock = control->Lock(options.lock_timeout); control_lock.ok()) {
      SlotPins(slot())[pin_index].store(kNoVersion, std::memory_order_release);
      control->FreeIfUnreachable(*control_lock, resolved);
    }
    // A pinned committed version whose segment is gone or malformed was
    // damaged from outside the protocol.
    return Status::DataLoss("cannot map version " + std::to_string(resolved) + ": " + checked.message());
  }
  auto pinned = std::make_shared<MappedPin>();
  pinned->core = shared_from_this();
  pinned->version = resolved;
  pinned->pin_index = pin_index;
  pinned->file = std::move(file).value();
  pinned->mapping = std::move(mapping);
  pinned->records =
      reinterpret_cast<const TensorRecord*>(reinterpret_cast<const VersionHeader*>(pinned->mapping.data()) + 1);
  pin_used[pin_index] = true;
  cache[resolved] = Cached{pinned, pinned.get()};
  return ShmVersionHandle(std::move(pinned));
}

void SubscriberCore::Unpin(MappedPin* pinned) {
  MutexLock lock(&mu);
  // The flock goes before the pin, so that whoever frees the version (this
  // process, below, or another) may recycle its segment. The mapping stays,
  // idle: a freed segment is truncated, so it holds no memory the store does
  // not count, and a recycled one is mapped already when it comes back.
  pinned->file.Unlock();
  idle_mappings.Put(std::move(pinned->file), std::move(pinned->mapping));
  auto it = cache.find(pinned->version);
  if (it != cache.end() && it->second.raw == pinned) cache.erase(it);
  pin_used[pinned->pin_index] = false;
  Result<Control::Locked> control_lock = control->Lock(options.lock_timeout);
  if (!control_lock.ok()) {
    // The pin stays recorded until this process detaches or dies; the
    // version stays in memory (and in the bound) until then.
    SLUICE_LOG(WARNING) << "cannot release the pin of version " << pinned->version << ": "
                        << control_lock.status().ToString();
    return;
  }
  if (Control::Owner(slot()->owner) != control->self()) return;
  SlotPins(slot())[pinned->pin_index].store(kNoVersion, std::memory_order_release);
  control->FreeIfUnreachable(*control_lock, pinned->version);
}

void SubscriberCore::Detach() {
  Result<Control::Locked> lock = control->Lock(options.lock_timeout);
  if (!lock.ok()) {
    SLUICE_LOG(WARNING) << "cannot detach reader slot " << slot_index << " cleanly: " << lock.status().ToString()
                        << "; it is reclaimed once this process exits";
    return;
  }
  if (control->block()->destroyed.load(std::memory_order_acquire) != 0) return;
  if (Control::Owner(slot()->owner) == control->self()) {
    for (uint32_t p = 0; p < control->geometry().pins_per_reader; ++p) {
      SlotPins(slot())[p].store(kNoVersion, std::memory_order_release);
    }
    slot()->owner.pid.store(0, std::memory_order_release);
  }
  control->Collect(*lock);
  if (!control->HasLiveParticipant(*lock)) control->Destroy(*lock);
}

}  // namespace shm

using shm::Control;
using shm::ControlBlock;
using shm::MappedPin;
using shm::SubscriberCore;
using sluice::Quoted;

// ----------------------------------------------------------- ShmVersionHandle

int64_t ShmVersionHandle::version() const { return pinned_ ? pinned_->version : kNoVersion; }

namespace {

// Layout position of `name` in the handle's store, or an error.
Result<size_t> FindTensor(const MappedPin* pinned, std::string_view name, const char* op) {
  if (pinned == nullptr) {
    return Status::FailedPrecondition(std::string(op) + "(" + Quoted(name) + ") on an empty ShmVersionHandle");
  }
  auto it = pinned->core->index.find(name);
  if (it == pinned->core->index.end()) {
    return Status::NotFound("version " + std::to_string(pinned->version) + " has no tensor " + Quoted(name));
  }
  return it->second;
}

// OK if `now` is the checksum recorded for tensor t; DataLoss otherwise.
Status CheckSum(const MappedPin& pinned, size_t t, uint64_t now) {
  const shm::TensorRecord& r = pinned.records[t];
  if (now == r.checksum) return Status::Ok();
  std::ostringstream msg;
  msg << "version " << pinned.version << ": tensor " << Quoted(pinned.core->control->layout()[t].name)
      << " does not match its checksum (0x" << std::hex << r.checksum << " recorded, 0x" << now << " read)";
  return Status::DataLoss(msg.str());
}

// Copies tensor t into `destination` (its exact size); with verify_copies,
// checksums the copy in the same pass (each block hashed from the
// destination while it is in cache) and checks it.
Status CopyOne(const MappedPin& pinned, size_t t, std::span<std::byte> destination) {
  const shm::TensorRecord& r = pinned.records[t];
  const std::byte* source = pinned.mapping.data() + r.offset;
  if (!pinned.core->options.verify_copies) {
    if (r.nbytes > 0) std::memcpy(destination.data(), source, r.nbytes);
    return Status::Ok();
  }
  return CheckSum(pinned, t, CopyAndChecksum64(destination.data(), source, r.nbytes));
}

}  // namespace

Result<HostTensor> ShmVersionHandle::tensor(std::string_view name) const {
  SLUICE_ASSIGN_OR_RETURN(size_t t, FindTensor(pinned_.get(), name, "tensor"));
  const TensorSpec& spec = pinned_->core->control->layout()[t];
  HostTensor view;
  view.dtype = spec.dtype;
  view.shape = spec.shape;
  view.data = pinned_->mapping.data() + pinned_->records[t].offset;
  view.nbytes = pinned_->records[t].nbytes;
  view.owner = pinned_;  // the view keeps the mapping and the pin
  return view;
}

Result<uint64_t> ShmVersionHandle::checksum(std::string_view name) const {
  SLUICE_ASSIGN_OR_RETURN(size_t t, FindTensor(pinned_.get(), name, "checksum"));
  return pinned_->records[t].checksum;
}

Status ShmVersionHandle::Verify() const {
  if (pinned_ == nullptr) return Status::FailedPrecondition("Verify() on an empty ShmVersionHandle");
  for (size_t t = 0; t < pinned_->core->control->layout().size(); ++t) {
    const shm::TensorRecord& r = pinned_->records[t];
    SLUICE_RETURN_IF_ERROR(CheckSum(*pinned_, t, Checksum64(pinned_->mapping.data() + r.offset, r.nbytes)));
  }
  return Status::Ok();
}

Status ShmVersionHandle::CopyTo(std::span<const std::span<std::byte>> destinations) const {
  if (pinned_ == nullptr) return Status::FailedPrecondition("CopyTo() on an empty ShmVersionHandle");
  const Layout& layout = pinned_->core->control->layout();
  if (destinations.size() != layout.size()) {
    return Status::InvalidArgument("CopyTo got " + std::to_string(destinations.size()) +
                                   " destinations; the layout has " + std::to_string(layout.size()) + " tensors");
  }
  for (size_t t = 0; t < layout.size(); ++t) {
    if (destinations[t].size() != pinned_->records[t].nbytes) {
      return Status::InvalidArgument("CopyTo destination " + std::to_string(t) + " for tensor " +
                                     Quoted(layout[t].name) + " is " + std::to_string(destinations[t].size()) +
                                     " bytes, the tensor is " + std::to_string(pinned_->records[t].nbytes));
    }
  }
  for (size_t t = 0; t < layout.size(); ++t) SLUICE_RETURN_IF_ERROR(CopyOne(*pinned_, t, destinations[t]));
  return Status::Ok();
}

Status ShmVersionHandle::CopyTensorTo(std::string_view name, std::span<std::byte> destination) const {
  SLUICE_ASSIGN_OR_RETURN(size_t t, FindTensor(pinned_.get(), name, "CopyTensorTo"));
  const shm::TensorRecord& r = pinned_->records[t];
  if (destination.size() != r.nbytes) {
    return Status::InvalidArgument("CopyTensorTo destination for tensor " + Quoted(name) + " is " +
                                   std::to_string(destination.size()) + " bytes, the tensor is " +
                                   std::to_string(r.nbytes));
  }
  return CopyOne(*pinned_, t, destination);
}

// -------------------------------------------------------------- ShmSubscriber

Result<std::unique_ptr<ShmSubscriber>> ShmSubscriber::Attach(ShmSubscriberOptions options) {
  SLUICE_ASSIGN_OR_RETURN(shm::StoreNames names, shm::StoreNames::Make(options.shm_prefix, options.store_name));
  if (options.expected_layout) {
    SLUICE_RETURN_IF_ERROR(
        internal::ValidateLayout(*options.expected_layout, ~size_t{0}, "ShmSubscriberOptions.expected_layout")
            .status());
  }
  const std::string what = "cannot attach a subscriber to store " + names.control();
  const auto deadline = std::chrono::steady_clock::now() + options.attach_timeout;
  std::unique_ptr<Control> control;
  uint32_t slot_index = 0;
  for (int attempt = 0; control == nullptr; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    Result<std::unique_ptr<Control>> opened = Control::Open(names);
    Status retryable;
    if (opened.ok()) {
      const std::string diff =
          options.expected_layout ? shm::DescribeLayoutDifference((*opened)->layout(), *options.expected_layout) : "";
      if (!diff.empty()) return Status::FailedPrecondition(what + ": its layout differs (" + diff + ")");
      SLUICE_ASSIGN_OR_RETURN(Control::Locked lock, (*opened)->Lock(options.lock_timeout));
      ControlBlock* block = (*opened)->block();
      if (block->destroyed.load(std::memory_order_acquire) != 0) {
        retryable = Status::NotFound("it is being torn down");
      } else {
        (*opened)->Collect(lock);
        const uint32_t slots = (*opened)->geometry().max_readers;
        uint32_t i = 0;
        while (i < slots && (*opened)->slot(i)->owner.pid.load(std::memory_order_acquire) != 0) ++i;
        if (i == slots) {
          return Status::ResourceExhausted(what + ": all " + std::to_string(slots) +
                                           " reader slots are held by live processes");
        }
        shm::ReaderSlot* slot = (*opened)->slot(i);
        for (uint32_t p = 0; p < (*opened)->geometry().pins_per_reader; ++p) {
          shm::SlotPins(slot)[p].store(kNoVersion, std::memory_order_release);
        }
        Control::SetOwner(&slot->owner, (*opened)->self());
        slot_index = i;
      }
    } else {
      retryable = opened.status();
    }
    if (retryable.ok()) {
      control = std::move(opened).value();
      break;
    }
    const StatusCode code = retryable.code();
    if (code != StatusCode::kNotFound && code != StatusCode::kUnavailable) return retryable.WithContext(what);
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status(code, what + " within " + std::to_string(options.attach_timeout.count()) +
                              " ms: " + retryable.message() +
                              (code == StatusCode::kNotFound ? " (has a publisher attached?)" : ""));
    }
  }
  auto core = std::make_shared<SubscriberCore>();
  core->options = std::move(options);
  core->slot_index = slot_index;
  for (size_t t = 0; t < control->layout().size(); ++t) core->index.emplace(control->layout()[t].name, t);
  for (size_t n : control->geometry().tensor_bytes) core->version_bytes += n;
  {
    MutexLock lock(&core->mu);
    core->pin_used.assign(control->geometry().pins_per_reader, false);
  }
  core->control = std::move(control);
  return std::unique_ptr<ShmSubscriber>(new ShmSubscriber(std::move(core)));
}

ShmSubscriber::~ShmSubscriber() = default;

Result<ShmVersionHandle> ShmSubscriber::AcquireLatest() { return core_->Pin(std::nullopt); }

Result<ShmVersionHandle> ShmSubscriber::Acquire(int64_t version) {
  if (version < 0)
    return Status::NotFound("version " + std::to_string(version) + " does not exist (versions are >= 0)");
  return core_->Pin(version);
}

Result<ShmVersionHandle> ShmSubscriber::WaitForVersion(int64_t at_least, std::chrono::milliseconds timeout) {
  ControlBlock* block = core_->control->block();
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    const uint32_t seq = block->commit_seq.load(std::memory_order_acquire);
    const int64_t latest = block->latest.load(std::memory_order_acquire);
    if (latest != kNoVersion && latest >= at_least) return core_->Pin(std::nullopt);  // versions only increase
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      const ProcessIdentity publisher = Control::Owner(block->publisher);
      std::string who = publisher.pid == 0          ? "no publisher is attached"
                        : IsProcessAlive(publisher) ? "publisher pid " + std::to_string(publisher.pid) + " is alive"
                                                    : "publisher pid " + std::to_string(publisher.pid) + " is dead";
      return Status::Timeout("no version >= " + std::to_string(at_least) + " was committed to " +
                             core_->control->names().control() + " within " + std::to_string(timeout.count()) +
                             " ms; latest is " + std::to_string(latest) + "; " + who);
    }
    // A commit between the loads above and this wait changes commit_seq, so
    // the futex returns at once; slices bound any missed wake-up.
    ShmFutexWait(&block->commit_seq, seq,
                 std::min<std::chrono::nanoseconds>(deadline - now, std::chrono::milliseconds(50)));
  }
}

int64_t ShmSubscriber::latest_version() const {
  return core_->control->block()->latest.load(std::memory_order_acquire);
}

Result<ShmStoreStats> ShmSubscriber::stats() const {
  SLUICE_ASSIGN_OR_RETURN(Control::Locked lock, core_->control->Lock(core_->options.lock_timeout));
  return core_->control->Stats(lock);
}

Result<PinnedWeights> ShmSubscriber::PinLatest() {
  SLUICE_ASSIGN_OR_RETURN(ShmVersionHandle handle, AcquireLatest());
  return internal::PinViews(handle, layout());
}

Result<PinnedWeights> ShmSubscriber::WaitAndPin(int64_t at_least, std::chrono::milliseconds timeout) {
  SLUICE_ASSIGN_OR_RETURN(ShmVersionHandle handle, WaitForVersion(at_least, timeout));
  return internal::PinViews(handle, layout());
}

const Layout& ShmSubscriber::layout() const { return core_->control->layout(); }
size_t ShmSubscriber::version_bytes() const { return core_->version_bytes; }

// ----------------------------------------------------------- store-wide tools

Status SweepShmStore(std::string_view shm_prefix, std::string_view store_name, std::chrono::milliseconds lock_timeout) {
  SLUICE_ASSIGN_OR_RETURN(shm::StoreNames names, shm::StoreNames::Make(shm_prefix, store_name));
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Control> control, Control::Open(names));
  SLUICE_ASSIGN_OR_RETURN(Control::Locked lock, control->Lock(lock_timeout));
  if (control->block()->destroyed.load(std::memory_order_acquire) != 0) return Status::Ok();
  control->Repair(lock);
  if (!control->HasLiveParticipant(lock)) control->Destroy(lock);
  return Status::Ok();
}

Status DestroyShmStore(std::string_view shm_prefix, std::string_view store_name) {
  SLUICE_ASSIGN_OR_RETURN(shm::StoreNames names, shm::StoreNames::Make(shm_prefix, store_name));
  // Mark it destroyed first if it is a readable store, so no one attaches to
  // it again; a foreign or broken control segment is simply removed.
  if (Result<std::unique_ptr<Control>> control = Control::Open(names); control.ok()) {
    if (Result<Control::Locked> lock = (*control)->Lock(std::chrono::milliseconds(1000)); lock.ok()) {
      (*control)->Destroy(*lock);
    }
  }
  SLUICE_ASSIGN_OR_RETURN(std::vector<std::string> segments, names.List());
  for (const std::string& name : segments) {
    Status s = SharedMemorySegment::Unlink(name);
    if (!s.ok() && s.code() != StatusCode::kNotFound) return s;
  }
  return Status::Ok();
}

}  // namespace sluice::checkpoint_engine
