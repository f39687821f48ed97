// BroadcastSubscriber: a session thread that follows the publisher from
// generation to generation and stages each announced version into the
// local store (protocol: broadcast.h; messages and keys: broadcast_wire.h).
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <sstream>
#include <thread>

#include "broadcast/broadcast_transfer.h"
#include "broadcast/broadcast_wire.h"
#include "broadcast/gloo_group.h"
#include "shm/shm_control.h"
#include "sluice/checkpoint_engine/broadcast.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#include "sluice/common/background_thread.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {

using Clock = std::chrono::steady_clock;
using internal::GlooGroup;

namespace {

// Rendezvous waits are cut into slices so the session notices a stop, a
// vanished publisher or a generation it missed.
constexpr std::chrono::milliseconds kWaitSlice{200};

std::string DefaultName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) std::snprintf(host, sizeof(host), "host");
  return std::string(host) + ":" + std::to_string(::getpid());
}

std::string Hex(uint64_t v) {
  std::ostringstream s;
  s << "0x" << std::hex << v;
  return s.str();
}

}  // namespace

struct BroadcastSubscriber::Impl {
  enum class Wait { kGot, kStop, kPublisherGone, kMovedOn, kError };

  BroadcastSubscriberOptions options;
  std::shared_ptr<TwoPhasePublisher> target;  // the local store
  std::vector<size_t> tensor_bytes;
  uint64_t layout_hash = 0;
  std::shared_ptr<gloo::transport::Device> device;
  std::atomic<bool> cancel{false};

  // Session state: Start() fills it before the session thread exists; from
  // then on only the session thread touches it.
  std::unique_ptr<RendezvousClient> kv;
  std::unique_ptr<RendezvousClient> watch_kv;  // the watchdog's own connection
  bcast::Keys keys{""};
  bcast::PublisherHello hello;
  bcast::StreamPlan plan;
  internal::BucketScratch scratch;
  uint64_t id = 0;
  bool registered = false;
  // The epoch of a publisher that went away (dead or shut down): its hello
  // may linger a moment; only another epoch is worth registering with. A
  // subscriber that merely lost its rendezvous connection re-registers with
  // the same publisher.
  uint64_t departed_epoch = 0;

  mutable Mutex mu;
  CondVar committed_cv;
  BroadcastSubscriberStats stats SLUICE_GUARDED_BY(mu);

  BackgroundThread thread{"sl-bcast-sub"};

  Status Connect();
  Status AcceptHello(std::string_view bytes);
  Status Register();
  void Session(std::stop_token stop);
  bool WaitForPublisher(std::stop_token stop);
  Wait WaitKey(const std::string& key, std::stop_token stop, uint64_t leave_when_generation_reaches,
               std::string* value);
  Result<uint64_t> CurrentGeneration();
  // Follows one generation until it ends; true if it ended for every member
  // (re-formed, broken, publisher gone), false if this subscriber stopped.
  bool RunGeneration(std::stop_token stop, GlooGroup& group, uint64_t generation);
  bool ReceiveOne(GlooGroup& group, const Result<bcast::Announcement>& announced, uint64_t generation, uint64_t seq);
  void RecordError(const Status& s, bool broken);
  void PublisherDeparted() {
    registered = false;
    departed_epoch = hello.epoch;
  }
};

void BroadcastSubscriber::Impl::RecordError(const Status& s, bool broken) {
  SLUICE_LOG(WARNING) << "broadcast subscriber " << options.name << ": " << s.ToString();
  MutexLock lock(&mu);
  stats.last_error = s;
  if (broken) {
    ++stats.transfers_broken;
  } else {
    ++stats.versions_rejected;
  }
}

Status BroadcastSubscriber::Impl::Connect() {
  RendezvousClientOptions o;
  o.address = options.rendezvous_address;
  o.connect_timeout = options.op_timeout;
  o.io_timeout = options.op_timeout;
  SLUICE_ASSIGN_OR_RETURN(kv, RendezvousClient::Connect(o));
  return Status::Ok();
}

