#include "sluice/trainer/data_parallel.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <utility>

#include "sluice/common/metrics_server.h"

namespace sluice::trainer {

namespace {

std::string ExceptionText(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) return c10_error->what_without_backtrace();
  return e.what();
}

// The address of this host's interface on the route to `host` (a UDP
// socket connected there sends nothing; getsockname says which source the
// kernel chose). What peers reach this rank at when the group spans hosts.
Result<std::string> LocalAddressToward(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), std::to_string(port > 0 ? port : 1).c_str(), &hints, &found);
  if (rc != 0 || found == nullptr) {
    return Status::Unavailable("cannot resolve '" + host + "': " + ::gai_strerror(rc));
  }
  const int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  const bool ok = fd >= 0 && ::connect(fd, found->ai_addr, found->ai_addrlen) == 0 &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0;
  const int err = errno;
  if (fd >= 0) ::close(fd);
  ::freeaddrinfo(found);
  if (!ok) return Status::Unavailable("no route to '" + host + "': " + std::strerror(err));
  char text[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &local.sin_addr, text, sizeof(text));
  return std::string(text);
}

bool IsLoopback(const std::string& address) {
  return address == "localhost" || address == "::1" || address.rfind("127.", 0) == 0;
}

std::string Where(const DataParallelOptions& o) {
  return "data-parallel rank " + std::to_string(o.rank) + " of " + std::to_string(o.world_size);
}

// Runs a store call; Unavailable naming `who` and `what` if it throws.
template <typename Fn>
Status StoreCall(const std::string& who, const std::string& what, Fn fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return Status::Unavailable(who + ": " + what + " failed: " + ExceptionText(e));
  }
  return Status::Ok();
}

// Polls `store` for `key` (backing off to 20 ms) and reads it; Timeout if
// it is not set within `timeout`.
Result<std::string> WaitForKey(c10d::Store& store, const std::string& key, std::chrono::milliseconds timeout,
                               const std::string& who) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::microseconds(200);
  for (;;) {
    bool present = false;
    SLUICE_RETURN_IF_ERROR(StoreCall(who, "reading the rendezvous store", [&] { present = store.check({key}); }));
    if (present) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      return Status::Timeout(who + ": '" + key + "' was not set in the rendezvous store within " +
                             std::to_string(timeout.count()) + " ms");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
  }
  std::vector<uint8_t> value;
  SLUICE_RETURN_IF_ERROR(StoreCall(who, "reading the rendezvous store", [&] { value = store.get(key); }));
  return std::string(value.begin(), value.end());
}

// Under DataParallelOptions::key_prefix: the group's collectives' keys and
// the shared values.
constexpr char kGroupKeys[] = "/trainer";
constexpr char kSharedKeys[] = "/shared";

}  // namespace

Status DataParallelOptions::SetStore(const std::string& spec) {
  if (spec.rfind("file:", 0) == 0) {
    store_file = spec.substr(5);
    if (store_file.empty()) return Status::InvalidArgument("store 'file:' names no file");
    return Status::Ok();
  }
  store_file.clear();
  return ParseListenAddress(spec, &master_addr, &master_port);
}

Status DataParallelOptions::Validate() const {
  if (key_prefix.empty()) return Status::InvalidArgument("data-parallel key_prefix is empty");
  if (world_size < 1) return Status::InvalidArgument("data-parallel world size must be >= 1");
  if (rank < 0 || rank >= world_size) {
    return Status::InvalidArgument("data-parallel rank " + std::to_string(rank) + " is outside 0.." +
                                   std::to_string(world_size - 1));
  }
  if (timeout.count() <= 0) return Status::InvalidArgument("data-parallel timeout must be > 0");
  if (bucket_bytes < 1) return Status::InvalidArgument("data-parallel bucket_bytes must be >= 1");
  if (!store_file.empty()) return Status::Ok();  // no address to check
  if (master_addr.empty()) return Status::InvalidArgument("data-parallel rendezvous address is empty");
  const bool port_zero_ok = rank == 0 && !store_served_by_launcher;
  if (master_port < (port_zero_ok ? 0 : 1) || master_port > 65535) {
    return Status::InvalidArgument("data-parallel rendezvous port " + std::to_string(master_port) +
                                   " is outside 1..65535");
  }
  return Status::Ok();
}

struct DataParallelGroup::Impl {
  c10::intrusive_ptr<c10d::Store> store;         // TCPStore, or FileStore on one host
  c10::intrusive_ptr<c10d::PrefixStore> shared;  // SetShared / GetShared
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group;
};

