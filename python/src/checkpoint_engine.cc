// sluice._C.checkpoint_engine: the CheckpointEngine's two stores that stage
// versions themselves, for Python: the same-host shared-memory store
// (ShmPublisher / ShmSubscriber, shm_store.h) and the in-process VersionStore
// (version_store.h). This layer converts and calls; the API users see
// (state_dict checks, layouts from state_dicts, device copies, context
// managers) is python/sluice/checkpoint_engine.py.
//
// Publishing goes through the interface every store shares
// (TwoPhasePublisher / StagedWeights, weights.h); reading through each
// store's own pin handle, held in one Pinned type.
//
// Tensors. Put borrows a CPU contiguous torch tensor's bytes for the call
// (the store copies them into staging and checksums the copy). Tensors read
// are views of the pinned version's bytes (the read-only mapping of the
// segment, or the in-process store's buffer) whose owner holds the pin, so
// the version stays in memory while Python holds any of them.
//
// The GIL is released around every call into the stores (they take locks,
// wait, copy and checksum). Python objects, and torch tensors that Python
// may own, are touched and dropped only with it held.
//
// Closing. The store objects sit behind shared_ptrs that every call copies
// (with the GIL held, which serializes it against Close), so Close from one
// thread while another is inside a call leaves that call a live object; the
// store is detached when the last copy goes.
#include <ATen/ATen.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "bindings.h"
#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/checkpoint_engine/weights.h"
#include "tensors.h"

namespace sluice::python {
namespace {

namespace py = pybind11;
namespace ce = sluice::checkpoint_engine;
using std::chrono::milliseconds;

// Longest wait inside one released-GIL slice of WaitForVersion: between
// slices Python's signal handlers run (Ctrl-C interrupts a long wait).
constexpr milliseconds kWaitSlice{200};

// ---------------------------------------------------------------- layouts

// [(name, dtype name, [dims])] <-> Layout. The Python layer has validated
// names, dtypes and shapes; the stores validate the layout again.
ce::Layout ToLayout(const py::list& specs) {
  ce::Layout layout;
  layout.reserve(specs.size());
  for (py::handle h : specs) {
    py::tuple t = h.cast<py::tuple>();
    if (t.size() != 3) throw py::value_error("malformed tensor spec");
    layout.push_back(ce::TensorSpec{t[0].cast<std::string>(), ParseDType(t[1].cast<std::string>()),
                                    t[2].cast<std::vector<int64_t>>()});
  }
  return layout;
}

py::list FromLayout(const ce::Layout& layout) {
  py::list out;
  for (const ce::TensorSpec& s : layout) out.append(py::make_tuple(s.name, std::string(DTypeName(s.dtype)), s.shape));
  return out;
}

// ---------------------------------------------------------------- stats

py::dict FromStats(const ce::VersionStoreStats& s) {
  py::dict out;
  out["latest_version"] = s.latest_version;
  py::list pinned;
  for (const ce::PinnedVersion& p : s.pinned) pinned.append(py::make_tuple(p.version, p.pins));
  out["pinned"] = pinned;
  out["versions_in_memory"] = s.versions_in_memory;
  out["staging_version"] = s.staging_version;
  out["committed_bytes"] = s.committed_bytes;
  out["staging_bytes"] = s.staging_bytes;
  out["spare_bytes"] = s.spare_bytes;
  out["bytes_held"] = s.bytes_held;
  out["max_versions_in_memory"] = s.max_versions_in_memory;
  out["max_bytes_held"] = s.max_bytes_held;
  out["commits"] = s.commits;
  out["aborts"] = s.aborts;
  return out;
}

py::dict FromShmStats(const ce::ShmStoreStats& s) {
  py::dict out = FromStats(s.versions);
  out["version_segment_bytes"] = s.version_segment_bytes;
  out["control_segment_bytes"] = s.control_segment_bytes;
  out["publisher_pid"] = s.publisher.pid;
  out["publisher_alive"] = s.publisher_alive;
  out["readers_attached"] = s.readers_attached;
  out["dead_readers"] = s.dead_readers;
  out["max_readers"] = s.max_readers;
  out["max_pins_per_reader"] = s.max_pins_per_reader;
  out["recoveries"] = s.recoveries;
  out["recycle_segments"] = s.recycle_segments;
  out["segments_recycled"] = s.segments_recycled;
  return out;
}

// ---------------------------------------------------------------- tensors

// What makes a view of `t` wrong; the Python layer has already turned every
// caller mistake into a clear ValueError / TypeError naming the tensor.
DType CheckHostTensor(const at::Tensor& t, const std::string& name) {
  if (!t.defined()) throw py::type_error("tensor '" + name + "': undefined tensor");
  if (t.layout() != at::kStrided) throw py::type_error("tensor '" + name + "': only strided (dense) tensors");
  if (!t.device().is_cpu()) throw py::value_error("tensor '" + name + "': not on the CPU");
  if (!t.is_contiguous()) throw py::value_error("tensor '" + name + "': not contiguous");
  std::optional<DType> d = ToDType(t.scalar_type());
  if (!d)
    throw py::type_error("tensor '" + name + "': unsupported dtype " + std::string(c10::toString(t.scalar_type())));
  return *d;
}

// A non-owning HostTensor over t's bytes, valid while the caller holds t.
HostTensor Borrow(const at::Tensor& t, DType dtype) {
  HostTensor h;
  h.dtype = dtype;
  h.shape.assign(t.sizes().begin(), t.sizes().end());
  h.data = static_cast<const std::byte*>(t.data_ptr());
  h.nbytes = t.nbytes();
  return h;
}

Status Closed(const char* what) { return Status::Aborted(std::string(what) + " is closed"); }

// ---------------------------------------------------------------- staging

// One publish in progress (any store's StagedWeights). Python calls may come
// from several threads with the GIL released: SharedStagedWeights takes a
// lock for each.
class Staged {
 public:
  explicit Staged(std::unique_ptr<ce::StagedWeights> staged) : shared_(std::move(staged)) {}

