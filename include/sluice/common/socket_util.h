// TCP helpers (the CheckpointEngine's rendezvous store, the TransferQueue's
// direct connections): an owning fd, listen/connect with deadlines, and
// whole-buffer send/receive bounded by a deadline.
//
// Thread safety: functions are thread-safe; a UniqueFd is owned by one thread
// at a time.
#ifndef SLUICE_COMMON_SOCKET_UTIL_H_
#define SLUICE_COMMON_SOCKET_UTIL_H_

#include <bit>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "sluice/common/status.h"

namespace sluice::net {

using Deadline = std::chrono::steady_clock::time_point;

class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { Reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset();

 private:
  int fd_ = -1;
};

// Splits "host:port". InvalidArgument naming the problem.
Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address);

// A non-blocking listening socket on IPv4 `address`:`port` (0: any port).
// InvalidArgument for a malformed address, Unavailable for OS failures.
Result<UniqueFd> ListenTcp(const std::string& address, uint16_t port, int backlog);
// The port a socket is bound to.
Result<uint16_t> LocalPort(int fd);

// This host's IPv4 address on the route to `host` (an IPv4 address): the
// address a peer there reaches this host at. Sends nothing (a UDP socket is
// connected, then asked its name). InvalidArgument for a malformed
// address, Unavailable when no route leads there.
Result<std::string> LocalAddressToward(const std::string& host);

// A blocking, connected socket (TCP_NODELAY) to host:port, retrying refused
// connections until `deadline`. Unavailable naming the address and error.
// With `refused` given, a refusal (nothing listens on the port) is not
// retried: *refused says whether that is why it failed.
Result<UniqueFd> ConnectTcp(const std::string& host, uint16_t port, Deadline deadline, bool* refused = nullptr);

// Send/receive exactly `n` bytes before `deadline` (poll-bounded).
// Unavailable if the peer closed or a socket error occurred; Timeout if the
// deadline passed.
Status SendAll(int fd, const void* data, size_t n, Deadline deadline);
// SendAll of `a` then `b` (nb may be 0) in as few system calls as the socket allows.
Status SendAllParts(int fd, const void* a, size_t na, const void* b, size_t nb, Deadline deadline);
Status RecvAll(int fd, void* data, size_t n, Deadline deadline);

// Little-endian fixed-width encoding: the wire is little-endian, and so is
// every host Sluice supports.
static_assert(std::endian::native == std::endian::little, "the wire formats assume a little-endian host");
template <typename T>
void StoreLe(std::byte* out, T value) {
  std::memcpy(out, &value, sizeof(T));
}
template <typename T>
T LoadLe(const std::byte* in) {
  T value;
  std::memcpy(&value, in, sizeof(T));
  return value;
}

}  // namespace sluice::net

#endif  // SLUICE_COMMON_SOCKET_UTIL_H_