Status BroadcastSubscriber::Impl::AcceptHello(std::string_view bytes) {
  const std::string what = "cannot subscribe to broadcast group '" + options.group + "'";
  Result<bcast::PublisherHello> h = bcast::DecodePublisherHello(bytes);
  if (!h.ok()) return h.status().WithContext(what);
  const Layout& local = target->layout();
  const std::string diff = shm::DescribeLayoutDifference(local, h->layout);
  if (!diff.empty()) {
    return Status::FailedPrecondition(what + ": the publisher's layout differs from the local store's (" +
                                      std::string(diff) + ")");
  }
  if (h->layout_hash != layout_hash) {
    return Status::FailedPrecondition(what + ": the publisher announces layout hash " + Hex(h->layout_hash) +
                                      ", the local store's layout hashes to " + Hex(layout_hash));
  }
  if (h->bucket_bytes > (size_t{1} << 30) || h->max_in_flight > 16) {
    return Status::FailedPrecondition(what + ": the publisher asks for buckets of " + std::to_string(h->bucket_bytes) +
                                      " bytes, " + std::to_string(h->max_in_flight) + " in flight (limits 1 GiB, 16)");
  }
  hello = std::move(h).value();
  keys.set_epoch(hello.epoch);
  plan = bcast::MakeStreamPlan(tensor_bytes, hello.bucket_bytes);
  scratch.Ensure(hello.max_in_flight, hello.bucket_bytes);
  return Status::Ok();
}

Status BroadcastSubscriber::Impl::Register() {
  SLUICE_ASSIGN_OR_RETURN(int64_t next, kv->Add(keys.NextId(), 1));
  id = static_cast<uint64_t>(next - 1);
  bcast::SubscriberHello mine;
  mine.layout_hash = layout_hash;
  mine.latest_version = target->latest_version();
  mine.name = options.name;
  SLUICE_RETURN_IF_ERROR(kv->Set(keys.Subscriber(id), bcast::Encode(mine), KeyLifetime::kEphemeral));
  registered = true;
  MutexLock lock(&mu);
  stats.subscriber_id = id;
  stats.epoch = hello.epoch;
  return Status::Ok();
}

Result<uint64_t> BroadcastSubscriber::Impl::CurrentGeneration() {
  Result<std::string> g = kv->Get(keys.Generation());
  if (g.status().code() == StatusCode::kNotFound) return uint64_t{0};
  if (!g.ok()) return g.status();
  uint64_t value = 0;
  auto [end, ec] = std::from_chars(g->data(), g->data() + g->size(), value);
  if (ec != std::errc() || end != g->data() + g->size()) return Status::DataLoss("malformed generation '" + *g + "'");
  return value;
}

// Waits for `key` in slices; between slices checks for a stop, for the
// publisher's hello vanishing or changing epoch, and (if non-zero) for the
// current generation reaching `leave_when_generation_reaches`.
BroadcastSubscriber::Impl::Wait BroadcastSubscriber::Impl::WaitKey(const std::string& key, std::stop_token stop,
                                                                   uint64_t leave_when_generation_reaches,
                                                                   std::string* value) {
  while (!stop.stop_requested()) {
    Result<std::string> v = kv->Get(key, kWaitSlice);
    if (v.ok()) {
      *value = std::move(v).value();
      return Wait::kGot;
    }
    if (v.status().code() != StatusCode::kTimeout) {
      RecordError(v.status(), /*broken=*/true);
      return Wait::kError;
    }
    Result<std::string> current = kv->Get(keys.Hello());
    if (!current.ok()) {
      if (current.status().code() != StatusCode::kNotFound) return Wait::kError;
      return Wait::kPublisherGone;
    }
    Result<bcast::PublisherHello> h = bcast::DecodePublisherHello(*current);
    if (!h.ok() || h->epoch != hello.epoch) return Wait::kPublisherGone;
    if (leave_when_generation_reaches > 0) {
      Result<uint64_t> g = CurrentGeneration();
      if (!g.ok()) return Wait::kError;
      if (*g >= leave_when_generation_reaches) return Wait::kMovedOn;
    }
  }
  return Wait::kStop;
}