  int64_t version() const { return shared_.version(); }

  void Put(const std::string& name, const at::Tensor& tensor) {
    const DType dtype = CheckHostTensor(tensor, name);
    HostTensor view = Borrow(tensor, dtype);
    py::gil_scoped_release release;
    ThrowIfError(shared_.Put(name, view));
  }

  // Commit's errors keep the publish open only where StagedWeights says so
  // (missing tensors, a lock timeout); publish() and the context manager in
  // the Python layer then abort it.
  void Commit() {
    py::gil_scoped_release release;
    ThrowIfError(shared_.Commit());
  }

  void Abort() {
    py::gil_scoped_release release;
    shared_.Abort();
  }

 private:
  ce::SharedStagedWeights shared_;
};

// ---------------------------------------------------------------- pins

// One pinned version of either store. Release drops this object's pin; the
// tensor views handed out hold their own.
class Pinned {
 public:
  using Handle = std::variant<ce::ShmVersionHandle, ce::VersionHandle>;

  Pinned(Handle handle, std::shared_ptr<const ce::Layout> layout)
      : version_(std::visit([](const auto& h) { return h.version(); }, handle)),
        layout_(std::move(layout)),
        handle_(std::move(handle)) {}

  int64_t version() const { return version_; }

  void Release() {
    std::optional<Handle> dropped;
    dropped.swap(handle_);
    py::gil_scoped_release release;  // unpinning takes the store's lock
    dropped.reset();
  }

  // [(name, view)] in layout order.
  py::list Tensors() {
    Handle h = Get();
    std::vector<HostTensor> views;
    {
      py::gil_scoped_release release;
      views.reserve(layout_->size());
      for (const ce::TensorSpec& spec : *layout_) {
        views.push_back(ValueOrThrow(std::visit([&](const auto& x) { return x.tensor(spec.name); }, h)));
      }
    }
    py::list out;
    for (size_t i = 0; i < views.size(); ++i) out.append(py::make_tuple((*layout_)[i].name, ViewOf(views[i])));
    return out;
  }

  uint64_t Checksum(const std::string& name) {
    Handle h = Get();
    return ValueOrThrow(std::visit([&](const auto& x) { return x.checksum(name); }, h));
  }

  void Verify() {
    Handle h = Get();
    py::gil_scoped_release release;
    ThrowIfError(std::visit([](const auto& x) { return x.Verify(); }, h));
  }

