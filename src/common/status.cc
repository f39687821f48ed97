#include "sluice/common/status.h"

#include <cstdio>
#include <iterator>

#include "sluice/common/enum_names.h"

namespace sluice {

std::string_view StatusCodeName(StatusCode code) {
  static constexpr const char* kNames[] = {"OK",         "InvalidArgument",    "NotFound",          "AlreadyExists",
                                           "OutOfRange", "FailedPrecondition", "ResourceExhausted", "Timeout",
                                           "Aborted",    "Unavailable",        "DataLoss",          "Unimplemented",
                                           "Internal"};
  static_assert(std::size(kNames) == static_cast<size_t>(StatusCode::kInternal) + 1);
  return EnumName(kNames, code, "Unknown");
}

Status::Status(StatusCode code, std::string message) {
  if (code != StatusCode::kOk) state_ = std::make_shared<const State>(State{code, std::move(message)});
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return ok() ? kEmpty : state_->message;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(StatusCodeName(code()));
  out += ": ";
  out += message();
  return out;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message();
  return Status(code(), std::move(msg));
}

void CheckOk(const Status& status, const char* file, int line) {
  if (status.ok()) return;
  std::fprintf(stderr, "%s:%d: SLUICE_CHECK_OK failed: %s\n", file, line, status.ToString().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace sluice