// After the publisher went away: waits for a new one (another epoch) whose
// hello this subscriber accepts, then registers with it.
bool BroadcastSubscriber::Impl::WaitForPublisher(std::stop_token stop) {
  {
    MutexLock lock(&mu);
    stats.generation = 0;
    stats.rank = -1;
  }
  while (!stop.stop_requested()) {
    if (kv == nullptr) {
      Status s = Connect();
      if (!s.ok()) {
        RecordError(s, /*broken=*/true);
        std::this_thread::sleep_for(kWaitSlice);
        continue;
      }
    }
    Result<std::string> bytes = kv->Get(keys.Hello(), kWaitSlice);
    if (bytes.status().code() == StatusCode::kTimeout || bytes.status().code() == StatusCode::kNotFound) continue;
    if (!bytes.ok()) {
      kv.reset();  // the rendezvous connection failed: reconnect
      continue;
    }
    Result<bcast::PublisherHello> h = bcast::DecodePublisherHello(*bytes);
    if (h.ok() && h->epoch == departed_epoch) {
      std::this_thread::sleep_for(kWaitSlice / 4);  // the old hello is still being withdrawn
      continue;
    }
    Status accepted = AcceptHello(*bytes);
    if (!accepted.ok()) {
      // An incompatible publisher: report it once per epoch, keep waiting.
      RecordError(accepted, /*broken=*/true);
      if (h.ok())
        departed_epoch = h->epoch;  // reported once; wait for another publisher
      else
        std::this_thread::sleep_for(kWaitSlice);
      continue;
    }
    Status registered_now = Register();
    if (!registered_now.ok()) {
      RecordError(registered_now, /*broken=*/true);
      kv.reset();
      continue;
    }
    return true;
  }
  return false;
}

