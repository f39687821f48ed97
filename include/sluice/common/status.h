// Status and Result<T>: the error currency of Sluice outside tensor math.
//
// A Status is either OK or carries a code and a human-readable message that
// names what went wrong. Result<T> holds either a value or a non-OK Status.
// Both are [[nodiscard]]: dropping an error on the floor is a compile warning.
//
// Thread safety: values; a const Status/Result may be read from any thread.
#ifndef SLUICE_COMMON_STATUS_H_
#define SLUICE_COMMON_STATUS_H_

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace sluice {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed; fix the input
  kNotFound,            // the named thing does not exist
  kAlreadyExists,       // the named thing exists already (e.g. duplicate version)
  kOutOfRange,          // a value is outside what is allowed (length, index)
  kFailedPrecondition,  // the system is not in a state that allows the call
  kResourceExhausted,   // a capacity limit was hit; retry later or raise it
  kTimeout,             // a blocking call ran past its deadline; retry
  kAborted,             // the operation was abandoned (e.g. shutdown)
  kUnavailable,         // a peer or service cannot be reached; retry
  kDataLoss,            // stored or received bytes are corrupt or truncated
  kUnimplemented,       // not supported by this build or backend
  kInternal,            // a bug or an unexpected library failure
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message);

  static Status Ok() { return {}; }
  static Status InvalidArgument(std::string msg) { return {StatusCode::kInvalidArgument, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status AlreadyExists(std::string msg) { return {StatusCode::kAlreadyExists, std::move(msg)}; }
  static Status OutOfRange(std::string msg) { return {StatusCode::kOutOfRange, std::move(msg)}; }
  static Status FailedPrecondition(std::string msg) { return {StatusCode::kFailedPrecondition, std::move(msg)}; }
  static Status ResourceExhausted(std::string msg) { return {StatusCode::kResourceExhausted, std::move(msg)}; }
  static Status Timeout(std::string msg) { return {StatusCode::kTimeout, std::move(msg)}; }
  static Status Aborted(std::string msg) { return {StatusCode::kAborted, std::move(msg)}; }
  static Status Unavailable(std::string msg) { return {StatusCode::kUnavailable, std::move(msg)}; }
  static Status DataLoss(std::string msg) { return {StatusCode::kDataLoss, std::move(msg)}; }
  static Status Unimplemented(std::string msg) { return {StatusCode::kUnimplemented, std::move(msg)}; }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return ok() ? StatusCode::kOk : state_->code; }
  const std::string& message() const;

  // "InvalidArgument: <message>" or "OK".
  std::string ToString() const;

  // Returns a copy whose message is prefixed with `context: `; OK stays OK.
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code() == b.code() && a.message() == b.message();
  }

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  // Null when OK, so the OK path is a single pointer test and no allocation.
  std::shared_ptr<const State> state_;
};

// Aborts with the status message if !ok(). For places where failure is a bug.
void CheckOk(const Status& status, const char* file, int line);

template <typename T>
class [[nodiscard]] Result {
 public:
  // Implicit so that `return value;` and `return Status::X(...)` both work.
  Result(T value) : value_(std::move(value)) {}         // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = Status::Internal("Result constructed from an OK status without a value");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  // Precondition: ok(). Violations abort with the carried status.
  T& value() & {
    EnsureOk();
    return *value_;
  }
  const T& value() const& {
    EnsureOk();
    return *value_;
  }
  T&& value() && {
    EnsureOk();
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void EnsureOk() const {
    if (!status_.ok()) CheckOk(status_, __FILE__, __LINE__);
  }
  Status status_;
  std::optional<T> value_;
};

}  // namespace sluice

#define SLUICE_STATUS_CONCAT_INNER_(a, b) a##b
#define SLUICE_STATUS_CONCAT_(a, b) SLUICE_STATUS_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define SLUICE_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::sluice::Status sluice_status_ = (expr);        \
    if (!sluice_status_.ok()) return sluice_status_; \
  } while (0)

// `SLUICE_ASSIGN_OR_RETURN(auto x, MakeX());` declares/assigns x from a
// Result<T>, or returns its error status from the enclosing function.
#define SLUICE_ASSIGN_OR_RETURN(lhs, expr) \
  SLUICE_ASSIGN_OR_RETURN_IMPL_(SLUICE_STATUS_CONCAT_(sluice_result_, __LINE__), lhs, expr)
#define SLUICE_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

// Aborts (with file:line and the message) if `expr` is not OK.
#define SLUICE_CHECK_OK(expr) ::sluice::CheckOk((expr), __FILE__, __LINE__)

#endif  // SLUICE_COMMON_STATUS_H_
