#include "core/ack_log.h"

#include <unistd.h>

#include "sluice/common/file_util.h"

namespace sluice::transfer_queue::internal {

std::string JsonQuoted(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "\"";
  for (const char c : s) {
    const auto b = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (b < 0x20 || b >= 0x7f) {
      out += "\\u00";
      out += kHex[b >> 4];
      out += kHex[b & 0xf];
    } else {
      out += c;
    }
  }
  out += '"';
  return out;
}

Result<std::unique_ptr<AckLog>> AckLog::Open(const std::string& path) {
  Result<int> fd = OpenAppendFile(path);
  if (!fd.ok()) return fd.status().WithContext("ack log");
  return std::unique_ptr<AckLog>(new AckLog(path, *fd));
}

AckLog::~AckLog() { ::close(fd_); }

Status AckLog::Record(LeaseId lease, std::string_view task, std::string_view holder, std::string_view partition,
                      const std::vector<std::pair<RowId, GroupId>>& rows) {
  std::string line = "{\"ack\":" + std::to_string(lease) + ",\"task\":" + JsonQuoted(task) +
                     ",\"holder\":" + JsonQuoted(holder) + ",\"partition\":" + JsonQuoted(partition) + ",\"rows\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i > 0) line += ',';
    line += '[' + std::to_string(rows[i].first) + ',' + std::to_string(rows[i].second) + ']';
  }
  line += "]}\n";
  return WriteAll(fd_, line, "ack log " + path_);
}

}  // namespace sluice::transfer_queue::internal