void BroadcastSubscriber::Impl::Session(std::stop_token stop) {
  uint64_t next_generation = 0;
  while (!stop.stop_requested()) {
    if (!registered || kv == nullptr) {
      registered = false;
      if (!WaitForPublisher(stop)) return;
      next_generation = 0;
    }
    Result<uint64_t> current = CurrentGeneration();
    if (!current.ok()) {
      kv.reset();
      continue;
    }
    next_generation = std::max(next_generation, *current + 1);
    const uint64_t g = next_generation;
    if (Status s = kv->Set(keys.Ready(g, id), "", KeyLifetime::kEphemeral); !s.ok()) {
      kv.reset();
      continue;
    }
    std::string members_bytes;
    switch (WaitKey(keys.Members(g), stop, g + 1, &members_bytes)) {
      case Wait::kGot:
        break;
      case Wait::kStop:
        return;
      case Wait::kPublisherGone:
        PublisherDeparted();
        continue;
      case Wait::kError:
        kv.reset();
        continue;
      case Wait::kMovedOn:
        (void)kv->Delete(keys.Ready(g, id));
        continue;
    }
    (void)kv->Delete(keys.Ready(g, id));
    Result<bcast::Members> members = bcast::DecodeMembers(members_bytes);
    if (!members.ok()) {
      RecordError(members.status(), /*broken=*/true);
      ++next_generation;
      continue;
    }
    auto self = std::find(members->ids.begin(), members->ids.end(), id);
    if (self == members->ids.end()) {
      ++next_generation;  // formed without us (too late): ready for the next one
      continue;
    }
    const int rank = static_cast<int>(self - members->ids.begin()) + 1;
    Result<std::unique_ptr<GlooGroup>> group = GlooGroup::Connect(
        device, kv.get(), keys.MeshPrefix(g), rank, static_cast<int>(members->ids.size()) + 1, options.op_timeout);
    if (!group.ok()) {
      RecordError(group.status().WithContext("generation " + std::to_string(g)), /*broken=*/true);
      ++next_generation;
      continue;
    }
    {
      MutexLock lock(&mu);
      stats.generation = g;
      stats.rank = rank;
    }
    // The watchdog aborts the group as soon as anyone declares this
    // generation broken: a rank waiting on a peer whose death Gloo does not
    // report (see GlooGroup::Abort) fails at once instead of at op_timeout.
    if (watch_kv == nullptr) {
      RendezvousClientOptions wo;
      wo.address = options.rendezvous_address;
      wo.connect_timeout = options.op_timeout;
      wo.io_timeout = options.op_timeout;
      Result<std::unique_ptr<RendezvousClient>> c = RendezvousClient::Connect(wo);
      if (c.ok()) watch_kv = std::move(c).value();
    }
    std::jthread watchdog;
    if (watch_kv != nullptr) {
      GlooGroup* watched = group->get();
      const std::string broken_key = keys.Broken(g);
      watchdog = std::jthread([this, watched, broken_key](std::stop_token watch_stop) {
        while (!watch_stop.stop_requested()) {
          Result<std::string> broken = watch_kv->Get(broken_key, kWaitSlice);
          if (broken.ok()) {
            watched->Abort();
            return;
          }
          if (broken.status().code() != StatusCode::kTimeout) {
            watch_kv.reset();  // reconnected for the next generation
            return;
          }
        }
      });
    }
    const bool ended = RunGeneration(stop, **group, g);
    // The generation is over for everyone: saying so also wakes our
    // watchdog. (A subscriber that merely stops must not break the others.)
    if (ended && kv != nullptr) (void)kv->Set(keys.Broken(g), "");
    if (watchdog.joinable()) {
      watchdog.request_stop();
      watchdog.join();
    }
    group->reset();  // closes our pairs: peers still blocked on us fail at once
    {
      MutexLock lock(&mu);
      stats.generation = 0;
      stats.rank = -1;
    }
    ++next_generation;
  }
}

bool BroadcastSubscriber::Impl::RunGeneration(std::stop_token stop, GlooGroup& group, uint64_t generation) {
  for (uint64_t seq = 0;; ++seq) {
    std::string bytes;
    switch (WaitKey(keys.Seq(generation, seq), stop, generation + 1, &bytes)) {
      case Wait::kGot:
        break;
      case Wait::kStop:
        return false;
      case Wait::kPublisherGone:
        PublisherDeparted();
        return true;
      case Wait::kError:
        kv.reset();
        return false;
      case Wait::kMovedOn:
        return true;
    }
    Result<bcast::Announcement> a = bcast::DecodeAnnouncement(bytes);
    if (a.ok() && a->kind == bcast::Kind::kReform) return true;
    if (a.ok() && a->kind == bcast::Kind::kShutdown) {
      PublisherDeparted();
      return true;
    }
    // A version header, or one we cannot read, which can only have been
    // meant as one: take part in the collective either way.
    if (!ReceiveOne(group, a, generation, seq)) return !cancel.load(std::memory_order_acquire);
  }
}

