#include "shm/shm_control.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/layout_check.h"
#include "sluice/common/check.h"
#include "sluice/common/logging.h"

namespace sluice::checkpoint_engine::shm {

// ---------------------------------------------------------------- StoreNames

Result<StoreNames> StoreNames::Make(std::string_view prefix, std::string_view store) {
  SLUICE_RETURN_IF_ERROR(ValidateShmNameComponent(prefix, "shm_prefix"));
  SLUICE_RETURN_IF_ERROR(ValidateShmNameComponent(store, "store_name"));
  StoreNames names;
  names.prefix_ = prefix;
  names.store_ = store;
  names.control_ = ShmSegmentName({prefix, store, "control"});
  names.spare_ = ShmSegmentName({prefix, store, "spare"});
  return names;
}

std::string StoreNames::Version(int64_t version) const {
  // Appended, not `"v" + ...`: that trips a GCC 12 -Wrestrict false positive.
  std::string component = "v";
  component += std::to_string(version);
  return ShmSegmentName({prefix_, store_, component});
}

int64_t StoreNames::ParseVersion(std::string_view segment_name) const {
  const std::string head = ShmSegmentName({prefix_, store_}) + ".v";
  if (segment_name.size() <= head.size() || segment_name.substr(0, head.size()) != head) return kNoVersion;
  std::string_view digits = segment_name.substr(head.size());
  if (digits.size() > 18) return kNoVersion;
  int64_t v = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return kNoVersion;
    v = v * 10 + (c - '0');
  }
  return v;
}

Result<std::vector<std::string>> StoreNames::List() const { return ListShmSegments({prefix_, store_}); }

std::string DescribeLayoutDifference(const Layout& stored, const Layout& expected) {
  auto describe = [](const TensorSpec& s) {
    return Quoted(s.name) + " " + std::string(DTypeName(s.dtype)) + " " + ShapeToString(s.shape);
  };
  for (size_t i = 0; i < std::min(stored.size(), expected.size()); ++i) {
    const TensorSpec& a = stored[i];
    const TensorSpec& b = expected[i];
    if (a.name != b.name || a.dtype != b.dtype || a.shape != b.shape) {
      return "tensor " + std::to_string(i) + ": the store has " + describe(a) + ", expected " + describe(b);
    }
  }
  if (stored.size() != expected.size()) {
    return "the store has " + std::to_string(stored.size()) + " tensors, expected " + std::to_string(expected.size());
  }
  return "";
}

// ------------------------------------------------------------------ Control

Control::Locked::~Locked() {
  if (control_ != nullptr) control_->block_->mu.Unlock();
}

Result<std::unique_ptr<Control>> Control::Create(const StoreNames& names, const Layout& layout,
                                                 const std::vector<size_t>& tensor_bytes, size_t max_tensor_bytes,
                                                 uint32_t max_readers, uint32_t pins_per_reader,
                                                 bool recycle_segments) {
  const std::string blob = SerializeLayout(layout);
  Geometry g = ComputeGeometry(tensor_bytes, max_readers, pins_per_reader, blob.size());
  SLUICE_ASSIGN_OR_RETURN(SharedMemorySegment segment, SharedMemorySegment::Create(names.control(), g.control_bytes));
  // The segment is zero-filled; magic stays 0 (= "initializing") until every
  // other field is in place.
  auto* block = new (segment.data()) ControlBlock();
  block->header_bytes = sizeof(ControlBlock);
  block->max_readers = max_readers;
  block->pins_per_reader = pins_per_reader;
  block->version_entries = g.version_entries;
  block->num_tensors = static_cast<uint32_t>(layout.size());
  block->layout_blob_bytes = static_cast<uint32_t>(blob.size());
  block->layout_hash = LayoutHash(blob);
  block->max_tensor_bytes = max_tensor_bytes;
  block->version_segment_bytes = g.version_segment_bytes;
  block->entries_offset = g.entries_offset;
  block->slots_offset = g.slots_offset;
  block->slot_stride = g.slot_stride;
  block->layout_offset = g.layout_offset;
  std::memcpy(segment.data() + g.layout_offset, blob.data(), blob.size());
  Status init = block->mu.Init();
  if (!init.ok()) {
    (void)SharedMemorySegment::Unlink(names.control());
    return init;
  }
  block->latest.store(kNoVersion, std::memory_order_relaxed);
  block->staging.store(kNoVersion, std::memory_order_relaxed);
  auto control = std::unique_ptr<Control>(new Control(names, std::move(segment), std::move(g), layout));
  for (uint32_t i = 0; i < control->geometry_.version_entries; ++i) {
    new (control->entry(i)) VersionEntry();
    control->entry(i)->version.store(kNoVersion, std::memory_order_relaxed);
  }
  for (uint32_t i = 0; i < max_readers; ++i) {
    new (control->slot(i)) ReaderSlot();
    for (uint32_t p = 0; p < pins_per_reader; ++p) {
      new (&SlotPins(control->slot(i))[p]) std::atomic<int64_t>(kNoVersion);
    }
  }
  SetOwner(&block->publisher, control->self_);
  block->recycle_segments.store(recycle_segments ? 1 : 0, std::memory_order_relaxed);
  block->preamble.protocol_version = kProtocolVersion;
  block->preamble.segment_bytes = control->segment_.size();
  block->preamble.magic.store(kControlMagic, std::memory_order_release);
  return control;
}

