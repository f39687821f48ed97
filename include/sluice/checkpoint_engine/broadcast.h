// The cross-host transport of the CheckpointEngine: the trainer host
// (BroadcastPublisher) broadcasts each weight version over Gloo's TCP
// transport to every subscriber host (BroadcastSubscriber), which stages it
// into its local store — an in-process VersionStore, or the host's
// shared-memory store (ShmPublisher) so that the host's rollout processes map
// it — under the stores' two-phase contract: every byte staged, every
// tensor's checksum verified against the one the publisher computed, then
// commit. A failed or abandoned transfer aborts the staging: the previous
// version keeps serving. Built only where Gloo is available (the library
// sluice_checkpoint_engine_broadcast); this header names no Gloo type.
//
// Control plane and data plane. Peers find each other through a
// RendezvousServer (rendezvous.h), under keys prefixed by `group`. The
// publisher announces itself with an ephemeral hello (protocol version,
// epoch, the layout, stream geometry); a subscriber checks it (another
// protocol or another layout: a clear FailedPrecondition, nothing joins) and
// registers with an ephemeral key of its own, so a dead peer's keys vanish
// with its connection. The publisher forms a *generation*: the subscribers
// that declared themselves ready for it become Gloo ranks 1..N (the
// publisher is rank 0) of a full mesh. Per version the publisher writes a
// small header to the store (magic, protocol, kind, generation, sequence,
// version, layout hash, total bytes and one XXH64 checksum per tensor);
// members validate it, then the bytes flow over Gloo.
//
// Data plane. The layout is cut into buckets of at most bucket_bytes: a
// large tensor is sliced, small ones (under bucket_bytes / 4) are packed
// together. Each bucket is one gloo::broadcast (a binomial tree rooted at the
// publisher); max_in_flight of them run at once on as many threads, so a
// receiver's bucket k+1 arrives while bucket k is forwarded down the tree.
// Slices land directly in the store's staging memory (StageInPlace); packed
// tensors are copied out of their bucket by the receiving thread. A verifier
// thread checksums each tensor as soon as its last piece arrived
// (SealInPlace), while later buckets are still arriving; the store's Commit
// re-verifies. Each member then reports {version, status} to the publisher
// (gloo::gather) and Publish returns once every member answered.
//
// Failures (Gloo collectives are all-or-nothing per group):
//  * A member that dies or stalls mid-transfer breaks the collective for the
//    whole generation: the ranks talking to it fail at once (connection
//    reset); the first failing rank aborts all its operations and marks the
//    generation broken in the rendezvous store, where every subscriber's
//    watchdog sees it, so the other ranks fail within milliseconds too
//    (op_timeout only bounds a peer that is alive but stuck). Every
//    subscriber aborts its staging (serving version untouched) and declares
//    itself ready for the next generation. The
//    publisher forms it from the subscribers still alive (the dead one's
//    ephemeral keys are gone; a live one that does not declare itself ready
//    within reform_timeout is left out) and sends the version again, up to
//    max_attempts times. A subscriber that had already committed it takes
//    part without staging it again. So the survivors finish the version; the
//    report names who was dropped.
//  * A subscriber that rejects a version (its header fails validation, a
//    checksum does not match, its store refuses it) keeps serving its
//    previous version and reports the error; the group stays up, and
//    Publish returns an error naming it.
//  * A subscriber joining late, or coming back, is taken in by the next
//    Publish (the publisher re-forms the group first); it receives versions
//    from then on.
//  * The publisher going away (destroyed, or dead: its hello vanishes) sends
//    subscribers back to waiting for a publisher; their stores keep serving.
//    A new publisher starts a new epoch.
//
// Processes using either class must ignore SIGPIPE (Gloo writes to sockets
// with writev): Start() sets it to SIG_IGN if it is still SIG_DFL.
//
// Thread safety: BroadcastPublisher and BroadcastSubscriber are thread-safe;
// Publish calls are serialized. Each owns its threads (a subscriber's session
// thread and, per generation, a watchdog; per transfer, max_in_flight
// network threads and a verifier) and joins them before returning or on
// destruction (a subscriber stops within ~0.4 s when idle).
#ifndef SLUICE_CHECKPOINT_ENGINE_BROADCAST_H_
#define SLUICE_CHECKPOINT_ENGINE_BROADCAST_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/checkpoint_engine/weights.h"
#include "sluice/common/host_tensor.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine {

