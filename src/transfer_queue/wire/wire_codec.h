// The bounded reader and writer under the TransferQueue wire format
// (wire.h): little-endian integers, u32-length-prefixed strings, u32 counts
// and raw byte ranges.
//
// The reader never trusts a length: every string, count and byte range is
// checked against the bytes that remain and against a caller-given limit
// before anything is allocated. Errors are sticky: after the first failure
// every read returns a zero value (counts read 0, so no loop runs on garbage)
// and status() names the first field that failed, with its offset.
//
// Thread safety: a reader or writer is used by one thread at a time.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_WIRE_CODEC_H_
#define SLUICE_SRC_TRANSFER_QUEUE_WIRE_CODEC_H_

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "sluice/common/status.h"

namespace sluice::transfer_queue::wire {

using TimePoint = std::chrono::steady_clock::time_point;

// Limits a receiver applies to every message; see docs/transfer_queue.md.
struct WireLimits {
  // Header plus body. Also set as ZMQ_MAXMSGSIZE, so a bigger frame is
  // dropped by ZeroMQ before it is allocated.
  uint64_t max_message_bytes = (uint64_t{1} << 30) + (uint64_t{1} << 20);
  // Rows in a batch, a write, a lookup or a storage read.
  uint32_t max_batch_rows = 65536;
  // One tensor (one row of one column).
  uint64_t max_tensor_bytes = uint64_t{1} << 30;
  // Lists not bounded by a batch: reclaim tickets, KvList entries, rows freed.
  uint64_t max_list_entries = uint64_t{1} << 22;
};

// Owns the bytes of one encoded message. The buffer is allocated without
// zero-filling (payloads are large) and can be released to ZeroMQ.
class WireWriter {
 public:
  // `now` is the sender's clock reading, for fields sent as "time remaining".
  explicit WireWriter(TimePoint now = std::chrono::steady_clock::now()) : now_(now) {}
  WireWriter(const WireWriter&) = delete;
  WireWriter& operator=(const WireWriter&) = delete;

  void Reserve(size_t bytes);
  void U8(uint8_t v) { Put(&v, 1); }
  void U16(uint16_t v);
  void U32(uint32_t v);
  void U64(uint64_t v);
  void I64(int64_t v) { U64(static_cast<uint64_t>(v)); }
  void Bool(bool v) { U8(v ? 1 : 0); }
  // u32 length, then the bytes. Precondition: s.size() < 2^32 (receivers
  // apply much smaller limits).
  void String(std::string_view s);
  // u32 count. Precondition: n < 2^32.
  void Count(size_t n);
  void Bytes(const void* data, size_t n) { Put(data, n); }
  // Zero bytes up to the next multiple of `alignment` from the message start.
  void Align(size_t alignment);

  // Overwrites 8 bytes at `offset` (for the header's body length).
  void PatchU64(size_t offset, uint64_t v);

  size_t size() const { return size_; }
  const std::byte* data() const { return data_.get(); }
  TimePoint now() const { return now_; }
  // Hands the buffer over (allocated with new std::byte[]; free with delete[]
  // or hand it to large_buffers::Give with *capacity).
  std::unique_ptr<std::byte[]> Release(size_t* size, size_t* capacity);

 private:
  void Put(const void* p, size_t n);
  TimePoint now_;
  std::unique_ptr<std::byte[]> data_;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

class WireReader {
 public:
  // `data` is the body; `base_offset` is where it starts in the message (for
  // messages). `what` names the message ("GetMeta request"). `owner`, if set,
  // keeps `data` alive, so tensors may be returned as views into it.
  WireReader(std::span<const std::byte> data, size_t base_offset, std::string what, const WireLimits& limits,
             std::shared_ptr<const void> owner, TimePoint now);

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  const WireLimits& limits() const { return limits_; }
  const std::shared_ptr<const void>& owner() const { return owner_; }
  // The receiver's clock reading, for fields sent as "time remaining".
  TimePoint now() const { return now_; }
  size_t remaining() const { return ok() ? data_.size() - pos_ : 0; }

  uint8_t U8(const char* field);
  uint16_t U16(const char* field);
  uint32_t U32(const char* field);
  uint64_t U64(const char* field);
  int64_t I64(const char* field) { return static_cast<int64_t>(U64(field)); }
  // 0 or 1; anything else is InvalidArgument.
  bool Bool(const char* field);
  // An enum stored as u8 whose values are 0..max_value.
  template <typename E>
  E Enum(const char* field, E max_value) {
    const uint8_t v = U8(field);
    if (ok() && v > static_cast<uint8_t>(max_value)) {
      Invalid(field, "has unknown value " + std::to_string(v) + " (at most " +
                         std::to_string(static_cast<unsigned>(max_value)) + ")");
      return E{};
    }
    return static_cast<E>(v);
  }
  // At most max_bytes bytes (InvalidArgument), present in full (DataLoss).
  std::string String(const char* field, size_t max_bytes);
  // A count <= max (InvalidArgument) whose elements, at least
  // min_element_bytes each, fit in what remains (DataLoss). 0 on error.
  size_t Count(const char* field, uint64_t max, size_t min_element_bytes);
  // Exactly n bytes; an empty span on error.
  std::span<const std::byte> Bytes(const char* field, uint64_t n);
  // Skips the zero padding written by WireWriter::Align (non-zero padding is
  // InvalidArgument, so every message has one encoding).
  void Align(const char* field, size_t alignment);

  // The first failure wins; later ones are ignored.
  void Fail(Status status);
  // InvalidArgument "<what>: field '<field>' <detail>".
  void Invalid(const char* field, const std::string& detail);
  // OK if every byte was consumed; DataLoss naming the trailing bytes otherwise.
  Status Finish();

 private:
  // Null (and a DataLoss status) if fewer than n bytes remain.
  const std::byte* Take(const char* field, uint64_t n);

  std::span<const std::byte> data_;
  size_t pos_ = 0;
  size_t base_offset_;
  std::string what_;
  WireLimits limits_;
  std::shared_ptr<const void> owner_;
  TimePoint now_;
  Status status_;
};

// Little-endian loads/stores for fixed-position fields (the header).
void StoreU16(std::byte* p, uint16_t v);
void StoreU32(std::byte* p, uint32_t v);
void StoreU64(std::byte* p, uint64_t v);
uint16_t LoadU16(const std::byte* p);
uint32_t LoadU32(const std::byte* p);
uint64_t LoadU64(const std::byte* p);

}  // namespace sluice::transfer_queue::wire

#endif  // SLUICE_SRC_TRANSFER_QUEUE_WIRE_CODEC_H_
