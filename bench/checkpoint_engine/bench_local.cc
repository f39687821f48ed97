#include "bench_local.h"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>
#include <span>
#include <thread>

#include "sluice/checkpoint_engine/shm_store.h"
#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/mutex.h"

namespace sluice::bench::ce {

using checkpoint_engine::ShmPublisher;
using checkpoint_engine::ShmPublisherOptions;
using checkpoint_engine::ShmSubscriber;
using checkpoint_engine::ShmSubscriberOptions;
using checkpoint_engine::VersionStore;
using checkpoint_engine::VersionStoreOptions;

namespace {

constexpr auto kPatience = std::chrono::seconds(120);  // only reached when something is broken

// Per-tensor spans into one standby buffer, in layout order.
struct Standby {
  std::unique_ptr<std::byte[]> buffer;
  std::vector<std::span<std::byte>> spans;
};

Standby MakeStandby(const Layout& layout) {
  Standby s;
  size_t total = 0;
  for (const auto& spec : layout) total += static_cast<size_t>(spec.shape[0]) * DTypeSize(spec.dtype);
  s.buffer = AllocateTouched(total);
  size_t offset = 0;
  for (const auto& spec : layout) {
    const size_t n = static_cast<size_t>(spec.shape[0]) * DTypeSize(spec.dtype);
    s.spans.emplace_back(s.buffer.get() + offset, n);
    offset += n;
  }
  return s;
}

// Counts subscribers done with a version.
class DoneCounter {
 public:
  void Done(int64_t version) {
    MutexLock lock(&mu_);
    ++done_[version];
    cv_.NotifyAll();
  }
  bool WaitFor(int64_t version, int count) {
    MutexLock lock(&mu_);
    return cv_.WaitFor(&mu_, kPatience, [&]() SLUICE_NO_THREAD_SAFETY_ANALYSIS { return done_[version] >= count; });
  }

 private:
  Mutex mu_;
  CondVar cv_;
  std::map<int64_t, int> done_ SLUICE_GUARDED_BY(mu_);
};

}  // namespace

Result<Measurement> MeasureMemcpy(const RunConfig& config) {
  Measurement m;
  m.transport = "memcpy";
  m.bytes = config.bytes;
  m.subscribers = config.subscribers;
  Weights weights(LayoutForBytes(config.bytes));
  std::vector<std::byte*> sources;
  std::vector<size_t> sizes;
  for (const auto& [name, t] : weights.tensors()) {
    sources.push_back(const_cast<std::byte*>(t.data));
    sizes.push_back(t.nbytes);
  }
  std::vector<std::unique_ptr<std::byte[]>> destinations;
  for (int s = 0; s < config.subscribers; ++s) destinations.push_back(AllocateTouched(config.bytes));
  // Copier threads wait for each round like the subscribers of the other
  // rows do, so thread start-up is not in the timed region.
  Mutex mu;
  CondVar go_cv;
  int64_t go = 0;  // guarded by mu
  DoneCounter done;
  {
    std::vector<std::jthread> threads;
    for (int s = 0; s < config.subscribers; ++s) {
      threads.emplace_back([&, s] {
        for (int64_t round = 1; round <= config.rounds(); ++round) {
          {
            MutexLock lock(&mu);
            go_cv.WaitFor(&mu, kPatience, [&]() SLUICE_NO_THREAD_SAFETY_ANALYSIS { return go >= round; });
          }
          size_t offset = 0;
          for (size_t i = 0; i < sources.size(); ++i) {
            std::memcpy(destinations[s].get() + offset, sources[i], sizes[i]);
            offset += sizes[i];
          }
          done.Done(round);
        }
      });
    }
    for (int64_t round = 1; round <= config.rounds(); ++round) {
      weights.Stamp(round);
      const auto t0 = Clock::now();
      {
        MutexLock lock(&mu);
        go = round;
        go_cv.NotifyAll();
      }
      if (!done.WaitFor(round, config.subscribers)) return Status::Timeout("memcpy threads did not finish");
      (round <= config.warmups ? m.warmup_seconds : m.seconds).push_back(Seconds(Clock::now() - t0));
    }
  }
  return m;
}

Result<Measurement> MeasureInProcess(const RunConfig& config) {
  Measurement m;
  m.transport = "inproc";
  m.baseline = "memcpy";
  m.bytes = config.bytes;
  m.subscribers = config.subscribers;
  const Layout layout = LayoutForBytes(config.bytes);
  VersionStoreOptions o;
  o.layout = layout;
  o.reuse_buffers = true;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<VersionStore> store, VersionStore::Create(o));
  Weights weights(layout);
  const int64_t last = config.rounds();
  DoneCounter done;
  std::atomic<bool> failed{false};
  std::vector<Standby> standby;
  for (int s = 0; s < config.subscribers; ++s) standby.push_back(MakeStandby(layout));
  {
    std::vector<std::jthread> subscribers;
    for (int s = 0; s < config.subscribers; ++s) {
      subscribers.emplace_back([&, s] {
        for (int64_t v = 1; v <= last; ++v) {
          auto h = store->WaitForVersion(v, kPatience);
          if (!h.ok()) {
            failed = true;
            done.Done(v);
            continue;
          }
          for (size_t t = 0; t < layout.size(); ++t) {
            auto view = h->tensor(layout[t].name);
            std::memcpy(standby[s].spans[t].data(), view->data, view->nbytes);
          }
          done.Done(v);
        }
      });
    }
    for (int64_t v = 1; v <= last; ++v) {
      weights.Stamp(v);
      const auto t0 = Clock::now();
      Status published = store->Publish(v, weights.tensors());
      const auto t1 = Clock::now();
      if (!published.ok()) {
        failed = true;
        return published;  // joins the subscribers after they time out; never expected
      }
      if (!done.WaitFor(v, config.subscribers)) return Status::Timeout("in-process subscribers did not finish");
      if (v <= config.warmups) {
        m.warmup_seconds.push_back(Seconds(Clock::now() - t0));
      } else {
        m.seconds.push_back(Seconds(Clock::now() - t0));
        m.publish_seconds.push_back(Seconds(t1 - t0));
      }
    }
  }
  if (failed) return Status::Internal("an in-process subscriber failed");
  return m;
}