Result<std::unique_ptr<Control>> Control::Open(const StoreNames& names) {
  SLUICE_ASSIGN_OR_RETURN(SharedMemorySegment segment,
                          SharedMemorySegment::Open(names.control(), ShmAccess::kReadWrite));
  const std::string what = "control segment " + names.control();
  SLUICE_RETURN_IF_ERROR(CheckPreamble(segment, kControlMagic, what));
  if (segment.size() < sizeof(ControlBlock)) {
    return Status::DataLoss(what + " is " + std::to_string(segment.size()) + " bytes, shorter than its " +
                            std::to_string(sizeof(ControlBlock)) + "-byte header");
  }
  const auto* block = reinterpret_cast<const ControlBlock*>(segment.data());
  if (block->header_bytes != sizeof(ControlBlock)) {
    return Status::FailedPrecondition(what + " has a " + std::to_string(block->header_bytes) +
                                      "-byte header; this build expects " + std::to_string(sizeof(ControlBlock)) +
                                      " (peers must be the same build)");
  }
  const auto inconsistent = [&](const std::string& why) { return Status::DataLoss(what + " is inconsistent: " + why); };
  if (block->max_readers < 1 || block->max_readers > 4096 || block->pins_per_reader < 1 ||
      block->pins_per_reader > 64) {
    return inconsistent("max_readers " + std::to_string(block->max_readers) + ", pins_per_reader " +
                        std::to_string(block->pins_per_reader));
  }
  if (block->layout_offset > segment.size() || block->layout_blob_bytes > segment.size() - block->layout_offset) {
    return inconsistent("layout at " + std::to_string(block->layout_offset) + "+" +
                        std::to_string(block->layout_blob_bytes) + " lies outside the segment");
  }
  const std::byte* blob = segment.data() + block->layout_offset;
  Result<Layout> parsed = ParseLayout(blob, block->layout_blob_bytes, block->num_tensors);
  if (!parsed.ok()) return parsed.status().WithContext(what);
  Layout layout = std::move(parsed).value();
  const std::string blob_copy(reinterpret_cast<const char*>(blob), block->layout_blob_bytes);
  if (LayoutHash(blob_copy) != block->layout_hash) return inconsistent("the layout does not match its hash");
  Result<std::vector<size_t>> bytes = internal::ValidateLayout(layout, block->max_tensor_bytes, "stored layout");
  if (!bytes.ok()) return inconsistent(bytes.status().message());
  Geometry g = ComputeGeometry(*bytes, block->max_readers, block->pins_per_reader, block->layout_blob_bytes);
  if (g.version_entries != block->version_entries || g.entries_offset != block->entries_offset ||
      g.slots_offset != block->slots_offset || g.slot_stride != block->slot_stride ||
      g.layout_offset != block->layout_offset || g.control_bytes != segment.size() ||
      g.version_segment_bytes != block->version_segment_bytes) {
    return inconsistent("its geometry does not match its layout and limits");
  }
  return std::unique_ptr<Control>(new Control(names, std::move(segment), std::move(g), std::move(layout)));
}