DataParallelGroup::DataParallelGroup(const DataParallelOptions& options, std::unique_ptr<Impl> impl)
    : options_(options), impl_(std::move(impl)) {}

DataParallelGroup::~DataParallelGroup() = default;

Result<std::unique_ptr<DataParallelGroup>> DataParallelGroup::Connect(const DataParallelOptions& o) {
  SLUICE_RETURN_IF_ERROR(o.Validate());
  auto impl = std::make_unique<Impl>();
  const std::string store_at =
      o.store_file.empty() ? o.master_addr + ":" + std::to_string(o.master_port) : "file " + o.store_file;
  std::string bind = o.bind_address;
  if (bind.empty() && (IsLoopback(o.master_addr) || !o.store_file.empty())) bind = "127.0.0.1";
  if (bind.empty()) {
    Result<std::string> toward = LocalAddressToward(o.master_addr, o.master_port);
    if (!toward.ok()) return toward.status().WithContext(Where(o) + ": choosing the address to bind");
    bind = *toward;
  }
  try {
    if (!o.store_file.empty()) {
      impl->store = c10::make_intrusive<c10d::FileStore>(o.store_file, static_cast<int>(o.world_size));
      impl->store->setTimeout(o.timeout);
    } else {
      c10d::TCPStoreOptions store_options;
      store_options.port = static_cast<uint16_t>(o.master_port);
      store_options.isServer = o.rank == 0 && !o.store_served_by_launcher;
      store_options.waitWorkers = false;
      store_options.timeout = o.timeout;
      impl->store = c10::make_intrusive<c10d::TCPStore>(o.master_addr, store_options);
    }
  } catch (const std::exception& e) {
    return Status::Unavailable(Where(o) + ": cannot " +
                               (o.rank == 0 && !o.store_served_by_launcher ? "serve" : "reach") +
                               " the rendezvous store at " + store_at + ": " + ExceptionText(e));
  }
  try {
    auto options = c10d::ProcessGroupGloo::Options::create(o.timeout);
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(bind));
    options->threads = 2;
    auto store = c10::make_intrusive<c10d::PrefixStore>(o.key_prefix + kGroupKeys, impl->store);
    impl->shared = c10::make_intrusive<c10d::PrefixStore>(o.key_prefix + kSharedKeys, impl->store);
    impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(store, static_cast<int>(o.rank),
                                                              static_cast<int>(o.world_size), options);
  } catch (const std::exception& e) {
    return Status::Unavailable(Where(o) + ": the group did not form through the store at " + store_at + " within " +
                               std::to_string(o.timeout.count()) +
                               " ms (a rank missing or unreachable?): " + ExceptionText(e));
  }
  return std::unique_ptr<DataParallelGroup>(new DataParallelGroup(o, std::move(impl)));
}

Status DataParallelGroup::Run(const std::string& op, const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  struct Timed {
    double& total;
    std::chrono::steady_clock::time_point start;
    ~Timed() { total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); }
  } timed{collective_seconds_, start};
  try {
    fn();
  } catch (const std::exception& e) {
    return Status::Unavailable(Where(options_) + ": " + op +
                               " failed (a rank died, hung or left?): " + ExceptionText(e));
  }
  return Status::Ok();
}

namespace {

// Buckets of one dtype and device, at most `bucket_bytes` each (a larger
// tensor alone), members in the order given: the same on every rank.
std::vector<std::vector<size_t>> Buckets(const std::vector<at::Tensor>& tensors, int64_t bucket_bytes) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<int64_t> bytes;
  std::map<std::pair<int, std::string>, size_t> open;  // (dtype, device) -> bucket being filled
  for (size_t i = 0; i < tensors.size(); ++i) {
    const at::Tensor& t = tensors[i];
    const auto key = std::make_pair(static_cast<int>(t.scalar_type()), t.device().str());
    const int64_t size = t.numel() * static_cast<int64_t>(t.element_size());
    auto it = open.find(key);
    if (it == open.end() || bytes[it->second] + size > bucket_bytes) {
      buckets.emplace_back();
      bytes.push_back(0);
      it = open.insert_or_assign(key, buckets.size() - 1).first;
    }
    buckets[it->second].push_back(i);
    bytes[it->second] += size;
  }
  return buckets;
}

}  // namespace