  // Copies tensors into [(name, destination)]: CPU, contiguous, the
  // tensor's dtype and shape (the Python layer checked; checked again
  // here). The shared-memory store re-checksums each copy when its
  // subscriber verifies copies; the in-process store copies plainly.
  void CopyInto(const py::list& destinations) {
    Handle h = Get();
    std::vector<std::pair<std::string, at::Tensor>> dst;
    dst.reserve(destinations.size());
    for (py::handle item : destinations) {
      py::tuple t = item.cast<py::tuple>();
      dst.emplace_back(t[0].cast<std::string>(), t[1].cast<at::Tensor>());
    }
    for (auto& [name, tensor] : dst) {
      const ce::TensorSpec* spec = Find(name);
      if (spec == nullptr) throw py::value_error("tensor '" + name + "' is not in the layout");
      const DType dtype = CheckHostTensor(tensor, name);
      if (dtype != spec->dtype || std::vector<int64_t>(tensor.sizes().begin(), tensor.sizes().end()) != spec->shape) {
        throw py::value_error("tensor '" + name + "': destination is " + std::string(DTypeName(dtype)) + " " +
                              ShapeToString({tensor.sizes().begin(), tensor.sizes().end()}) + ", the version holds " +
                              std::string(DTypeName(spec->dtype)) + " " + ShapeToString(spec->shape));
      }
    }
    py::gil_scoped_release release;
    for (auto& [name, tensor] : dst) {
      std::span<std::byte> out(static_cast<std::byte*>(tensor.data_ptr()), tensor.nbytes());
      ThrowIfError(std::visit([&](const auto& x) { return CopyOne(x, name, out); }, h));
    }
  }

 private:
  Handle Get() const {
    if (!handle_)
      throw StatusError(Status::FailedPrecondition("version " + std::to_string(version_) + " was released"));
    return *handle_;
  }

  const ce::TensorSpec* Find(const std::string& name) const {
    auto it = std::find_if(layout_->begin(), layout_->end(), [&](const ce::TensorSpec& s) { return s.name == name; });
    return it == layout_->end() ? nullptr : &*it;
  }

  static Status CopyOne(const ce::ShmVersionHandle& h, const std::string& name, std::span<std::byte> out) {
    return h.CopyTensorTo(name, out);
  }
  static Status CopyOne(const ce::VersionHandle& h, const std::string& name, std::span<std::byte> out) {
    SLUICE_ASSIGN_OR_RETURN(HostTensor view, h.tensor(name));
    if (view.nbytes != out.size()) {
      return Status::InvalidArgument("tensor '" + name + "': destination is " + std::to_string(out.size()) +
                                     " bytes, the tensor is " + std::to_string(view.nbytes));
    }
    if (view.nbytes > 0) std::memcpy(out.data(), view.data, view.nbytes);
    return Status::Ok();
  }

  const int64_t version_;
  std::shared_ptr<const ce::Layout> layout_;
  // Touched only with the GIL held; calls work on a copy (another pin).
  std::optional<Handle> handle_;
};

// ---------------------------------------------------------------- waiting

// Waits for a version >= at_least in slices of kWaitSlice, running Python's
// signal handlers between them (an exception from one propagates), then
// pins the latest. `wait(ms)` is the store's WaitForVersion; `timed_out`
// makes the final Timeout's message.
template <typename Wait, typename TimedOut>
auto WaitInSlices(int64_t timeout_ms, Wait wait, TimedOut timed_out) {
  const auto deadline = std::chrono::steady_clock::now() + milliseconds(std::max<int64_t>(timeout_ms, 0));
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(deadline - std::chrono::steady_clock::now());
    const milliseconds slice = std::clamp(left, milliseconds(0), kWaitSlice);
    auto r = [&] {
      py::gil_scoped_release release;
      return wait(slice);
    }();
    if (r.ok() || r.status().code() != StatusCode::kTimeout) return ValueOrThrow(std::move(r));
    if (std::chrono::steady_clock::now() >= deadline) throw StatusError(timed_out());
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  }
}

std::string NoVersionMessage(int64_t at_least, const std::string& store, int64_t timeout_ms, int64_t latest) {
  return "no version >= " + std::to_string(at_least) + " was committed to " + store + " within " +
         std::to_string(timeout_ms) + " ms; latest is " + std::to_string(latest);
}

// ---------------------------------------------------------------- shared memory

class ShmPublisherBinding {
 public:
  static std::unique_ptr<ShmPublisherBinding> Attach(const std::string& store_name, const std::string& shm_prefix,
                                                     const py::list& layout, uint64_t max_tensor_bytes,
                                                     uint32_t max_readers, uint32_t max_pins_per_reader,
                                                     int64_t lock_timeout_ms, bool recycle_segments) {
    ce::ShmPublisherOptions o;
    o.store_name = store_name;
    o.shm_prefix = shm_prefix;
    o.layout = ToLayout(layout);
    o.max_tensor_bytes = max_tensor_bytes;
    o.max_readers = max_readers;
    o.max_pins_per_reader = max_pins_per_reader;
    o.lock_timeout = milliseconds(lock_timeout_ms);
    o.recycle_segments = recycle_segments;
    Result<std::unique_ptr<ce::ShmPublisher>> pub = Status::Internal("not attached");
    {
      py::gil_scoped_release release;
      pub = ce::ShmPublisher::Attach(std::move(o));
    }
    return std::unique_ptr<ShmPublisherBinding>(new ShmPublisherBinding(ValueOrThrow(std::move(pub))));
  }