// Fault injection for tests; leave empty in production.
struct BroadcastTestHooks {
  // Publisher: announce this protocol version instead of its own.
  std::optional<uint32_t> announced_protocol;
  // Publisher: announce this layout hash instead of the real one, in the
  // hello and in every version header.
  std::optional<uint64_t> announced_layout_hash;
  // Publisher: may rewrite each version's encoded header before it is
  // announced (e.g. to corrupt a checksum or the magic).
  std::function<void(int64_t version, std::string* header)> mutate_header;
  // Called on a sending (publisher) or receiving (subscriber) thread after
  // each bucket of a version, e.g. to pause half way, then be SIGKILLed.
  std::function<void(int64_t version, size_t bucket, size_t buckets)> after_bucket;
};

struct BroadcastPublisherOptions {
  // Required: "host:port" of the RendezvousServer, and the group name
  // (1..64 characters of [A-Za-z0-9_-]); one publisher per group at a time.
  std::string rendezvous_address;
  std::string group;
  // This host's IP on the network the subscribers share; Gloo listens
  // there. Default loopback.
  std::string bind_address = "127.0.0.1";
  // Required; validated as for VersionStoreOptions. Subscribers' stores must
  // have exactly this layout.
  Layout layout;
  size_t max_tensor_bytes = size_t{4} << 30;
  // Bucket size (64 KiB .. 1 GiB) and buckets in flight (1..16): defaults
  // 4 MiB and 2. Memory on every peer: max_in_flight * bucket_bytes of
  // scratch, plus the store's own staging.
  size_t bucket_bytes = size_t{4} << 20;
  uint32_t max_in_flight = 2;
  // The first Publish waits (up to join_timeout) until at least this many
  // subscribers are ready. Later re-formations go on with whoever is ready
  // (a dead subscriber must not stall the trainer; the report names who was
  // dropped). 0: publishing with nobody listening succeeds.
  size_t min_subscribers = 1;
  std::chrono::milliseconds join_timeout{30000};
  // When re-forming the group, how long to wait for a live subscriber that
  // has not declared itself ready (then it is left out until next time).
  std::chrono::milliseconds reform_timeout{2000};
  // Longest any single network step may stall (a Gloo operation, the mesh
  // connect, a rendezvous request) before the generation is given up.
  std::chrono::milliseconds op_timeout{10000};
  // Attempts per version when the group breaks under it (>= 1).
  uint32_t max_attempts = 3;
  BroadcastTestHooks test_hooks;
};

// One subscriber's answer for a version.
struct SubscriberDelivery {
  uint64_t id = 0;
  std::string name;
  // kOk: it serves the version (committed now, or had it already). Else why
  // it rejected it (it keeps serving its previous version).
  StatusCode code = StatusCode::kOk;
};

struct BroadcastPublishReport {
  int64_t version = kNoVersion;
  uint32_t attempts = 0;                        // 1 unless the group broke and was re-formed
  uint64_t generation = 0;                      // of the attempt that delivered
  std::vector<SubscriberDelivery> subscribers;  // members of that generation
  std::vector<std::string> dropped;             // left out when re-forming during this publish
  size_t bytes = 0;                             // one version
  double seconds = 0;                           // Publish call, end to end
  // Where the time went (the last attempt): checksumming the tensors,
  // (re-)forming the group, sending every bucket, and waiting for the
  // members' answers (their verification and commit).
  double checksum_seconds = 0;
  double group_seconds = 0;
  double send_seconds = 0;
  double ack_seconds = 0;
};

struct BroadcastPublisherStats {
  uint64_t epoch = 0;
  uint64_t generation = 0;  // 0 before the first group
  size_t members = 0;
  int64_t latest_version = kNoVersion;  // last version every member acknowledged
  uint64_t versions_published = 0;
  uint64_t generations_formed = 0;
  uint64_t broken_generations = 0;    // generations given up after a failure
  uint64_t rejected_subscribers = 0;  // hellos refused (protocol/layout)
};

class BroadcastPublisher final : public WeightPublisher {
 public:
  // Connects to the rendezvous and announces the publisher. Errors:
  //   InvalidArgument    - malformed options (the field named)
  //   AlreadyExists      - the group has a live publisher
  //   Unavailable        - the rendezvous or the network device is unusable
  static Result<std::unique_ptr<BroadcastPublisher>> Start(BroadcastPublisherOptions options);
  // Tells the members it is leaving, tears the group down, withdraws the hello.
  ~BroadcastPublisher() override;
  BroadcastPublisher(const BroadcastPublisher&) = delete;
  BroadcastPublisher& operator=(const BroadcastPublisher&) = delete;

