// The controller's ack log (ControllerOptions::ack_log): a line of JSON per
// successful Ack, appended to a file, so that what a task consumed can be
// read from the hub's own record rather than from what its consumer says:
//   {"ack":LEASE,"task":"train","holder":"...","partition":"p","rows":[[ROW,GROUP],...]}
// ROW is the row id, GROUP its group id (-1 for none), in the lease's order.
// Rows cleared before the ack are left out. Strings are escaped so every
// line is valid JSON whatever bytes a holder name holds (bytes >= 0x80 as
// \u00XX). Each line is one write to an O_APPEND descriptor, so lines from
// several hubs (a run's attempts) or other writers never interleave.
#ifndef SLUICE_SRC_TRANSFER_QUEUE_CORE_ACK_LOG_H_
#define SLUICE_SRC_TRANSFER_QUEUE_CORE_ACK_LOG_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/common/status.h"
#include "sluice/transfer_queue/types.h"

namespace sluice::transfer_queue::internal {

class AckLog {
 public:
  // Opens `path` for appending (created 0644 if missing): OpenAppendFile's
  // errors (common/file_util.h), naming the path.
  static Result<std::unique_ptr<AckLog>> Open(const std::string& path);
  ~AckLog();
  AckLog(const AckLog&) = delete;
  AckLog& operator=(const AckLog&) = delete;

  // Appends one line. Unavailable (naming the path) when the write fails.
  Status Record(LeaseId lease, std::string_view task, std::string_view holder, std::string_view partition,
                const std::vector<std::pair<RowId, GroupId>>& rows);

 private:
  AckLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_;
};

// `s` as a JSON string literal, quotes included (see the header comment).
std::string JsonQuoted(std::string_view s);

}  // namespace sluice::transfer_queue::internal

#endif  // SLUICE_SRC_TRANSFER_QUEUE_CORE_ACK_LOG_H_