Status DataParallelGroup::AllReduce(const std::vector<at::Tensor>& tensors, Reduce op) {
  if (size() == 1 || tensors.empty()) return Status::Ok();
  struct Bucket {
    std::vector<at::Tensor> members;
    at::Tensor flat;
  };
  std::vector<Bucket> buckets;
  for (const std::vector<size_t>& members : Buckets(tensors, options_.bucket_bytes)) {
    buckets.emplace_back();
    for (size_t i : members) buckets.back().members.push_back(tensors[i]);
  }
  return Run("all-reduce", [&] {
    c10d::AllreduceOptions opts;
    opts.reduceOp = op == Reduce::kMax ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM;
    opts.timeout = options_.timeout;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    for (Bucket& b : buckets) {
      if (b.members.size() == 1 && b.members[0].is_contiguous()) {
        b.flat = b.members[0];
      } else {
        std::vector<at::Tensor> flat;
        for (const at::Tensor& t : b.members) flat.push_back(t.reshape({-1}));
        b.flat = torch::cat(flat);
      }
      std::vector<at::Tensor> one{b.flat};
      works.push_back(impl_->group->allreduce(one, opts));
    }
    for (auto& w : works) w->wait(options_.timeout);
    torch::NoGradGuard no_grad;
    for (Bucket& b : buckets) {
      if (b.flat.data_ptr() == b.members[0].data_ptr() && b.members.size() == 1) continue;
      int64_t offset = 0;
      for (at::Tensor& t : b.members) {
        t.copy_(b.flat.narrow(0, offset, t.numel()).view(t.sizes()));
        offset += t.numel();
      }
    }
  });
}

struct DataParallelGroup::PendingSum::State {
  DataParallelGroup* group = nullptr;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg;
  struct Bucket {
    at::Tensor flat;
    size_t waiting = 0;  // members not yet ready
    c10::intrusive_ptr<c10d::Work> work;
  };
  std::vector<Bucket> buckets;
  std::vector<std::pair<size_t, int64_t>> where;  // per tensor: its bucket and offset
  std::vector<int64_t> numel;
  std::mutex mu;
  std::vector<bool> ready;  // guarded by mu
  size_t next = 0;          // the next bucket to send; guarded by mu
  Status error;             // guarded by mu

  // Sends every bucket whose turn it is and whose members are all ready.
  void SendReady() {
    if (!error.ok()) return;
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = group->options_.timeout;
    try {
      for (; next < buckets.size() && buckets[next].waiting == 0; ++next) {
        std::vector<at::Tensor> one{buckets[next].flat};
        buckets[next].work = pg->allreduce(one, opts);
      }
    } catch (const std::exception& e) {
      error = Status::Unavailable(Where(group->options_) + ": sending a gradient bucket failed: " + ExceptionText(e));
    }
  }
  void Copy(size_t index, const at::Tensor& value) {
    torch::NoGradGuard no_grad;
    const auto [b, offset] = where[index];
    buckets[b].flat.narrow(0, offset, numel[index]).copy_(value.reshape({-1}));
  }
};

DataParallelGroup::PendingSum::PendingSum(std::unique_ptr<State> state) : state_(std::move(state)) {}
// A bucket still in flight holds its own reference to its buffer.
DataParallelGroup::PendingSum::~PendingSum() = default;
int64_t DataParallelGroup::PendingSum::buckets() const { return static_cast<int64_t>(state_->buckets.size()); }

Result<std::unique_ptr<DataParallelGroup::PendingSum>> DataParallelGroup::BeginSum(
    const std::vector<at::Tensor>& like) {
  if (like.empty()) return Status::InvalidArgument("a pending sum of no tensors");
  auto s = std::make_unique<PendingSum::State>();
  s->group = this;
  s->pg = impl_->group;
  s->ready.assign(like.size(), false);
  s->where.resize(like.size());
  for (const at::Tensor& t : like) {
    if (!t.defined()) return Status::InvalidArgument("a pending sum of an undefined tensor");
    s->numel.push_back(t.numel());
  }
  for (const std::vector<size_t>& members : Buckets(like, options_.bucket_bytes)) {
    int64_t offset = 0;
    for (size_t i : members) s->where[i] = {s->buckets.size(), offset}, offset += like[i].numel();
    PendingSum::State::Bucket b;
    b.flat = at::empty({offset}, like[members[0]].options().requires_grad(false));
    b.waiting = members.size();
    s->buckets.push_back(std::move(b));
  }
  return std::unique_ptr<PendingSum>(new PendingSum(std::move(s)));
}