  // Delivers `version` to every subscriber; returns once each member of
  // the group that delivered it answered. OK: every member serves it. The
  // last version delivered may be published again: subscribers that joined
  // since receive it, the members serving it take part without staging it.
  // Errors (last_report() has the details):
  //   InvalidArgument    - tensors do not match the layout (extra, missing,
  //                        wrong dtype/shape/size)
  //   FailedPrecondition - version below the last one published;
  //                        a member rejected the header (protocol/layout)
  //   DataLoss           - a member's bytes failed their checksum
  //   Unavailable        - fewer than min_subscribers within join_timeout
  //                        (first Publish); the group broke on every
  //                        attempt; the rendezvous connection failed (then
  //                        for good: start a new publisher)
  //   other codes        - a member's store refused the version (named)
  // The tensors are read, not copied, and must stay unchanged during the call.
  Status Publish(int64_t version, const TensorMap& tensors) override;
  // The same, returning the publish's report when it succeeds.
  Result<BroadcastPublishReport> PublishWithReport(int64_t version, const TensorMap& tensors);

  // Whether the next Publish would re-form the group: a subscriber joined
  // (or is ready again) since it was formed, or a member is gone. A few
  // rendezvous reads; waits for a Publish in progress.
  Result<bool> GroupChanged();

  BroadcastPublishReport last_report() const;
  BroadcastPublisherStats stats() const;
  // The last version every member acknowledged.
  int64_t latest_version() const override;
  const Layout& layout() const override;

  struct Impl;

 private:
  explicit BroadcastPublisher(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct BroadcastSubscriberOptions {
  // As for the publisher. bind_address: this host's IP on the shared network.
  std::string rendezvous_address;
  std::string group;
  std::string bind_address = "127.0.0.1";
  // Names this subscriber in reports and messages (1..128 printable
  // characters). Default "<hostname>:<pid>".
  std::string name;
  // Start waits this long for a publisher's hello.
  std::chrono::milliseconds join_timeout{30000};
  std::chrono::milliseconds op_timeout{10000};
  BroadcastTestHooks test_hooks;
};

struct BroadcastSubscriberStats {
  uint64_t subscriber_id = 0;
  uint64_t epoch = 0;
  uint64_t generation = 0;              // 0 while not a member
  int rank = -1;                        // -1 while not a member
  int64_t latest_version = kNoVersion;  // of the local store
  uint64_t versions_committed = 0;
  uint64_t versions_rejected = 0;  // header, checksum or store refused it
  uint64_t transfers_broken = 0;   // the generation failed under a transfer
  Status last_error;               // of the last rejected or broken transfer
  // The last committed version: from its header to its last bucket landed
  // and every tensor sealed (verified), and its commit.
  double last_receive_seconds = 0;
  double last_commit_seconds = 0;
};

class BroadcastSubscriber {
 public:
  // Waits (join_timeout) for the publisher's hello, checks it, registers and
  // starts the session thread; versions then arrive in the background.
  // `store`'s layout must equal the publisher's. Errors:
  //   InvalidArgument    - malformed options; null store
  //   FailedPrecondition - the publisher speaks another protocol, or its
  //                        layout differs (the first difference named)
  //   Timeout            - no publisher within join_timeout
  //   Unavailable        - the rendezvous or the network device is unusable
  // `store` is where this host's readers read: a VersionStore (the readers
  // are in this process), or the host's ShmPublisher (rollout processes
  // attach ShmSubscribers to it and map each version as it is committed).
  static Result<std::unique_ptr<BroadcastSubscriber>> Start(BroadcastSubscriberOptions options,
                                                            std::shared_ptr<TwoPhasePublisher> store);
  // Leaves the group (a transfer in progress is abandoned: staging aborted)
  // and joins its threads; the store keeps serving what it has.
  ~BroadcastSubscriber();
  BroadcastSubscriber(const BroadcastSubscriber&) = delete;
  BroadcastSubscriber& operator=(const BroadcastSubscriber&) = delete;

  // Blocks until the local store serves a version >= at_least (OK), or
  // `timeout` passes (Timeout naming the latest version and last error).
  Status WaitForVersion(int64_t at_least, std::chrono::milliseconds timeout);

  BroadcastSubscriberStats stats() const;

  struct Impl;

 private:
  explicit BroadcastSubscriber(std::unique_ptr<Impl> impl);
  static Result<std::unique_ptr<BroadcastSubscriber>> Launch(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace sluice::checkpoint_engine

#endif  // SLUICE_CHECKPOINT_ENGINE_BROADCAST_H_