  std::unique_ptr<Staged> BeginPublish(int64_t version) {
    auto pub = Get();
    Result<std::unique_ptr<ce::StagedWeights>> staged = Status::Internal("not begun");
    {
      py::gil_scoped_release release;
      staged = pub->BeginPublish(version);
    }
    return std::make_unique<Staged>(ValueOrThrow(std::move(staged)));
  }

  int64_t LatestVersion() { return Get()->latest_version(); }
  py::list Layout() { return FromLayout(Get()->layout()); }
  size_t VersionBytes() { return Get()->version_bytes(); }
  std::string ControlSegment() { return Get()->control_segment_name(); }

  py::dict Stats() {
    auto pub = Get();
    Result<ce::ShmStoreStats> s = Status::Internal("no stats");
    {
      py::gil_scoped_release release;
      s = pub->stats();
    }
    return FromShmStats(ValueOrThrow(std::move(s)));
  }

  void Sweep() {
    auto pub = Get();
    py::gil_scoped_release release;
    ThrowIfError(pub->Sweep());
  }

  void Close() {
    std::shared_ptr<ce::ShmPublisher> pub = std::move(pub_);
    py::gil_scoped_release release;
    pub.reset();
  }

 private:
  explicit ShmPublisherBinding(std::unique_ptr<ce::ShmPublisher> pub) : pub_(std::move(pub)) {}
  std::shared_ptr<ce::ShmPublisher> Get() const {
    if (pub_ == nullptr) throw StatusError(Closed("the publisher"));
    return pub_;
  }
  std::shared_ptr<ce::ShmPublisher> pub_;
};

class ShmSubscriberBinding {
 public:
  static std::unique_ptr<ShmSubscriberBinding> Attach(const std::string& store_name, const std::string& shm_prefix,
                                                      const std::optional<py::list>& expected_layout,
                                                      int64_t attach_timeout_ms, int64_t lock_timeout_ms,
                                                      bool verify_copies) {
    ce::ShmSubscriberOptions o;
    o.store_name = store_name;
    o.shm_prefix = shm_prefix;
    if (expected_layout) o.expected_layout = ToLayout(*expected_layout);
    o.attach_timeout = milliseconds(attach_timeout_ms);
    o.lock_timeout = milliseconds(lock_timeout_ms);
    o.verify_copies = verify_copies;
    const std::string store = shm_prefix + "." + store_name;
    Result<std::unique_ptr<ce::ShmSubscriber>> sub = Status::Internal("not attached");
    {
      py::gil_scoped_release release;
      sub = ce::ShmSubscriber::Attach(std::move(o));
    }
    return std::unique_ptr<ShmSubscriberBinding>(new ShmSubscriberBinding(ValueOrThrow(std::move(sub)), store));
  }

  std::unique_ptr<Pinned> Acquire(std::optional<int64_t> version) {
    auto sub = Get();
    Result<ce::ShmVersionHandle> h = Status::Internal("not pinned");
    {
      py::gil_scoped_release release;
      h = version ? sub->Acquire(*version) : sub->AcquireLatest();
    }
    return std::make_unique<Pinned>(ValueOrThrow(std::move(h)), layout_);
  }

  std::unique_ptr<Pinned> WaitForVersion(int64_t at_least, int64_t timeout_ms) {
    auto sub = Get();
    ce::ShmVersionHandle h = WaitInSlices(
        timeout_ms, [&](milliseconds slice) { return sub->WaitForVersion(at_least, slice); },
        [&] {
          std::string who;
          if (Result<ce::ShmStoreStats> s = sub->stats(); s.ok()) {
            who = s->publisher.pid == 0 ? "; no publisher is attached"
                                        : "; publisher pid " + std::to_string(s->publisher.pid) +
                                              (s->publisher_alive ? " is alive" : " is dead");
          }
          return Status::Timeout(NoVersionMessage(at_least, store_, timeout_ms, sub->latest_version()) + who);
        });
    return std::make_unique<Pinned>(std::move(h), layout_);
  }