Result<Control::Locked> Control::Lock(std::chrono::milliseconds timeout) {
  Result<ShmMutex::Locked> locked = block_->mu.Lock(timeout);
  if (!locked.ok()) return locked.status().WithContext("store " + names_.control());
  Locked guard(this);
  if (locked->previous_owner_died) {
    SLUICE_LOG(WARNING) << "shm store " << names_.control()
                        << ": a process died holding the control lock; repairing the shared state";
    block_->recoveries.fetch_add(1, std::memory_order_relaxed);
    Repair(guard);
  }
  return guard;
}

VersionEntry* Control::entry(uint32_t i) const {
  return reinterpret_cast<VersionEntry*>(segment_.data() + geometry_.entries_offset) + i;
}

ReaderSlot* Control::slot(uint32_t i) const {
  return reinterpret_cast<ReaderSlot*>(segment_.data() + geometry_.slots_offset + i * geometry_.slot_stride);
}

ProcessIdentity Control::Owner(const ProcessRecord& record) {
  ProcessIdentity id;
  id.pid = record.pid.load(std::memory_order_acquire);
  id.start_time = record.start_time.load(std::memory_order_relaxed);
  return id;
}

void Control::SetOwner(ProcessRecord* record, const ProcessIdentity& id) {
  // start_time first: a record whose pid is set always has its start time.
  record->start_time.store(id.start_time, std::memory_order_release);
  record->pid.store(id.pid, std::memory_order_release);
}

VersionEntry* Control::FindEntry(const Locked&, int64_t version) const {
  if (version == kNoVersion) return nullptr;
  for (uint32_t i = 0; i < geometry_.version_entries; ++i) {
    if (entry(i)->version.load(std::memory_order_acquire) == version) return entry(i);
  }
  return nullptr;
}

VersionEntry* Control::FreeEntryOrNull(const Locked&) const {
  for (uint32_t i = 0; i < geometry_.version_entries; ++i) {
    if (entry(i)->version.load(std::memory_order_acquire) == kNoVersion) return entry(i);
  }
  return nullptr;
}

bool Control::IsPinned(const Locked&, int64_t version) const {
  for (uint32_t i = 0; i < geometry_.max_readers; ++i) {
    ReaderSlot* s = slot(i);
    if (s->owner.pid.load(std::memory_order_acquire) == 0) continue;
    for (uint32_t p = 0; p < geometry_.pins_per_reader; ++p) {
      if (SlotPins(s)[p].load(std::memory_order_acquire) == version) return true;
    }
  }
  return false;
}

void Control::UnlinkQuietly(const std::string& name) const {
  Status s = SharedMemorySegment::Unlink(name);
  if (!s.ok() && s.code() != StatusCode::kNotFound) {
    SLUICE_LOG(WARNING) << "shm store " << names_.control() << ": " << s.ToString();
  }
}

void Control::FreeVersion(const Locked& lock, VersionEntry* e) {
  const int64_t version = e->version.load(std::memory_order_acquire);
  if (version == kNoVersion) return;
  // Entry first: a crash before the segment is retired leaves an orphan name
  // that the repair scan removes, never an entry without its segment; and no
  // reader can pin the version from here on.
  e->version.store(kNoVersion, std::memory_order_release);
  RetireSegment(lock, names_.Version(version), /*may_park=*/true);
}

