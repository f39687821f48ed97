#include "wire/wire_codec.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "sluice/common/check.h"
#include "sluice/common/large_buffers.h"

namespace sluice::transfer_queue::wire {

void StoreU16(std::byte* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void StoreU32(std::byte* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
void StoreU64(std::byte* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::byte>(v >> (8 * i));
}
uint16_t LoadU16(const std::byte* p) {
  return static_cast<uint16_t>(static_cast<uint16_t>(p[0]) | (static_cast<uint16_t>(p[1]) << 8));
}
uint32_t LoadU32(const std::byte* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(p[i]);
  return v;
}
uint64_t LoadU64(const std::byte* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(p[i]);
  return v;
}

// ------------------------------------------------------------------ writer

void WireWriter::Reserve(size_t bytes) {
  if (bytes <= capacity_) return;
  // Large messages reuse recycled buffers (no page faults on the copy in);
  // the bytes are uninitialized either way: no memset of payloads.
  size_t capacity = 0;
  std::unique_ptr<std::byte[]> grown = large_buffers::Take(bytes, &capacity);
  if (size_ > 0) std::memcpy(grown.get(), data_.get(), size_);
  large_buffers::Give(std::move(data_), capacity_);
  data_ = std::move(grown);
  capacity_ = capacity;
}

void WireWriter::Put(const void* p, size_t n) {
  if (n == 0) return;
  if (size_ + n > capacity_) Reserve(std::max(size_ + n, std::max<size_t>(capacity_ * 2, 256)));
  std::memcpy(data_.get() + size_, p, n);
  size_ += n;
}

void WireWriter::U16(uint16_t v) {
  std::byte b[2];
  StoreU16(b, v);
  Put(b, 2);
}
void WireWriter::U32(uint32_t v) {
  std::byte b[4];
  StoreU32(b, v);
  Put(b, 4);
}
void WireWriter::U64(uint64_t v) {
  std::byte b[8];
  StoreU64(b, v);
  Put(b, 8);
}

void WireWriter::String(std::string_view s) {
  SLUICE_CHECK(s.size() <= UINT32_MAX) << "string of " << s.size() << " bytes cannot be encoded";
  U32(static_cast<uint32_t>(s.size()));
  Put(s.data(), s.size());
}

void WireWriter::Count(size_t n) {
  SLUICE_CHECK(n <= UINT32_MAX) << "count " << n << " cannot be encoded";
  U32(static_cast<uint32_t>(n));
}

void WireWriter::Align(size_t alignment) {
  static constexpr std::byte kZeros[64] = {};
  SLUICE_CHECK(alignment > 0 && alignment <= sizeof(kZeros));
  const size_t pad = (alignment - size_ % alignment) % alignment;
  Put(kZeros, pad);
}

void WireWriter::PatchU64(size_t offset, uint64_t v) {
  SLUICE_CHECK(offset + 8 <= size_);
  StoreU64(data_.get() + offset, v);
}

std::unique_ptr<std::byte[]> WireWriter::Release(size_t* size, size_t* capacity) {
  *size = size_;
  *capacity = capacity_;
  size_ = 0;
  capacity_ = 0;
  return std::move(data_);
}

// ------------------------------------------------------------------ reader

WireReader::WireReader(std::span<const std::byte> data, size_t base_offset, std::string what, const WireLimits& limits,
                       std::shared_ptr<const void> owner, TimePoint now)
    : data_(data),
      base_offset_(base_offset),
      what_(std::move(what)),
      limits_(limits),
      owner_(std::move(owner)),
      now_(now) {}

void WireReader::Fail(Status status) {
  if (status_.ok()) status_ = std::move(status);
}

void WireReader::Invalid(const char* field, const std::string& detail) {
  Fail(Status::InvalidArgument(what_ + ": field '" + field + "' " + detail));
}

const std::byte* WireReader::Take(const char* field, uint64_t n) {
  if (!ok()) return nullptr;
  const size_t left = data_.size() - pos_;
  if (n > left) {
    Fail(Status::DataLoss(what_ + " is truncated: field '" + field + "' needs " + std::to_string(n) +
                          " bytes at offset " + std::to_string(base_offset_ + pos_) + ", " + std::to_string(left) +
                          " remain"));
    return nullptr;
  }
  const std::byte* p = data_.data() + pos_;
  pos_ += static_cast<size_t>(n);
  return p;
}

uint8_t WireReader::U8(const char* field) {
  const std::byte* p = Take(field, 1);
  return p ? static_cast<uint8_t>(*p) : 0;
}
uint16_t WireReader::U16(const char* field) {
  const std::byte* p = Take(field, 2);
  return p ? LoadU16(p) : 0;
}
uint32_t WireReader::U32(const char* field) {
  const std::byte* p = Take(field, 4);
  return p ? LoadU32(p) : 0;
}
uint64_t WireReader::U64(const char* field) {
  const std::byte* p = Take(field, 8);
  return p ? LoadU64(p) : 0;
}

bool WireReader::Bool(const char* field) {
  const uint8_t v = U8(field);
  if (v > 1) {
    Invalid(field, "is " + std::to_string(v) + ", a boolean must be 0 or 1");
    return false;
  }
  return v == 1;
}

std::string WireReader::String(const char* field, size_t max_bytes) {
  const uint32_t n = U32(field);
  if (!ok()) return {};
  if (n > max_bytes) {
    Invalid(field, "is " + std::to_string(n) + " bytes, at most " + std::to_string(max_bytes) + " allowed");
    return {};
  }
  const std::byte* p = Take(field, n);
  if (p == nullptr) return {};
  return std::string(reinterpret_cast<const char*>(p), n);
}

size_t WireReader::Count(const char* field, uint64_t max, size_t min_element_bytes) {
  const uint32_t n = U32(field);
  if (!ok()) return 0;
  if (n > max) {
    Invalid(field, "has " + std::to_string(n) + " entries, at most " + std::to_string(max) + " allowed");
    return 0;
  }
  const uint64_t need = static_cast<uint64_t>(n) * min_element_bytes;
  const size_t left = data_.size() - pos_;
  if (need > left) {
    Fail(Status::DataLoss(what_ + " is truncated: field '" + field + "' declares " + std::to_string(n) +
                          " entries (at least " + std::to_string(need) + " bytes) at offset " +
                          std::to_string(base_offset_ + pos_ - 4) + ", " + std::to_string(left) + " remain"));
    return 0;
  }
  return n;
}

std::span<const std::byte> WireReader::Bytes(const char* field, uint64_t n) {
  const std::byte* p = Take(field, n);
  if (p == nullptr) return {};
  return {p, static_cast<size_t>(n)};
}

void WireReader::Align(const char* field, size_t alignment) {
  const size_t at = base_offset_ + pos_;
  const size_t pad = (alignment - at % alignment) % alignment;
  const std::byte* p = Take(field, pad);
  if (p == nullptr) return;
  for (size_t i = 0; i < pad; ++i) {
    if (p[i] != std::byte{0}) {
      Invalid(field, "has non-zero padding at offset " + std::to_string(at + i));
      return;
    }
  }
}

Status WireReader::Finish() {
  if (ok() && pos_ != data_.size()) {
    Fail(Status::DataLoss(what_ + ": " + std::to_string(data_.size() - pos_) +
                          " unexpected bytes after the last field (at offset " + std::to_string(base_offset_ + pos_) +
                          ")"));
  }
  return status_;
}

}  // namespace sluice::transfer_queue::wire