  int64_t LatestVersion() { return Get()->latest_version(); }
  py::list Layout() { return FromLayout(*layout_); }
  size_t VersionBytes() { return Get()->version_bytes(); }

  py::dict Stats() {
    auto sub = Get();
    Result<ce::ShmStoreStats> s = Status::Internal("no stats");
    {
      py::gil_scoped_release release;
      s = sub->stats();
    }
    return FromShmStats(ValueOrThrow(std::move(s)));
  }

  void Close() {
    std::shared_ptr<ce::ShmSubscriber> sub = std::move(sub_);
    py::gil_scoped_release release;
    sub.reset();
  }

 private:
  ShmSubscriberBinding(std::unique_ptr<ce::ShmSubscriber> sub, std::string store)
      : layout_(std::make_shared<const ce::Layout>(sub->layout())), sub_(std::move(sub)), store_(std::move(store)) {}
  std::shared_ptr<ce::ShmSubscriber> Get() const {
    if (sub_ == nullptr) throw StatusError(Closed("the subscriber"));
    return sub_;
  }
  std::shared_ptr<const ce::Layout> layout_;
  std::shared_ptr<ce::ShmSubscriber> sub_;
  std::string store_;
};

// ---------------------------------------------------------------- in process

class VersionStoreBinding {
 public:
  static std::unique_ptr<VersionStoreBinding> Create(const py::list& layout, uint64_t max_tensor_bytes,
                                                     uint64_t max_pinned_versions, bool reuse_buffers) {
    ce::VersionStoreOptions o;
    o.layout = ToLayout(layout);
    o.max_tensor_bytes = max_tensor_bytes;
    o.max_pinned_versions = max_pinned_versions;
    o.reuse_buffers = reuse_buffers;
    auto store = ValueOrThrow(ce::VersionStore::Create(std::move(o)));
    return std::unique_ptr<VersionStoreBinding>(new VersionStoreBinding(std::move(store)));
  }

  std::unique_ptr<Staged> BeginPublish(int64_t version) {
    auto store = Get();
    Result<std::unique_ptr<ce::StagedWeights>> staged = Status::Internal("not begun");
    {
      py::gil_scoped_release release;
      staged = store->BeginPublish(version);
    }
    return std::make_unique<Staged>(ValueOrThrow(std::move(staged)));
  }

  std::unique_ptr<Pinned> Acquire(std::optional<int64_t> version) {
    auto store = Get();
    Result<ce::VersionHandle> h = Status::Internal("not pinned");
    {
      py::gil_scoped_release release;
      h = version ? store->Acquire(*version) : store->AcquireLatest();
    }
    return std::make_unique<Pinned>(ValueOrThrow(std::move(h)), layout_);
  }

  std::unique_ptr<Pinned> WaitForVersion(int64_t at_least, int64_t timeout_ms) {
    auto store = Get();
    ce::VersionHandle h = WaitInSlices(
        timeout_ms, [&](milliseconds slice) { return store->WaitForVersion(at_least, slice); },
        [&] {
          return Status::Timeout(
              NoVersionMessage(at_least, "the in-process store", timeout_ms, store->latest_version()));
        });
    return std::make_unique<Pinned>(std::move(h), layout_);
  }

  int64_t LatestVersion() { return Get()->latest_version(); }
  py::list Layout() { return FromLayout(*layout_); }
  size_t VersionBytes() { return Get()->version_bytes(); }

  py::dict Stats() {
    auto store = Get();
    ce::VersionStoreStats s;
    {
      py::gil_scoped_release release;
      s = store->stats();
    }
    return FromStats(s);
  }

  void Close() {
    std::shared_ptr<ce::VersionStore> store = std::move(store_);
    py::gil_scoped_release release;
    store.reset();
  }

 private:
  explicit VersionStoreBinding(std::unique_ptr<ce::VersionStore> store)
      : layout_(std::make_shared<const ce::Layout>(store->layout())), store_(std::move(store)) {}
  std::shared_ptr<ce::VersionStore> Get() const {
    if (store_ == nullptr) throw StatusError(Closed("the version store"));
    return store_;
  }
  std::shared_ptr<const ce::Layout> layout_;
  std::shared_ptr<ce::VersionStore> store_;
};

}  // namespace

