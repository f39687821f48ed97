// BroadcastPublisher: forms generations of subscribers and sends versions
// (protocol: broadcast.h; messages and keys: broadcast_wire.h).
#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "broadcast/broadcast_transfer.h"
#include "broadcast/broadcast_wire.h"
#include "broadcast/gloo_group.h"
#include "core/checksum.h"
#include "core/layout_check.h"
#include "core/socket_util.h"
#include "sluice/checkpoint_engine/broadcast.h"
#include "sluice/checkpoint_engine/rendezvous.h"
#include "sluice/common/logging.h"
#include "sluice/common/mutex.h"

namespace sluice::checkpoint_engine {

using Clock = std::chrono::steady_clock;
using internal::GlooGroup;

namespace {

// The 8-byte counter value of `key`, 0 if it does not exist.
Result<int64_t> ReadCounter(RendezvousClient& kv, const std::string& key) {
  Result<std::string> v = kv.Get(key);
  if (v.status().code() == StatusCode::kNotFound) return int64_t{0};
  if (!v.ok()) return v.status();
  if (v->size() != sizeof(int64_t)) return Status::DataLoss("rendezvous key '" + key + "' is not a counter");
  return internal::LoadLe<int64_t>(reinterpret_cast<const std::byte*>(v->data()));
}

std::string Names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

struct BroadcastPublisher::Impl {
  // A registered subscriber, as last seen.
  struct Known {
    std::string name;
    bool usable = false;  // its hello matched our protocol and layout
    bool gone = false;    // its registration vanished (dead or left)
  };

  BroadcastPublisherOptions options;
  std::vector<size_t> tensor_bytes;
  std::map<std::string, size_t, std::less<>> index;
  bcast::StreamPlan plan;
  uint64_t layout_hash = 0;
  bcast::Keys keys{""};
  uint64_t epoch = 0;
  std::shared_ptr<gloo::transport::Device> device;

  // Publish state: touched with publish_mu held (and by the destructor).
  Mutex publish_mu;
  std::unique_ptr<RendezvousClient> kv SLUICE_GUARDED_BY(publish_mu);
  std::unique_ptr<GlooGroup> group SLUICE_GUARDED_BY(publish_mu);
  bool formed SLUICE_GUARDED_BY(publish_mu) = false;  // a generation is current (possibly with no members)
  uint64_t generation SLUICE_GUARDED_BY(publish_mu) = 0;
  uint64_t seq SLUICE_GUARDED_BY(publish_mu) = 0;
  std::vector<uint64_t> member_ids SLUICE_GUARDED_BY(publish_mu);
  int64_t registrations_at_formation SLUICE_GUARDED_BY(publish_mu) = -1;
  std::map<uint64_t, Known> known SLUICE_GUARDED_BY(publish_mu);
  internal::BucketScratch scratch SLUICE_GUARDED_BY(publish_mu);
  int64_t last_attempted SLUICE_GUARDED_BY(publish_mu) = kNoVersion;

  mutable Mutex stats_mu;
  BroadcastPublisherStats stats SLUICE_GUARDED_BY(stats_mu);
  BroadcastPublishReport last_report SLUICE_GUARDED_BY(stats_mu);

