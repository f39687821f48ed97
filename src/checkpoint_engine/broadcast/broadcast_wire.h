// The cross-host broadcast's control messages (stored in the rendezvous
// store), its per-member acknowledgement, the stream plan that cuts a layout
// into buckets, and the rendezvous key names. Both ends derive the plan from
// the layout and bucket_bytes, so the plan itself never travels.
//
// Every message starts with the same 16-byte preamble, which never changes
// between protocol versions: u64 magic "SLCEBCST", u32 protocol version, u32
// kind. So a peer tells a foreign value (magic), another protocol (named) and
// a truncated message apart. Fields are little-endian; lengths and counts are
// checked against limits before use.
//
// Thread safety: pure functions and values.
#ifndef SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_WIRE_H_
#define SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/checkpoint_engine/version_store.h"
#include "sluice/common/status.h"

namespace sluice::checkpoint_engine::bcast {

inline constexpr uint64_t kMagic = 0x5453434245434c53ULL;  // "SLCEBCST" in little-endian bytes
// Bumped on any incompatible change to the messages, the plan or the tags.
inline constexpr uint32_t kProtocolVersion = 1;
inline constexpr size_t kPreambleBytes = 16;
// Limits on decoded messages.
inline constexpr size_t kMaxTensors = size_t{1} << 20;
inline constexpr size_t kMaxNameBytes = 128;
inline constexpr size_t kMaxMembers = 4096;

enum class Kind : uint32_t {
  kPublisherHello = 1,
  kSubscriberHello = 2,
  kMembers = 3,
  kVersion = 4,   // a version follows over Gloo
  kReform = 5,    // leave this generation; the next one is being formed
  kShutdown = 6,  // the publisher is leaving
};
std::string_view KindName(Kind kind);

// Checks the preamble of `bytes` for a message of `kind`. `who` names the
// sender in messages ("the publisher"). Errors: FailedPrecondition for
// another magic or protocol version (both versions named), DataLoss for a
// truncated preamble, InvalidArgument for another kind.
Status CheckPreamble(std::string_view bytes, Kind kind, std::string_view who, uint32_t own_protocol = kProtocolVersion);

uint64_t LayoutHash(const Layout& layout);

struct PublisherHello {
  uint32_t protocol = kProtocolVersion;  // written into the preamble
  uint64_t epoch = 0;
  uint64_t bucket_bytes = 0;
  uint32_t max_in_flight = 0;
  uint64_t layout_hash = 0;
  Layout layout;
};
std::string Encode(const PublisherHello& m);
Result<PublisherHello> DecodePublisherHello(std::string_view bytes);

struct SubscriberHello {
  uint64_t layout_hash = 0;
  int64_t latest_version = kNoVersion;
  std::string name;
};
std::string Encode(const SubscriberHello& m);
Result<SubscriberHello> DecodeSubscriberHello(std::string_view bytes);

struct Members {
  uint64_t generation = 0;
  std::vector<uint64_t> ids;  // subscriber ids; ranks 1..N in this order
};
std::string Encode(const Members& m);
Result<Members> DecodeMembers(std::string_view bytes);

// A sequenced announcement of generation `generation`: a version header
// (kVersion) or a control message (kReform, kShutdown: only the preamble,
// generation and seq are meaningful).
struct Announcement {
  uint32_t protocol = kProtocolVersion;
  Kind kind = Kind::kVersion;
  uint64_t generation = 0;
  uint64_t seq = 0;
  int64_t version = kNoVersion;
  uint64_t layout_hash = 0;
  uint64_t total_bytes = 0;
  std::vector<uint64_t> checksums;  // one per layout tensor
};
std::string Encode(const Announcement& m);
// Any announcement kind; preamble errors as for CheckPreamble.
Result<Announcement> DecodeAnnouncement(std::string_view bytes);

// What each member sends the publisher after a version (gloo::gather).
struct Ack {
  int64_t version = kNoVersion;
  int32_t code = 0;  // StatusCode
  int32_t reserved = 0;
};
static_assert(sizeof(Ack) == 16);

// ------------------------------------------------------------ stream plan

struct Piece {
  uint32_t tensor = 0;
  uint64_t tensor_offset = 0;
  uint64_t bucket_offset = 0;
  uint64_t nbytes = 0;
};
struct Bucket {
  bool packed = false;  // small tensors copied into/out of a scratch buffer
  uint64_t nbytes = 0;
  std::vector<Piece> pieces;
};
struct StreamPlan {
  std::vector<Bucket> buckets;
  std::vector<uint32_t> pieces_per_tensor;  // 0 for an empty tensor
  uint64_t total_bytes = 0;
};
// Tensors of at least bucket_bytes / 4 are sliced into buckets of
// bucket_bytes (the last one shorter); smaller ones are packed, in layout
// order, into buckets of at most bucket_bytes (a pack is closed before a
// sliced tensor). Precondition: bucket_bytes > 0.
StreamPlan MakeStreamPlan(const std::vector<size_t>& tensor_bytes, size_t bucket_bytes);

// ------------------------------------------------------------ keys

// Rendezvous key names of one group (see broadcast.h).
class Keys {
 public:
  explicit Keys(std::string group) : group_(std::move(group)) {}
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }

  std::string Hello() const { return group_ + "/hello"; }
  std::string EpochCounter() const { return group_ + "/epoch"; }
  std::string NextId() const { return Epoch() + "/next_id"; }
  std::string Subscriber(uint64_t id) const { return Epoch() + "/sub/" + std::to_string(id); }
  std::string Generation() const { return Epoch() + "/gen"; }
  std::string Ready(uint64_t gen, uint64_t id) const { return Gen(gen) + "/ready/" + std::to_string(id); }
  std::string Members(uint64_t gen) const { return Gen(gen) + "/members"; }
  std::string MeshPrefix(uint64_t gen) const { return Gen(gen) + "/mesh/"; }
  std::string Seq(uint64_t gen, uint64_t seq) const { return Gen(gen) + "/seq/" + std::to_string(seq); }
  // Set by any member (or the publisher) that saw the generation fail.
  std::string Broken(uint64_t gen) const { return Gen(gen) + "/broken"; }

 private:
  std::string Epoch() const { return group_ + "/e" + std::to_string(epoch_); }
  std::string Gen(uint64_t gen) const { return Epoch() + "/g" + std::to_string(gen); }
  std::string group_;
  uint64_t epoch_ = 0;
};

// OK if `group` is 1..64 characters of [A-Za-z0-9_-].
Status ValidateGroupName(std::string_view group, std::string_view what);

// Gloo tags: bucket threads use kFirstBucketTag + thread index.
inline constexpr uint32_t kAckTag = 1;
inline constexpr uint32_t kFirstBucketTag = 16;

}  // namespace sluice::checkpoint_engine::bcast

#endif  // SLUICE_SRC_CHECKPOINT_ENGINE_BROADCAST_WIRE_H_