// One announced version. False if the group broke (leave the generation).
bool BroadcastSubscriber::Impl::ReceiveOne(GlooGroup& group, const Result<bcast::Announcement>& announced,
                                           uint64_t generation, uint64_t seq) {
  Status verdict = announced.status();
  const int64_t version = announced.ok() ? announced->version : kNoVersion;
  const std::string what = "version " + std::to_string(version);
  if (verdict.ok()) {
    const bcast::Announcement& a = *announced;
    if (a.generation != generation || a.seq != seq) {
      verdict = Status::DataLoss(what + ": header is for generation " + std::to_string(a.generation) + " seq " +
                                 std::to_string(a.seq) + ", expected " + std::to_string(generation) + " seq " +
                                 std::to_string(seq));
    } else if (a.layout_hash != layout_hash) {
      verdict = Status::FailedPrecondition(what + ": header announces layout hash " + Hex(a.layout_hash) +
                                           ", the local store's layout hashes to " + Hex(layout_hash));
    } else if (a.checksums.size() != tensor_bytes.size() || a.total_bytes != plan.total_bytes) {
      verdict =
          Status::DataLoss(what + ": header has " + std::to_string(a.checksums.size()) + " checksums and " +
                           std::to_string(a.total_bytes) + " bytes, the layout " + std::to_string(tensor_bytes.size()) +
                           " tensors and " + std::to_string(plan.total_bytes) + " bytes");
    }
  }

  std::unique_ptr<StagedWeights> staged;
  internal::ReceiveOptions ro;
  ro.cancel = &cancel;
  if (verdict.ok()) {
    const int64_t latest = target->latest_version();
    if (version < latest) {
      verdict = Status::FailedPrecondition(what + " is older than the local store's latest version " +
                                           std::to_string(latest));
    } else if (version > latest) {  // == latest: already serving it, just take part
      Result<std::unique_ptr<StagedWeights>> begun = target->BeginPublish(version);
      if (begun.ok()) {
        staged = std::move(begun).value();
        for (size_t t = 0; t < tensor_bytes.size() && verdict.ok(); ++t) {
          Result<std::span<std::byte>> span = staged->StageInPlace(target->layout()[t].name);
          if (span.ok())
            ro.destinations.push_back(*span);
          else
            verdict = span.status();
        }
        if (!verdict.ok()) {
          staged.reset();
          ro.destinations.clear();
        }
      } else {
        verdict = begun.status();
      }
    }
  }
  if (staged != nullptr) {
    const std::vector<uint64_t>& checksums = announced->checksums;
    StagedWeights* s = staged.get();
    const Layout* layout = &target->layout();
    ro.seal = [s, layout, &checksums](size_t t) { return s->SealInPlace((*layout)[t].name, checksums[t]); };
  }
  if (options.test_hooks.after_bucket) {
    ro.after_bucket = [this, version](size_t bucket, size_t buckets) {
      options.test_hooks.after_bucket(version, bucket, buckets);
    };
  }
  const auto receive_start = Clock::now();
  internal::ReceiveResult r = internal::ReceiveVersion(group, plan, hello.max_in_flight, scratch, ro);
  const auto received = Clock::now();
  if (!r.network.ok()) {
    staged.reset();  // aborts: the previous version keeps serving
    RecordError(r.network.WithContext(what + " abandoned"), /*broken=*/true);
    return false;
  }
  if (staged != nullptr) {
    verdict = r.sealed.ok() ? staged->Commit() : r.sealed;
    staged.reset();
    if (verdict.ok()) {
      MutexLock lock(&mu);
      stats.latest_version = version;
      ++stats.versions_committed;
      stats.last_receive_seconds = std::chrono::duration<double>(received - receive_start).count();
      stats.last_commit_seconds = std::chrono::duration<double>(Clock::now() - received).count();
      committed_cv.NotifyAll();
    }
  }
  if (!verdict.ok()) RecordError(verdict, /*broken=*/false);

  bcast::Ack ack;
  ack.version = version;
  ack.code = static_cast<int32_t>(verdict.code());
  Status gathered = group.Gather(&ack, sizeof(ack), nullptr, bcast::kAckTag);
  if (!gathered.ok()) {
    RecordError(gathered.WithContext(what + " acknowledgement"), /*broken=*/true);
    return false;
  }
  return true;
}

// ------------------------------------------------------------------ public