int64_t DataParallelGroup::PendingSum::Ready(size_t index, const at::Tensor& value) {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (index >= s.ready.size() || s.ready[index] || !s.error.ok()) return 0;
    s.ready[index] = true;
  }
  // Each tensor has a slot of its own: copied outside the lock.
  s.Copy(index, value);
  std::lock_guard<std::mutex> lock(s.mu);
  --s.buckets[s.where[index].first].waiting;
  const size_t before = s.next;
  s.SendReady();
  return static_cast<int64_t>(s.next - before);
}

Status DataParallelGroup::PendingSum::Finish(const std::vector<at::Tensor>& finals) {
  State& s = *state_;
  if (finals.size() != s.ready.size()) {
    return Status::InvalidArgument("a pending sum of " + std::to_string(s.ready.size()) + " tensors finished with " +
                                   std::to_string(finals.size()));
  }
  return s.group->Run("all-reduce", [&] {
    for (size_t i = 0; i < finals.size(); ++i) Ready(i, finals[i]);  // (those already ready are ignored)
    {
      std::lock_guard<std::mutex> lock(s.mu);
      if (!s.error.ok()) throw std::runtime_error(s.error.message());
      if (s.next != s.buckets.size()) throw std::runtime_error("a gradient bucket was never sent");
    }
    for (auto& b : s.buckets) b.work->wait(s.group->options_.timeout);
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < finals.size(); ++i) {
      const auto [b, offset] = s.where[i];
      finals[i].copy_(s.buckets[b].flat.narrow(0, offset, s.numel[i]).view(finals[i].sizes()));
    }
  });
}

Status DataParallelGroup::AllReduce(std::vector<double>& values, Reduce op) {
  if (size() == 1 || values.empty()) return Status::Ok();
  at::Tensor t = torch::tensor(values, torch::kFloat64);
  SLUICE_RETURN_IF_ERROR(AllReduce({t}, op));
  const double* data = t.data_ptr<double>();
  values.assign(data, data + values.size());
  return Status::Ok();
}

Status DataParallelGroup::Broadcast(const std::vector<at::Tensor>& tensors, int64_t root) {
  if (root < 0 || root >= size()) return Status::InvalidArgument("broadcast root outside the group");
  if (size() == 1 || tensors.empty()) return Status::Ok();
  return Run("broadcast", [&] {
    c10d::BroadcastOptions opts;
    opts.rootRank = static_cast<int>(root);
    opts.timeout = options_.timeout;
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (target, contiguous stand-in)
    for (const at::Tensor& t : tensors) {
      at::Tensor buffer = t.is_contiguous() ? t : t.contiguous();
      if (!t.is_contiguous()) copies.emplace_back(t, buffer);
      std::vector<at::Tensor> one{buffer};
      works.push_back(impl_->group->broadcast(one, opts));
    }
    for (auto& w : works) w->wait(options_.timeout);
    torch::NoGradGuard no_grad;
    for (auto& [target, buffer] : copies) target.copy_(buffer);
  });
}

Status DataParallelGroup::CheckSame(const std::string& what, uint64_t value) {
  if (size() == 1) return Status::Ok();
  std::vector<at::Tensor> input{torch::tensor({static_cast<int64_t>(value)}, torch::kInt64)};
  std::vector<std::vector<at::Tensor>> output(1);
  for (int64_t r = 0; r < size(); ++r) output[0].push_back(torch::zeros({1}, torch::kInt64));
  SLUICE_RETURN_IF_ERROR(Run("all-gather", [&] {
    c10d::AllgatherOptions opts;
    opts.timeout = options_.timeout;
    impl_->group->allgather(output, input, opts)->wait(options_.timeout);
  }));
  std::string differ;
  const int64_t first = output[0][0].item<int64_t>();
  for (int64_t r = 1; r < size(); ++r) {
    if (output[0][r].item<int64_t>() != first) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
  }
  if (differ.empty()) return Status::Ok();
  return Status::FailedPrecondition("data-parallel ranks " + differ + " differ from rank 0 in " + what);
}