bool Control::RetireSegment(const Locked& lock, const std::string& name, bool may_park) {
  Result<SegmentFd> fd = SegmentFd::Open(name, ShmAccess::kReadWrite);
  if (!fd.ok()) {
    if (fd.status().code() != StatusCode::kNotFound) UnlinkQuietly(name);
    return false;
  }
  if (!fd->TryLockExclusive()) {
    // Only a process reading it outside the protocol's pins holds a flock on
    // a segment nobody pins: never rewrite or truncate it under that reader.
    SLUICE_LOG(WARNING) << "shm store " << names_.control() << ": segment " << name
                        << " is still locked by a reader that holds no pin on it; unlinking it without reuse";
    UnlinkQuietly(name);
    return false;
  }
  if (may_park && CanPark(lock)) {
    Result<FileStatus> status = fd->Stat();
    if (status.ok() && status->size == geometry_.version_segment_bytes && status->allocated >= status->size) {
      Status renamed = RenameSegment(name, names_.spare());
      if (renamed.ok()) return true;
      SLUICE_LOG(WARNING) << "shm store " << names_.control() << ": " << renamed.ToString();
    }
  }
  // Freed: its pages go now, including from mappings other processes keep
  // idle (a crash before the unlink leaves an empty orphan for the repair).
  if (Status truncated = fd->Truncate(); !truncated.ok()) {
    SLUICE_LOG(WARNING) << "shm store " << names_.control() << ": " << truncated.ToString();
  }
  UnlinkQuietly(name);
  return false;
}

bool Control::CanPark(const Locked&) const {
  return block_->recycle_segments.load(std::memory_order_acquire) == 1 &&
         block_->destroyed.load(std::memory_order_acquire) == 0 &&
         block_->publisher.pid.load(std::memory_order_acquire) != 0 &&
         block_->staging.load(std::memory_order_acquire) == kNoVersion &&
         SegmentSize(names_.spare()).status().code() == StatusCode::kNotFound;
}

size_t Control::SpareBytes(const Locked&) const {
  Result<size_t> size = SegmentSize(names_.spare());
  return size.ok() ? *size : 0;
}

Result<SegmentFd> Control::TakeSpare(const Locked& lock, const std::string& name) {
  Status renamed = RenameSegment(names_.spare(), name);
  if (renamed.code() == StatusCode::kAlreadyExists) {
    // An orphan of a crashed predecessor under the staging name, which is
    // reserved for us now.
    RetireSegment(lock, name, /*may_park=*/false);
    renamed = RenameSegment(names_.spare(), name);
  }
  if (!renamed.ok()) {
    // A spare that cannot be staged into must not stay next to the fresh
    // staging segment the caller creates instead (the memory bound).
    if (renamed.code() != StatusCode::kNotFound) RemoveSpare(lock);
    return renamed;
  }
  Result<SegmentFd> fd = SegmentFd::Open(name, ShmAccess::kReadWrite);
  if (!fd.ok()) {
    UnlinkQuietly(name);
    return fd.status();
  }
  if (!fd->TryLockExclusive()) {
    UnlinkQuietly(name);  // someone reads it outside the protocol: leave its bytes alone
    return Status::FailedPrecondition("the spare segment is locked by another process");
  }
  Result<FileStatus> status = fd->Stat();
  if (!status.ok() || status->size != geometry_.version_segment_bytes || status->allocated < status->size) {
    (void)fd->Truncate();
    UnlinkQuietly(name);
    return Status::DataLoss(
        "the spare segment is not a whole segment of this store (" +
        (status.ok() ? std::to_string(status->size) + " bytes, " + std::to_string(status->allocated) + " allocated"
                     : status.status().ToString()) +
        "; expected " + std::to_string(geometry_.version_segment_bytes) + ")");
  }
  block_->segments_recycled.fetch_add(1, std::memory_order_relaxed);
  return fd;
}

void Control::RemoveSpare(const Locked& lock) {
  if (SegmentSize(names_.spare()).status().code() != StatusCode::kNotFound) {
    RetireSegment(lock, names_.spare(), /*may_park=*/false);
  }
}

void Control::FreeIfUnreachable(const Locked& lock, int64_t version) {
  if (version == kNoVersion || version >= block_->latest.load(std::memory_order_acquire)) return;
  if (IsPinned(lock, version)) return;
  if (VersionEntry* e = FindEntry(lock, version)) FreeVersion(lock, e);
}