Result<Measurement> MeasureSharedMemory(const RunConfig& config, bool recycle_segments) {
  Measurement m;
  m.transport = recycle_segments ? "shm" : "shm-fresh";
  m.baseline = "memcpy";
  m.bytes = config.bytes;
  m.subscribers = config.subscribers;
  const Layout layout = LayoutForBytes(config.bytes);
  std::random_device rd;
  const std::string prefix = "slbench" + std::to_string(::getpid()) + "x" + std::to_string(rd() % 100000);
  ShmPublisherOptions o;
  o.shm_prefix = prefix;
  o.store_name = "w";
  o.layout = layout;
  o.max_readers = static_cast<uint32_t>(config.subscribers + 1);
  o.max_pins_per_reader = 2;
  o.recycle_segments = recycle_segments;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<ShmPublisher> pub, ShmPublisher::Attach(o));
  Weights weights(layout);
  const int64_t last = config.rounds();
  std::vector<Child> children;
  for (int s = 0; s < config.subscribers; ++s) {
    SLUICE_ASSIGN_OR_RETURN(
        Child c, Child::Spawn({SelfExe(), "--role=shm-sub", "--prefix=" + prefix, "--store=w",
                               "--bytes=" + std::to_string(config.bytes), "--versions=" + std::to_string(last)},
                              /*capture_stdout=*/false, /*signal_pipe=*/true));
    children.push_back(std::move(c));
  }
  const auto deadline = [] { return Clock::now() + kPatience; };
  for (Child& c : children) SLUICE_RETURN_IF_ERROR(c.ReadSignal(deadline()).status());  // attached, standby ready
  for (int64_t v = 1; v <= last; ++v) {
    weights.Stamp(v);
    const auto t0 = Clock::now();
    SLUICE_RETURN_IF_ERROR(pub->Publish(v, weights.tensors()));
    const auto t1 = Clock::now();
    for (Child& c : children) {
      SLUICE_ASSIGN_OR_RETURN(int64_t got, c.ReadSignal(deadline()));
      if (got != v) return Status::Internal("shm subscriber copied version " + std::to_string(got));
    }
    if (v <= config.warmups) {
      m.warmup_seconds.push_back(Seconds(Clock::now() - t0));
    } else {
      m.seconds.push_back(Seconds(Clock::now() - t0));
      m.publish_seconds.push_back(Seconds(t1 - t0));
    }
  }
  for (Child& c : children) SLUICE_RETURN_IF_ERROR(c.Wait(deadline()));
  return m;
}

int ShmSubscriberMain(const std::map<std::string, std::string>& args) {
  ShmSubscriberOptions o;
  o.shm_prefix = args.at("prefix");
  o.store_name = args.at("store");
  o.attach_timeout = std::chrono::seconds(30);
  const size_t bytes = std::stoull(args.at("bytes"));
  const int64_t versions = std::stoll(args.at("versions"));
  o.expected_layout = LayoutForBytes(bytes);
  auto sub = ShmSubscriber::Attach(o);
  if (!sub.ok()) {
    std::fprintf(stderr, "shm-sub: %s\n", sub.status().ToString().c_str());
    return 1;
  }
  Standby standby = MakeStandby(*o.expected_layout);
  SignalParent(-1);  // ready
  int64_t seen = 0;
  while (seen < versions) {
    auto h = (*sub)->WaitForVersion(seen + 1, kPatience);
    if (!h.ok()) {
      std::fprintf(stderr, "shm-sub: %s\n", h.status().ToString().c_str());
      return 1;
    }
    Status copied = h->CopyTo(standby.spans);
    if (!copied.ok()) {
      std::fprintf(stderr, "shm-sub: %s\n", copied.ToString().c_str());
      return 1;
    }
    seen = h->version();
    SignalParent(seen);
  }
  return 0;
}

}  // namespace sluice::bench::ce