BroadcastSubscriber::BroadcastSubscriber(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

BroadcastSubscriber::~BroadcastSubscriber() {
  impl_->cancel.store(true, std::memory_order_release);
  impl_->thread.Stop();
}

namespace {

Result<std::unique_ptr<BroadcastSubscriber::Impl>> MakeImpl(BroadcastSubscriberOptions options,
                                                            std::shared_ptr<TwoPhasePublisher> target) {
  SLUICE_RETURN_IF_ERROR(bcast::ValidateGroupName(options.group, "BroadcastSubscriberOptions.group"));
  if (options.name.empty()) options.name = DefaultName();
  if (options.name.size() > bcast::kMaxNameBytes) {
    return Status::InvalidArgument("BroadcastSubscriberOptions.name is longer than 128 bytes");
  }
  if (options.op_timeout.count() <= 0 || options.join_timeout.count() < 0) {
    return Status::InvalidArgument("BroadcastSubscriberOptions: op_timeout must be > 0, join_timeout >= 0");
  }
  auto impl = std::make_unique<BroadcastSubscriber::Impl>();
  for (const TensorSpec& spec : target->layout()) {
    impl->tensor_bytes.push_back(CheckedNumel(spec.shape).value() * DTypeSize(spec.dtype));
  }
  impl->layout_hash = bcast::LayoutHash(target->layout());
  impl->keys = bcast::Keys(options.group);
  impl->target = std::move(target);
  impl->options = std::move(options);
  {
    MutexLock lock(&impl->mu);
    impl->stats.latest_version = impl->target->latest_version();
  }
  return impl;
}

}  // namespace

Result<std::unique_ptr<BroadcastSubscriber>> BroadcastSubscriber::Start(BroadcastSubscriberOptions options,
                                                                        std::shared_ptr<TwoPhasePublisher> store) {
  if (store == nullptr) return Status::InvalidArgument("BroadcastSubscriber::Start: null store");
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, MakeImpl(std::move(options), std::move(store)));
  return Launch(std::move(impl));
}

Result<std::unique_ptr<BroadcastSubscriber>> BroadcastSubscriber::Launch(std::unique_ptr<Impl> impl) {
  internal::IgnoreSigpipe();
  const BroadcastSubscriberOptions& o = impl->options;
  SLUICE_RETURN_IF_ERROR(impl->Connect());
  SLUICE_ASSIGN_OR_RETURN(impl->device, internal::MakeGlooDevice(o.bind_address));
  Result<std::string> hello = impl->kv->Get(impl->keys.Hello(), o.join_timeout);
  if (hello.status().code() == StatusCode::kTimeout || hello.status().code() == StatusCode::kNotFound) {
    return Status::Timeout("no publisher announced broadcast group '" + o.group + "' at " + o.rendezvous_address +
                           " within join_timeout (" + std::to_string(o.join_timeout.count()) + " ms)");
  }
  if (!hello.ok()) return hello.status();
  SLUICE_RETURN_IF_ERROR(impl->AcceptHello(*hello));
  SLUICE_RETURN_IF_ERROR(impl->Register());
  Impl* raw = impl.get();
  SLUICE_RETURN_IF_ERROR(impl->thread.Start([raw](std::stop_token stop) { raw->Session(stop); }));
  return std::unique_ptr<BroadcastSubscriber>(new BroadcastSubscriber(std::move(impl)));
}

Status BroadcastSubscriber::WaitForVersion(int64_t at_least, std::chrono::milliseconds timeout) {
  Impl& m = *impl_;
  MutexLock lock(&m.mu);
  const bool arrived = m.committed_cv.WaitFor(&m.mu, timeout, [&m, at_least]() SLUICE_NO_THREAD_SAFETY_ANALYSIS {
    return m.target->latest_version() >= at_least;
  });
  if (arrived) return Status::Ok();
  return Status::Timeout("no version >= " + std::to_string(at_least) + " within " + std::to_string(timeout.count()) +
                         " ms; the local store serves " + std::to_string(m.target->latest_version()) +
                         (m.stats.last_error.ok() ? "" : "; last error: " + m.stats.last_error.ToString()));
}

BroadcastSubscriberStats BroadcastSubscriber::stats() const {
  MutexLock lock(&impl_->mu);
  BroadcastSubscriberStats s = impl_->stats;
  s.latest_version = impl_->target->latest_version();
  return s;
}

}  // namespace sluice::checkpoint_engine