void Control::Collect(const Locked& lock) {
  // 1. Readers that are gone lose their slot and with it their pins.
  for (uint32_t i = 0; i < geometry_.max_readers; ++i) {
    ReaderSlot* s = slot(i);
    const ProcessIdentity owner = Owner(s->owner);
    if (owner.pid == 0 || owner == self_ || IsProcessAlive(owner)) continue;
    SLUICE_LOG(INFO) << "shm store " << names_.control() << ": reclaiming reader slot " << i << " of dead pid "
                     << owner.pid;
    for (uint32_t p = 0; p < geometry_.pins_per_reader; ++p) {
      SlotPins(s)[p].store(kNoVersion, std::memory_order_release);
    }
    s->owner.pid.store(0, std::memory_order_release);
    s->owner.start_time.store(0, std::memory_order_relaxed);
  }

  // 2. A dead publisher is retired; its staging is dropped, or, if it died
  //    after making the staged version the latest, the commit is finished.
  const ProcessIdentity publisher = Owner(block_->publisher);
  if (publisher.pid != 0 && publisher != self_ && !IsProcessAlive(publisher)) {
    SLUICE_LOG(WARNING) << "shm store " << names_.control() << ": publisher pid " << publisher.pid
                        << " is dead; retiring it";
    block_->publisher.pid.store(0, std::memory_order_release);
    block_->recoveries.fetch_add(1, std::memory_order_relaxed);
  }
  const int64_t latest = block_->latest.load(std::memory_order_acquire);
  const int64_t staging = block_->staging.load(std::memory_order_acquire);
  if (staging != kNoVersion && block_->publisher.pid.load(std::memory_order_acquire) == 0) {
    if (staging != latest) {
      if (VersionEntry* e = FindEntry(lock, staging)) {
        FreeVersion(lock, e);
      } else {
        RetireSegment(lock, names_.Version(staging), /*may_park=*/false);
      }
      block_->aborts.fetch_add(1, std::memory_order_relaxed);
    }
    block_->staging.store(kNoVersion, std::memory_order_release);
  }
  // The spare is kept only for a live publisher that recycles.
  if (block_->publisher.pid.load(std::memory_order_acquire) == 0 ||
      block_->recycle_segments.load(std::memory_order_acquire) == 0) {
    RemoveSpare(lock);
  }

  // 3. An entry above latest is a commit that died inside its critical
  //    section: it never became visible, so it is rolled back. 4. Superseded
  //    versions nobody pins are freed.
  for (uint32_t i = 0; i < geometry_.version_entries; ++i) {
    VersionEntry* e = entry(i);
    const int64_t v = e->version.load(std::memory_order_acquire);
    if (v == kNoVersion || v == latest) continue;
    if (v > latest) {
      SLUICE_LOG(WARNING) << "shm store " << names_.control() << ": rolling back unfinished commit of version " << v;
      FreeVersion(lock, e);
    } else if (!IsPinned(lock, v)) {
      FreeVersion(lock, e);
    }
  }
}

void Control::Repair(const Locked& lock) {
  Collect(lock);
  Result<std::vector<std::string>> segments = names_.List();
  if (!segments.ok()) {
    SLUICE_LOG(WARNING) << "shm store " << names_.control()
                        << ": cannot scan for orphans: " << segments.status().ToString();
    return;
  }
  const int64_t staging = block_->staging.load(std::memory_order_acquire);
  for (const std::string& name : *segments) {
    const int64_t v = names_.ParseVersion(name);
    if (v == kNoVersion || v == staging || FindEntry(lock, v) != nullptr) continue;
    SLUICE_LOG(INFO) << "shm store " << names_.control() << ": unlinking orphaned segment " << name;
    RetireSegment(lock, name, /*may_park=*/false);
  }
}