  ~Impl();
  // Errors: from the rendezvous, too few subscribers (not worth retrying),
  // or the mesh connect failed (*retry set: the next generation may work).
  Status EnsureGroup(BroadcastPublishReport* report, bool* retry) SLUICE_REQUIRES(publish_mu);
  // Whether the formed group is out of date: someone registered since, a
  // member is gone, or one left out last time is ready now.
  Result<bool> GroupChanged() SLUICE_REQUIRES(publish_mu);
  Status FormGroup(BroadcastPublishReport* report, bool* retry) SLUICE_REQUIRES(publish_mu);
  void Announce(bcast::Kind kind) SLUICE_REQUIRES(publish_mu);
  void BreakGroup(const Status& why) SLUICE_REQUIRES(publish_mu);
  Result<BroadcastPublishReport> Finish(BroadcastPublishReport report, Status status, Clock::time_point start)
      SLUICE_REQUIRES(publish_mu);
  std::string NameOf(uint64_t id) SLUICE_REQUIRES(publish_mu) {
    auto it = known.find(id);
    return it == known.end() ? "subscriber " + std::to_string(id) : it->second.name;
  }
};

BroadcastPublisher::Impl::~Impl() {
  MutexLock lock(&publish_mu);
  if (kv == nullptr) return;
  if (formed) Announce(bcast::Kind::kShutdown);
  group.reset();
  (void)kv->Delete(keys.Hello());
}

// Best effort: members that miss it notice through `gen` or the hello.
void BroadcastPublisher::Impl::Announce(bcast::Kind kind) {
  bcast::Announcement a;
  a.kind = kind;
  a.generation = generation;
  a.seq = seq;
  if (options.test_hooks.announced_protocol) a.protocol = *options.test_hooks.announced_protocol;
  Status s = kv->Set(keys.Seq(generation, seq), bcast::Encode(a));
  if (!s.ok())
    SLUICE_LOG(WARNING) << "broadcast publisher: cannot announce " << bcast::KindName(kind) << ": " << s.ToString();
  ++seq;
}

void BroadcastPublisher::Impl::BreakGroup(const Status& why) {
  SLUICE_LOG(WARNING) << "broadcast group '" << options.group << "' generation " << generation
                      << " broke: " << why.ToString();
  // Members stuck on a peer that Gloo never reports watch this key.
  (void)kv->Set(keys.Broken(generation), why.message().substr(0, 200));
  group.reset();  // closes every pair: members blocked on us fail at once
  formed = false;
  MutexLock lock(&stats_mu);
  ++stats.broken_generations;
  stats.members = 0;
}

Result<bool> BroadcastPublisher::Impl::GroupChanged() {
  if (!formed) return true;
  SLUICE_ASSIGN_OR_RETURN(int64_t registrations, ReadCounter(*kv, keys.NextId()));
  if (registrations != registrations_at_formation) return true;
  const std::set<uint64_t> members(member_ids.begin(), member_ids.end());
  for (const auto& [id, k] : known) {
    if (k.gone || !k.usable) continue;
    Result<std::string> probe =
        members.count(id) > 0 ? kv->Get(keys.Subscriber(id)) : kv->Get(keys.Ready(generation + 1, id));
    if (members.count(id) > 0 && probe.status().code() == StatusCode::kNotFound) return true;  // gone
    if (members.count(id) == 0 && probe.ok()) return true;                                     // ready
    if (!probe.ok() && probe.status().code() != StatusCode::kNotFound) return probe.status();
  }
  return false;
}

Status BroadcastPublisher::Impl::EnsureGroup(BroadcastPublishReport* report, bool* retry) {
  if (formed) {
    SLUICE_ASSIGN_OR_RETURN(const bool changed, GroupChanged());
    if (!changed) return Status::Ok();
    Announce(bcast::Kind::kReform);
    group.reset();
    formed = false;
  }
  return FormGroup(report, retry);
}

Status BroadcastPublisher::Impl::FormGroup(BroadcastPublishReport* report, bool* retry) {
  const uint64_t g = generation + 1;
  const bool generations_formed_before = generation > 0;
  const std::set<uint64_t> previous(member_ids.begin(), member_ids.end());
  const auto start = Clock::now();
  const auto join_deadline = start + options.join_timeout;
  const auto ready_deadline = start + options.reform_timeout;
  std::vector<uint64_t> ready;
  std::vector<uint64_t> pending;
  int64_t registrations = 0;
  while (true) {
    SLUICE_ASSIGN_OR_RETURN(registrations, ReadCounter(*kv, keys.NextId()));
    ready.clear();
    pending.clear();
    for (uint64_t id = 0; id < static_cast<uint64_t>(registrations); ++id) {
      Known& k = known[id];
      if (k.gone) continue;
      Result<std::string> hello = kv->Get(keys.Subscriber(id));
      if (hello.status().code() == StatusCode::kNotFound) {
        if (!k.name.empty()) {
          k.gone = true;
          if (previous.count(id) > 0) report->dropped.push_back(k.name + " (gone)");
        }
        continue;  // gone, or registered a moment ago and not written yet
      }
      if (!hello.ok()) return hello.status();
      if (k.name.empty()) {
        Result<bcast::SubscriberHello> h = bcast::DecodeSubscriberHello(*hello);
        k.name = h.ok() ? h->name : "subscriber " + std::to_string(id);
        k.usable = h.ok() && h->layout_hash == layout_hash;
        if (!k.usable) {
          SLUICE_LOG(WARNING) << "broadcast group '" << options.group << "': refusing " << k.name << ": "
                              << (h.ok() ? "its layout differs (hash)" : h.status().ToString());
          MutexLock lock(&stats_mu);
          ++stats.rejected_subscribers;
        }
      }
      if (!k.usable) continue;
      Result<std::string> r = kv->Get(keys.Ready(g, id));
      if (r.ok()) {
        ready.push_back(id);
      } else if (r.status().code() == StatusCode::kNotFound) {
        pending.push_back(id);
      } else {
        return r.status();
      }
    }
    const auto now = Clock::now();
    // min_subscribers holds the first formation back; later ones go on with
    // whoever is ready, so a dead subscriber never stalls the trainer.
    const bool enough = ready.size() >= (generations_formed_before ? 0 : options.min_subscribers);
    if (enough && (pending.empty() || now >= ready_deadline)) break;
    // (join_timeout bounds the wait for min_subscribers only: once there are
    // enough, a pending one is waited for until reform_timeout)
    if (!enough && now >= join_deadline) {
      return Status::Unavailable("only " + std::to_string(ready.size()) + " subscriber(s) of group '" + options.group +
                                 "' were ready within join_timeout (" + std::to_string(options.join_timeout.count()) +
                                 " ms); min_subscribers is " + std::to_string(options.min_subscribers));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  for (uint64_t id : pending) {
    if (previous.count(id) > 0) report->dropped.push_back(NameOf(id) + " (not ready within reform_timeout)");
  }

  bcast::Members members;
  members.generation = g;
  members.ids = ready;
  SLUICE_RETURN_IF_ERROR(kv->Set(keys.Members(g), bcast::Encode(members)));
  SLUICE_RETURN_IF_ERROR(kv->Set(keys.Generation(), std::to_string(g)));
  // Keys of the generation before the previous one are no longer read.
  if (g >= 2) {
    (void)kv->Delete(keys.Members(g - 2));
    (void)kv->Delete(keys.Broken(g - 2));
    for (uint64_t id = 0; id < static_cast<uint64_t>(registrations); ++id) (void)kv->Delete(keys.Ready(g - 2, id));
  }
  generation = g;
  seq = 0;
  member_ids = ready;
  registrations_at_formation = registrations;
  {
    MutexLock lock(&stats_mu);
    stats.generation = g;
    stats.members = ready.size();
    ++stats.generations_formed;
  }
  if (!ready.empty()) {
    Result<std::unique_ptr<GlooGroup>> connected = GlooGroup::Connect(
        device, kv.get(), keys.MeshPrefix(g), 0, static_cast<int>(ready.size()) + 1, options.op_timeout);
    if (!connected.ok()) {
      *retry = true;
      BreakGroup(connected.status());
      return connected.status().WithContext("generation " + std::to_string(g));
    }
    group = std::move(connected).value();
  }
  formed = true;
  return Status::Ok();
}

Result<BroadcastPublishReport> BroadcastPublisher::Impl::Finish(BroadcastPublishReport report, Status status,
                                                                Clock::time_point start) {
  report.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  MutexLock lock(&stats_mu);
  last_report = report;
  if (!status.ok()) return status;
  stats.latest_version = report.version;
  ++stats.versions_published;
  return report;
}

// ------------------------------------------------------------------ public

BroadcastPublisher::BroadcastPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BroadcastPublisher::~BroadcastPublisher() = default;

Result<std::unique_ptr<BroadcastPublisher>> BroadcastPublisher::Start(BroadcastPublisherOptions options) {
  SLUICE_RETURN_IF_ERROR(bcast::ValidateGroupName(options.group, "BroadcastPublisherOptions.group"));
  SLUICE_ASSIGN_OR_RETURN(std::vector<size_t> bytes, internal::ValidateLayout(options.layout, options.max_tensor_bytes,
                                                                              "BroadcastPublisherOptions"));
  if (options.bucket_bytes < (size_t{64} << 10) || options.bucket_bytes > (size_t{1} << 30)) {
    return Status::InvalidArgument("BroadcastPublisherOptions.bucket_bytes must be 64 KiB..1 GiB, got " +
                                   std::to_string(options.bucket_bytes));
  }
  if (options.max_in_flight < 1 || options.max_in_flight > 16) {
    return Status::InvalidArgument("BroadcastPublisherOptions.max_in_flight must be 1..16, got " +
                                   std::to_string(options.max_in_flight));
  }
  if (options.max_attempts < 1) return Status::InvalidArgument("BroadcastPublisherOptions.max_attempts must be >= 1");
  if (options.op_timeout.count() <= 0 || options.join_timeout.count() < 0 || options.reform_timeout.count() < 0) {
    return Status::InvalidArgument("BroadcastPublisherOptions: op_timeout must be > 0, other timeouts >= 0");
  }
  internal::IgnoreSigpipe();
  auto impl = std::make_unique<Impl>();
  impl->tensor_bytes = bytes;
  impl->plan = bcast::MakeStreamPlan(bytes, options.bucket_bytes);
  impl->layout_hash = bcast::LayoutHash(options.layout);
  impl->keys = bcast::Keys(options.group);
  for (size_t t = 0; t < options.layout.size(); ++t) impl->index.emplace(options.layout[t].name, t);
  impl->options = std::move(options);
  const BroadcastPublisherOptions& o = impl->options;

  RendezvousClientOptions kv_options;
  kv_options.address = o.rendezvous_address;
  kv_options.connect_timeout = o.op_timeout;
  kv_options.io_timeout = o.op_timeout;
  SLUICE_ASSIGN_OR_RETURN(std::unique_ptr<RendezvousClient> kv, RendezvousClient::Connect(kv_options));
  SLUICE_ASSIGN_OR_RETURN(impl->device, internal::MakeGlooDevice(o.bind_address));
  SLUICE_ASSIGN_OR_RETURN(int64_t epoch, kv->Add(impl->keys.EpochCounter(), 1));
  impl->epoch = static_cast<uint64_t>(epoch);
  impl->keys.set_epoch(impl->epoch);

  bcast::PublisherHello hello;
  if (o.test_hooks.announced_protocol) hello.protocol = *o.test_hooks.announced_protocol;
  hello.epoch = impl->epoch;
  hello.bucket_bytes = o.bucket_bytes;
  hello.max_in_flight = o.max_in_flight;
  hello.layout_hash = o.test_hooks.announced_layout_hash.value_or(impl->layout_hash);
  hello.layout = o.layout;
  Status announced = kv->Set(impl->keys.Hello(), bcast::Encode(hello), KeyLifetime::kEphemeral, /*create_only=*/true);
  if (announced.code() == StatusCode::kAlreadyExists) {
    return Status::AlreadyExists("broadcast group '" + o.group + "' already has a live publisher");
  }
  SLUICE_RETURN_IF_ERROR(announced);
  {
    MutexLock lock(&impl->stats_mu);
    impl->stats.epoch = impl->epoch;
  }
  {
    MutexLock lock(&impl->publish_mu);
    impl->kv = std::move(kv);
  }
  return std::unique_ptr<BroadcastPublisher>(new BroadcastPublisher(std::move(impl)));
}

Status BroadcastPublisher::Publish(int64_t version, const TensorMap& tensors) {
  return PublishWithReport(version, tensors).status();
}

Result<BroadcastPublishReport> BroadcastPublisher::PublishWithReport(int64_t version, const TensorMap& tensors) {
  Impl& m = *impl_;
  const auto start = Clock::now();
  MutexLock lock(&m.publish_mu);
  const std::string what = "cannot publish version " + std::to_string(version);
  int64_t delivered;
  {
    MutexLock stats_lock(&m.stats_mu);
    delivered = m.stats.latest_version;
  }
  SLUICE_RETURN_IF_ERROR(internal::CheckPublishVersion(version, what));
  // The last version delivered may be sent again (to subscribers that joined since).
  if (version < delivered || version < m.last_attempted) {
    return Status::FailedPrecondition(what + ": version " + std::to_string(std::max(delivered, m.last_attempted)) +
                                      " was already published; versions only increase");
  }
  // The tensors, in layout order, each checked against its spec.
  const Layout& layout = m.options.layout;
  std::vector<const std::byte*> data(layout.size(), nullptr);
  std::vector<bool> present(layout.size(), false);
  for (const auto& [name, tensor] : tensors) {
    auto it = m.index.find(name);
    if (it == m.index.end()) {
      return Status::InvalidArgument(what + ": tensor '" + name + "' is not in the registered layout");
    }
    SLUICE_RETURN_IF_ERROR(internal::CheckTensorMatchesSpec(what + ", tensor '" + name + "'", layout[it->second],
                                                            tensor, m.options.max_tensor_bytes));
    data[it->second] = tensor.data;
    present[it->second] = true;
  }
  std::string missing;
  for (size_t t = 0; t < layout.size(); ++t) {
    if (!present[t]) missing += (missing.empty() ? "'" : ", '") + layout[t].name + "'";
  }
  if (!missing.empty()) return Status::InvalidArgument(what + ": tensors missing: " + missing);
  m.last_attempted = version;

  bcast::Announcement header;
  header.kind = bcast::Kind::kVersion;
  header.version = version;
  header.layout_hash = m.options.test_hooks.announced_layout_hash.value_or(m.layout_hash);
  header.total_bytes = m.plan.total_bytes;
  if (m.options.test_hooks.announced_protocol) header.protocol = *m.options.test_hooks.announced_protocol;
  const auto checksum_start = Clock::now();
  for (size_t t = 0; t < layout.size(); ++t) header.checksums.push_back(Checksum64(data[t], m.tensor_bytes[t]));
  const double checksum_seconds = std::chrono::duration<double>(Clock::now() - checksum_start).count();

  BroadcastPublishReport report;
  report.version = version;
  report.bytes = m.plan.total_bytes;
  report.checksum_seconds = checksum_seconds;
  auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  Status last_error;
  m.scratch.Ensure(m.options.max_in_flight, m.options.bucket_bytes);
  for (uint32_t attempt = 1; attempt <= m.options.max_attempts; ++attempt) {
    report.attempts = attempt;
    bool retry = false;
    const auto group_start = Clock::now();
    Status formed = m.EnsureGroup(&report, &retry);
    report.group_seconds = since(group_start);
    if (!formed.ok()) {
      if (!retry) return m.Finish(report, formed.WithContext(what), start);
      last_error = formed;
      continue;
    }
    report.generation = m.generation;
    report.subscribers.clear();
    if (m.member_ids.empty()) return m.Finish(report, Status::Ok(), start);  // nobody to deliver to

    header.generation = m.generation;
    header.seq = m.seq;
    std::string encoded = bcast::Encode(header);
    if (m.options.test_hooks.mutate_header) m.options.test_hooks.mutate_header(version, &encoded);
    Status s = m.kv->Set(m.keys.Seq(m.generation, m.seq), encoded);
    if (!s.ok()) return m.Finish(report, s.WithContext(what), start);  // the rendezvous is gone: sticky
    const uint64_t announced_seq = m.seq++;

    std::function<void(size_t, size_t)> after_bucket;
    if (m.options.test_hooks.after_bucket) {
      after_bucket = [&m, version](size_t bucket, size_t buckets) {
        m.options.test_hooks.after_bucket(version, bucket, buckets);
      };
    }
    const auto send_start = Clock::now();
    s = internal::SendVersion(*m.group, m.plan, data, m.options.max_in_flight, m.scratch, after_bucket);
    report.send_seconds = since(send_start);
    std::vector<bcast::Ack> acks(m.member_ids.size() + 1);
    if (s.ok()) {
      const auto ack_start = Clock::now();
      bcast::Ack own;
      own.version = version;
      s = m.group->Gather(&own, sizeof(own), acks.data(), bcast::kAckTag);
      report.ack_seconds = since(ack_start);
    }
    if (!s.ok()) {
      last_error = s;
      m.BreakGroup(s);
      continue;  // re-form without whoever broke it, and send again
    }
    (void)m.kv->Delete(m.keys.Seq(m.generation, announced_seq));

    std::vector<std::string> failed;
    StatusCode first_failure = StatusCode::kOk;
    for (size_t i = 0; i < m.member_ids.size(); ++i) {
      const bcast::Ack& ack = acks[i + 1];
      SubscriberDelivery d;
      d.id = m.member_ids[i];
      d.name = m.NameOf(d.id);
      // A member that could not read the header acknowledges "no version"
      // with its error; any other mismatch is a corrupt acknowledgement.
      const bool known_code = ack.code >= 0 && ack.code <= static_cast<int32_t>(StatusCode::kInternal);
      const bool for_this = ack.version == version || (ack.version == kNoVersion && ack.code != 0);
      d.code = for_this && known_code ? static_cast<StatusCode>(ack.code) : StatusCode::kDataLoss;
      if (d.code != StatusCode::kOk) {
        failed.push_back(d.name + ": " + std::string(StatusCodeName(d.code)));
        if (first_failure == StatusCode::kOk) first_failure = d.code;
      }
      report.subscribers.push_back(std::move(d));
    }
    if (failed.empty()) return m.Finish(report, Status::Ok(), start);
    return m.Finish(
        report,
        Status(first_failure,
               what + ": " + std::to_string(failed.size()) + " of " + std::to_string(m.member_ids.size()) +
                   " subscriber(s) rejected it and keep serving their previous version (" + Names(failed) + ")"),
        start);
  }
  return m.Finish(report,
                  Status::Unavailable(what + " after " + std::to_string(report.attempts) +
                                      " attempt(s); last error: " + last_error.ToString()),
                  start);
}

Result<bool> BroadcastPublisher::GroupChanged() {
  Impl& m = *impl_;
  MutexLock lock(&m.publish_mu);
  return m.GroupChanged();
}

BroadcastPublishReport BroadcastPublisher::last_report() const {
  MutexLock lock(&impl_->stats_mu);
  return impl_->last_report;
}

BroadcastPublisherStats BroadcastPublisher::stats() const {
  MutexLock lock(&impl_->stats_mu);
  return impl_->stats;
}

int64_t BroadcastPublisher::latest_version() const {
  MutexLock lock(&impl_->stats_mu);
  return impl_->stats.latest_version;
}

const Layout& BroadcastPublisher::layout() const { return impl_->options.layout; }

}  // namespace sluice::checkpoint_engine
