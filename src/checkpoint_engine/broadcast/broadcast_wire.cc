#include "broadcast/broadcast_wire.h"

#include <iterator>
#include <sstream>

#include "core/checksum.h"
#include "core/socket_util.h"
#include "shm/shm_format.h"
#include "sluice/common/enum_names.h"

namespace sluice::checkpoint_engine::bcast {
namespace {

using internal::LoadLe;
using internal::StoreLe;

class Writer {
 public:
  Writer(Kind kind, uint32_t protocol) {
    Put<uint64_t>(kMagic);
    Put<uint32_t>(protocol);
    Put<uint32_t>(static_cast<uint32_t>(kind));
  }
  template <typename T>
  void Put(T v) {
    std::byte b[sizeof(T)];
    StoreLe<T>(b, v);
    out_.append(reinterpret_cast<const char*>(b), sizeof(T));
  }
  void PutBytes(std::string_view bytes) {
    Put<uint32_t>(static_cast<uint32_t>(bytes.size()));
    out_.append(bytes);
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Bounds-checked reading after the preamble; the first failure sticks.
class Reader {
 public:
  Reader(std::string_view bytes, std::string what) : bytes_(bytes), pos_(kPreambleBytes), what_(std::move(what)) {}
  template <typename T>
  T Get(const char* field) {
    if (!ok() || bytes_.size() - pos_ < sizeof(T)) {
      Fail(std::string("truncated before ") + field);
      return T{};
    }
    T v = LoadLe<T>(reinterpret_cast<const std::byte*>(bytes_.data() + pos_));
    pos_ += sizeof(T);
    return v;
  }
  std::string_view GetBytes(const char* field, size_t limit) {
    const uint32_t n = Get<uint32_t>(field);
    if (!ok()) return {};
    if (n > limit) {
      Fail(std::string(field) + " is " + std::to_string(n) + " bytes, over the limit of " + std::to_string(limit));
      return {};
    }
    if (bytes_.size() - pos_ < n) {
      Fail(std::string("truncated inside ") + field);
      return {};
    }
    std::string_view v = bytes_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  // Count fields: checked against a limit and against what is left, so a
  // bogus count never drives an allocation.
  size_t GetCount(const char* field, size_t limit, size_t bytes_each) {
    const uint32_t n = Get<uint32_t>(field);
    if (!ok()) return 0;
    if (n > limit || (bytes_each > 0 && n > (bytes_.size() - pos_) / bytes_each)) {
      Fail(std::string(field) + " " + std::to_string(n) + " is over the limit of " + std::to_string(limit) +
           " or longer than the message");
      return 0;
    }
    return n;
  }
  void Fail(const std::string& why) {
    if (status_.ok()) {
      status_ = Status::DataLoss(what_ + " is malformed at byte " + std::to_string(pos_) + " of " +
                                 std::to_string(bytes_.size()) + ": " + why);
    }
  }
  Status Finish() {
    if (ok() && pos_ != bytes_.size()) Fail(std::to_string(bytes_.size() - pos_) + " trailing bytes");
    return status_;
  }
  bool ok() const { return status_.ok(); }

 private:
  std::string_view bytes_;
  size_t pos_;
  std::string what_;
  Status status_;
};

}  // namespace

std::string_view KindName(Kind kind) {
  // (Kinds count from 1: 0 is no message's.)
  static constexpr const char* kNames[] = {"unknown message", "publisher hello", "subscriber hello", "member list",
                                           "version header",  "re-form notice",  "shutdown notice"};
  static_assert(std::size(kNames) == static_cast<size_t>(Kind::kShutdown) + 1);
  return EnumName(kNames, kind, "unknown message");
}

Status CheckPreamble(std::string_view bytes, Kind kind, std::string_view who, uint32_t own_protocol) {
  const std::string what = std::string(KindName(kind)) + " from " + std::string(who);
  if (bytes.size() < kPreambleBytes) {
    return Status::DataLoss(what + " is truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                            std::to_string(kPreambleBytes) + "-byte preamble");
  }
  const auto* b = reinterpret_cast<const std::byte*>(bytes.data());
  const uint64_t magic = LoadLe<uint64_t>(b);
  if (magic != kMagic) {
    std::ostringstream msg;
    msg << what << " is not a Sluice broadcast message (magic 0x" << std::hex << magic << ", expected 0x" << kMagic
        << ")";
    return Status::FailedPrecondition(msg.str());
  }
  const uint32_t protocol = LoadLe<uint32_t>(b + 8);
  if (protocol != own_protocol) {
    return Status::FailedPrecondition(std::string(who) + " speaks broadcast protocol version " +
                                      std::to_string(protocol) + "; this peer speaks version " +
                                      std::to_string(own_protocol) + " (peers must run the same protocol)");
  }
  const uint32_t found = LoadLe<uint32_t>(b + 12);
  const bool kind_ok = kind == Kind::kVersion ? (found == static_cast<uint32_t>(Kind::kVersion) ||
                                                 found == static_cast<uint32_t>(Kind::kReform) ||
                                                 found == static_cast<uint32_t>(Kind::kShutdown))
                                              : found == static_cast<uint32_t>(kind);
  if (!kind_ok) {
    return Status::InvalidArgument(what + ": unexpected message kind " + std::to_string(found));
  }
  return Status::Ok();
}

uint64_t LayoutHash(const Layout& layout) {
  const std::string blob = shm::SerializeLayout(layout);
  return Checksum64(blob.data(), blob.size(), /*seed=*/0x62636173ULL + layout.size());
}

std::string Encode(const PublisherHello& m) {
  Writer w(Kind::kPublisherHello, m.protocol);
  w.Put<uint64_t>(m.epoch);
  w.Put<uint64_t>(m.bucket_bytes);
  w.Put<uint32_t>(m.max_in_flight);
  w.Put<uint64_t>(m.layout_hash);
  w.Put<uint32_t>(static_cast<uint32_t>(m.layout.size()));
  w.PutBytes(shm::SerializeLayout(m.layout));
  return w.Take();
}

Result<PublisherHello> DecodePublisherHello(std::string_view bytes) {
  SLUICE_RETURN_IF_ERROR(CheckPreamble(bytes, Kind::kPublisherHello, "the publisher"));
  Reader r(bytes, "the publisher's hello");
  PublisherHello m;
  m.epoch = r.Get<uint64_t>("epoch");
  m.bucket_bytes = r.Get<uint64_t>("bucket_bytes");
  m.max_in_flight = r.Get<uint32_t>("max_in_flight");
  m.layout_hash = r.Get<uint64_t>("layout_hash");
  const uint32_t tensors = r.Get<uint32_t>("tensor count");
  std::string_view blob = r.GetBytes("layout", size_t{256} << 20);
  SLUICE_RETURN_IF_ERROR(r.Finish());
  if (tensors == 0 || tensors > kMaxTensors) {
    return Status::DataLoss("the publisher's hello announces " + std::to_string(tensors) + " tensors (1.." +
                            std::to_string(kMaxTensors) + " allowed)");
  }
  if (m.bucket_bytes == 0 || m.max_in_flight == 0 || m.max_in_flight > 64) {
    return Status::DataLoss("the publisher's hello has bucket_bytes " + std::to_string(m.bucket_bytes) +
                            " and max_in_flight " + std::to_string(m.max_in_flight));
  }
  SLUICE_ASSIGN_OR_RETURN(m.layout,
                          shm::ParseLayout(reinterpret_cast<const std::byte*>(blob.data()), blob.size(), tensors));
  return m;
}

std::string Encode(const SubscriberHello& m) {
  Writer w(Kind::kSubscriberHello, kProtocolVersion);
  w.Put<uint64_t>(m.layout_hash);
  w.Put<int64_t>(m.latest_version);
  w.PutBytes(m.name);
  return w.Take();
}

Result<SubscriberHello> DecodeSubscriberHello(std::string_view bytes) {
  SLUICE_RETURN_IF_ERROR(CheckPreamble(bytes, Kind::kSubscriberHello, "a subscriber"));
  Reader r(bytes, "a subscriber's hello");
  SubscriberHello m;
  m.layout_hash = r.Get<uint64_t>("layout_hash");
  m.latest_version = r.Get<int64_t>("latest_version");
  m.name = std::string(r.GetBytes("name", kMaxNameBytes));
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::string Encode(const Members& m) {
  Writer w(Kind::kMembers, kProtocolVersion);
  w.Put<uint64_t>(m.generation);
  w.Put<uint32_t>(static_cast<uint32_t>(m.ids.size()));
  for (uint64_t id : m.ids) w.Put<uint64_t>(id);
  return w.Take();
}

Result<Members> DecodeMembers(std::string_view bytes) {
  SLUICE_RETURN_IF_ERROR(CheckPreamble(bytes, Kind::kMembers, "the publisher"));
  Reader r(bytes, "the member list");
  Members m;
  m.generation = r.Get<uint64_t>("generation");
  const size_t n = r.GetCount("member count", kMaxMembers, sizeof(uint64_t));
  for (size_t i = 0; i < n && r.ok(); ++i) m.ids.push_back(r.Get<uint64_t>("member id"));
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return m;
}

std::string Encode(const Announcement& m) {
  Writer w(m.kind, m.protocol);
  w.Put<uint64_t>(m.generation);
  w.Put<uint64_t>(m.seq);
  w.Put<int64_t>(m.version);
  w.Put<uint64_t>(m.layout_hash);
  w.Put<uint64_t>(m.total_bytes);
  w.Put<uint32_t>(static_cast<uint32_t>(m.checksums.size()));
  for (uint64_t c : m.checksums) w.Put<uint64_t>(c);
  return w.Take();
}

Result<Announcement> DecodeAnnouncement(std::string_view bytes) {
  SLUICE_RETURN_IF_ERROR(CheckPreamble(bytes, Kind::kVersion, "the publisher"));
  Announcement m;
  m.kind = static_cast<Kind>(LoadLe<uint32_t>(reinterpret_cast<const std::byte*>(bytes.data()) + 12));
  Reader r(bytes, "the publisher's " + std::string(KindName(m.kind)));
  m.generation = r.Get<uint64_t>("generation");
  m.seq = r.Get<uint64_t>("seq");
  m.version = r.Get<int64_t>("version");
  m.layout_hash = r.Get<uint64_t>("layout_hash");
  m.total_bytes = r.Get<uint64_t>("total_bytes");
  const size_t n = r.GetCount("checksum count", kMaxTensors, sizeof(uint64_t));
  m.checksums.reserve(n);
  for (size_t i = 0; i < n && r.ok(); ++i) m.checksums.push_back(r.Get<uint64_t>("checksum"));
  SLUICE_RETURN_IF_ERROR(r.Finish());
  return m;
}

StreamPlan MakeStreamPlan(const std::vector<size_t>& tensor_bytes, size_t bucket_bytes) {
  StreamPlan plan;
  plan.pieces_per_tensor.assign(tensor_bytes.size(), 0);
  Bucket pack;
  pack.packed = true;
  auto flush = [&] {
    if (!pack.pieces.empty()) plan.buckets.push_back(std::move(pack));
    pack = Bucket();
    pack.packed = true;
  };
  for (size_t t = 0; t < tensor_bytes.size(); ++t) {
    const uint64_t n = tensor_bytes[t];
    plan.total_bytes += n;
    if (n == 0) continue;
    if (n < bucket_bytes / 4) {
      if (pack.nbytes + n > bucket_bytes) flush();
      pack.pieces.push_back({static_cast<uint32_t>(t), 0, pack.nbytes, n});
      pack.nbytes += n;
      ++plan.pieces_per_tensor[t];
      continue;
    }
    flush();
    for (uint64_t off = 0; off < n; off += bucket_bytes) {
      Bucket slice;
      slice.nbytes = std::min<uint64_t>(bucket_bytes, n - off);
      slice.pieces.push_back({static_cast<uint32_t>(t), off, 0, slice.nbytes});
      plan.buckets.push_back(std::move(slice));
      ++plan.pieces_per_tensor[t];
    }
  }
  flush();
  return plan;
}

Status ValidateGroupName(std::string_view group, std::string_view what) {
  if (group.empty() || group.size() > 64) {
    return Status::InvalidArgument(std::string(what) + " must be 1..64 characters, got " +
                                   std::to_string(group.size()));
  }
  for (char c : group) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    if (!ok) return Status::InvalidArgument(std::string(what) + " '" + std::string(group) + "' is not [A-Za-z0-9_-]+");
  }
  return Status::Ok();
}

}  // namespace sluice::checkpoint_engine::bcast