void BindCheckpointEngine(py::module_& m) {
  py::class_<Staged>(m, "Staged")
      .def_property_readonly("version", &Staged::version)
      .def("put", &Staged::Put, py::arg("name"), py::arg("tensor"))
      .def("commit", &Staged::Commit)
      .def("abort", &Staged::Abort);

  py::class_<Pinned>(m, "Pinned")
      .def_property_readonly("version", &Pinned::version)
      .def("tensors", &Pinned::Tensors)
      .def("checksum", &Pinned::Checksum, py::arg("name"))
      .def("verify", &Pinned::Verify)
      .def("copy_into", &Pinned::CopyInto, py::arg("destinations"))
      .def("release", &Pinned::Release);

  py::class_<ShmPublisherBinding>(m, "ShmPublisher")
      .def_static("attach", &ShmPublisherBinding::Attach, py::arg("store_name"), py::arg("shm_prefix"),
                  py::arg("layout"), py::arg("max_tensor_bytes"), py::arg("max_readers"),
                  py::arg("max_pins_per_reader"), py::arg("lock_timeout_ms"), py::arg("recycle_segments"))
      .def("begin_publish", &ShmPublisherBinding::BeginPublish, py::arg("version"))
      .def("latest_version", &ShmPublisherBinding::LatestVersion)
      .def("layout", &ShmPublisherBinding::Layout)
      .def("version_bytes", &ShmPublisherBinding::VersionBytes)
      .def("control_segment", &ShmPublisherBinding::ControlSegment)
      .def("stats", &ShmPublisherBinding::Stats)
      .def("sweep", &ShmPublisherBinding::Sweep)
      .def("close", &ShmPublisherBinding::Close);

  py::class_<ShmSubscriberBinding>(m, "ShmSubscriber")
      .def_static("attach", &ShmSubscriberBinding::Attach, py::arg("store_name"), py::arg("shm_prefix"),
                  py::arg("expected_layout"), py::arg("attach_timeout_ms"), py::arg("lock_timeout_ms"),
                  py::arg("verify_copies"))
      .def("acquire", &ShmSubscriberBinding::Acquire, py::arg("version"))
      .def("wait_for_version", &ShmSubscriberBinding::WaitForVersion, py::arg("at_least"), py::arg("timeout_ms"))
      .def("latest_version", &ShmSubscriberBinding::LatestVersion)
      .def("layout", &ShmSubscriberBinding::Layout)
      .def("version_bytes", &ShmSubscriberBinding::VersionBytes)
      .def("stats", &ShmSubscriberBinding::Stats)
      .def("close", &ShmSubscriberBinding::Close);

  py::class_<VersionStoreBinding>(m, "VersionStore")
      .def_static("create", &VersionStoreBinding::Create, py::arg("layout"), py::arg("max_tensor_bytes"),
                  py::arg("max_pinned_versions"), py::arg("reuse_buffers"))
      .def("begin_publish", &VersionStoreBinding::BeginPublish, py::arg("version"))
      .def("acquire", &VersionStoreBinding::Acquire, py::arg("version"))
      .def("wait_for_version", &VersionStoreBinding::WaitForVersion, py::arg("at_least"), py::arg("timeout_ms"))
      .def("latest_version", &VersionStoreBinding::LatestVersion)
      .def("layout", &VersionStoreBinding::Layout)
      .def("version_bytes", &VersionStoreBinding::VersionBytes)
      .def("stats", &VersionStoreBinding::Stats)
      .def("close", &VersionStoreBinding::Close);

  m.def(
      "sweep_shm_store",
      [](const std::string& shm_prefix, const std::string& store_name, int64_t lock_timeout_ms) {
        py::gil_scoped_release release;
        ThrowIfError(ce::SweepShmStore(shm_prefix, store_name, milliseconds(lock_timeout_ms)));
      },
      py::arg("shm_prefix"), py::arg("store_name"), py::arg("lock_timeout_ms"));
  m.def(
      "destroy_shm_store",
      [](const std::string& shm_prefix, const std::string& store_name) {
        py::gil_scoped_release release;
        ThrowIfError(ce::DestroyShmStore(shm_prefix, store_name));
      },
      py::arg("shm_prefix"), py::arg("store_name"));
}

}  // namespace sluice::python