Status DataParallelGroup::SetShared(const std::string& key, const std::string& value) {
  return Run("setting '" + key + "' in the rendezvous store",
             [&] { impl_->shared->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
}

Result<std::string> DataParallelGroup::GetShared(const std::string& key, std::chrono::milliseconds timeout) {
  return WaitForKey(*impl_->shared, key, timeout, Where(options_));
}

Status DataParallelGroup::DeleteShared(const std::string& key) {
  // libtorch's FileStore cannot delete keys in every version: its values
  // stay in the file (which goes when the last rank closes it).
  if (!options_.store_file.empty()) return Status::Ok();
  return Run("deleting '" + key + "' from the rendezvous store", [&] { impl_->shared->deleteKey(key); });
}

struct DataParallelStore::Impl {
  c10::intrusive_ptr<c10d::TCPStore> store;
  c10::intrusive_ptr<c10d::PrefixStore> shared;
  std::string where;
};

DataParallelStore::DataParallelStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DataParallelStore::~DataParallelStore() = default;
int DataParallelStore::port() const { return impl_->store->getPort(); }

namespace {

Result<std::unique_ptr<DataParallelStore::Impl>> OpenStore(const std::string& host, int port, bool serve,
                                                           std::chrono::milliseconds timeout,
                                                           const std::string& key_prefix) {
  const std::string where = host + ":" + std::to_string(port);
  if (port < (serve ? 0 : 1) || port > 65535) {
    return Status::InvalidArgument("rendezvous port " + std::to_string(port) + " is outside " + (serve ? "0" : "1") +
                                   "..65535");
  }
  auto impl = std::make_unique<DataParallelStore::Impl>();
  try {
    c10d::TCPStoreOptions o;
    o.port = static_cast<uint16_t>(port);
    o.isServer = serve;
    o.waitWorkers = false;
    o.timeout = timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(host, o);
    impl->shared = c10::make_intrusive<c10d::PrefixStore>(key_prefix + kSharedKeys, impl->store);
  } catch (const std::exception& e) {
    return Status::Unavailable(std::string("cannot ") + (serve ? "serve" : "reach") +
                               " the data-parallel rendezvous store at " + where + ": " + ExceptionText(e));
  }
  impl->where = "the rendezvous store at " + host + ":" + std::to_string(impl->store->getPort());
  return impl;
}

}  // namespace

Result<std::unique_ptr<DataParallelStore>> DataParallelStore::Serve(const std::string& host, int port,
                                                                    std::chrono::milliseconds timeout,
                                                                    const std::string& key_prefix) {
  SLUICE_ASSIGN_OR_RETURN(auto impl, OpenStore(host, port, /*serve=*/true, timeout, key_prefix));
  return std::unique_ptr<DataParallelStore>(new DataParallelStore(std::move(impl)));
}

Result<std::unique_ptr<DataParallelStore>> DataParallelStore::Connect(const std::string& host, int port,
                                                                      std::chrono::milliseconds timeout,
                                                                      const std::string& key_prefix) {
  SLUICE_ASSIGN_OR_RETURN(auto impl, OpenStore(host, port, /*serve=*/false, timeout, key_prefix));
  return std::unique_ptr<DataParallelStore>(new DataParallelStore(std::move(impl)));
}

Status DataParallelStore::SetShared(const std::string& key, const std::string& value) {
  return StoreCall(impl_->where, "setting '" + key + "'",
                   [&] { impl_->shared->set(key, std::vector<uint8_t>(value.begin(), value.end())); });
}

Result<std::string> DataParallelStore::GetShared(const std::string& key, std::chrono::milliseconds timeout) {
  return WaitForKey(*impl_->shared, key, timeout, impl_->where);
}

Result<int64_t> DataParallelStore::AddShared(const std::string& key, int64_t delta) {
  int64_t value = 0;
  SLUICE_RETURN_IF_ERROR(
      StoreCall(impl_->where, "adding to '" + key + "'", [&] { value = impl_->shared->add(key, delta); }));
  return value;
}

Status DataParallelStore::DeleteShared(const std::string& key) {
  return StoreCall(impl_->where, "deleting '" + key + "'", [&] { impl_->shared->deleteKey(key); });
}

std::vector<std::vector<size_t>> DataParallelShard(size_t n, int64_t mini_batches, int64_t rank, int64_t world) {
  const int64_t N = static_cast<int64_t>(n);
  const int64_t minis = std::max<int64_t>(1, std::min<int64_t>(mini_batches, N));
  std::vector<std::vector<size_t>> out(static_cast<size_t>(minis));
  for (int64_t k = 0; k < minis; ++k) {
    const int64_t begin = k * N / minis, end = (k + 1) * N / minis;
    for (int64_t i = begin + rank; i < end; i += world) out[k].push_back(static_cast<size_t>(i));
  }
  return out;
}

}  // namespace sluice::trainer