bool Control::HasLiveParticipant(const Locked&) const {
  const ProcessIdentity publisher = Owner(block_->publisher);
  if (publisher.pid != 0 && (publisher == self_ || IsProcessAlive(publisher))) return true;
  for (uint32_t i = 0; i < geometry_.max_readers; ++i) {
    const ProcessIdentity owner = Owner(slot(i)->owner);
    if (owner.pid != 0 && (owner == self_ || IsProcessAlive(owner))) return true;
  }
  return false;
}

void Control::Destroy(const Locked& lock) {
  block_->destroyed.store(1, std::memory_order_release);
  for (uint32_t i = 0; i < geometry_.version_entries; ++i) FreeVersion(lock, entry(i));
  const int64_t staging = block_->staging.exchange(kNoVersion, std::memory_order_acq_rel);
  if (staging != kNoVersion) RetireSegment(lock, names_.Version(staging), /*may_park=*/false);
  if (Result<std::vector<std::string>> segments = names_.List(); segments.ok()) {
    for (const std::string& name : *segments) {
      if (name != names_.control()) RetireSegment(lock, name, /*may_park=*/false);
    }
  }
  UnlinkQuietly(names_.control());
}

ShmStoreStats Control::Stats(const Locked& lock) const {
  ShmStoreStats s;
  VersionStoreStats& v = s.versions;
  v.latest_version = block_->latest.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < geometry_.version_entries; ++i) {
    const int64_t version = entry(i)->version.load(std::memory_order_acquire);
    if (version != kNoVersion) v.versions_in_memory.push_back(version);
  }
  std::sort(v.versions_in_memory.begin(), v.versions_in_memory.end());
  std::vector<int64_t> pins;
  for (uint32_t i = 0; i < geometry_.max_readers; ++i) {
    ReaderSlot* slot_i = slot(i);
    const ProcessIdentity owner = Owner(slot_i->owner);
    if (owner.pid == 0) continue;
    ++s.readers_attached;
    if (owner != self_ && !IsProcessAlive(owner)) ++s.dead_readers;
    std::vector<int64_t> mine;  // a slot counts once per version
    for (uint32_t p = 0; p < geometry_.pins_per_reader; ++p) {
      const int64_t pinned = SlotPins(slot_i)[p].load(std::memory_order_acquire);
      if (pinned != kNoVersion && std::find(mine.begin(), mine.end(), pinned) == mine.end()) mine.push_back(pinned);
    }
    pins.insert(pins.end(), mine.begin(), mine.end());
  }
  std::sort(pins.begin(), pins.end());
  for (size_t i = 0; i < pins.size();) {
    size_t j = i;
    while (j < pins.size() && pins[j] == pins[i]) ++j;
    v.pinned.push_back({pins[i], static_cast<int64_t>(j - i)});
    i = j;
  }
  v.staging_version = block_->staging.load(std::memory_order_acquire);
  s.version_segment_bytes = geometry_.version_segment_bytes;
  s.control_segment_bytes = segment_.size();
  v.committed_bytes = v.versions_in_memory.size() * s.version_segment_bytes;
  v.staging_bytes = v.staging_version != kNoVersion ? s.version_segment_bytes : 0;
  v.spare_bytes = SpareBytes(lock);
  v.bytes_held = v.committed_bytes + v.staging_bytes + v.spare_bytes;
  v.max_versions_in_memory = v.pinned.size() + 2;
  v.max_bytes_held = v.max_versions_in_memory * s.version_segment_bytes;
  v.commits = block_->commits.load(std::memory_order_relaxed);
  v.aborts = block_->aborts.load(std::memory_order_relaxed);
  s.publisher = Owner(block_->publisher);
  s.publisher_alive = s.publisher.pid != 0 && (s.publisher == self_ || IsProcessAlive(s.publisher));
  s.max_readers = geometry_.max_readers;
  s.max_pins_per_reader = geometry_.pins_per_reader;
  s.recoveries = block_->recoveries.load(std::memory_order_relaxed);
  s.recycle_segments = block_->recycle_segments.load(std::memory_order_acquire) == 1;
  s.segments_recycled = block_->segments_recycled.load(std::memory_order_relaxed);
  return s;
}

}  // namespace sluice::checkpoint_engine::shm
