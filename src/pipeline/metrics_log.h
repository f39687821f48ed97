// metrics.jsonl of a run, appended one JSON line per RL step (and
// trajectories.jsonl of an agent run, a line per trained trajectory). Every
// write is checked: a full disk or a vanished file stops the run at that
// step with an error naming the file, instead of losing lines and going on.
#ifndef SLUICE_SRC_PIPELINE_METRICS_LOG_H_
#define SLUICE_SRC_PIPELINE_METRICS_LOG_H_

#include <string>

#include "sluice/common/status.h"

namespace sluice::pipeline {

class MetricsLog {
 public:
  // Opens (creating it if needed) run_dir/metrics.jsonl for appending.
  // Unavailable naming the file and the system's reason.
  static Result<MetricsLog> Open(const std::string& run_dir, const std::string& file = "metrics.jsonl");
  // Empties run_dir/metrics.jsonl (creating it), for a run that starts
  // afresh. Unavailable as for Open.
  static Status Clear(const std::string& run_dir, const std::string& file = "metrics.jsonl");
  // Keeps the lines of run_dir/`file` whose "step" is at most `step` (a run
  // resumed from that step's checkpoint writes the later ones again); a
  // file that is not there stays so.
  static Status KeepStepsThrough(const std::string& run_dir, const std::string& file, int64_t step);
  MetricsLog(MetricsLog&& other) noexcept;
  MetricsLog& operator=(MetricsLog&&) = delete;
  MetricsLog(const MetricsLog&) = delete;
  ~MetricsLog();

  // Writes `line` and a newline. Unavailable naming the file and the reason
  // (e.g. no space left on the device) when any byte was not written; a part
  // of the line may then be on disk, which readers of metrics skip as a torn
  // last line.
  Status Append(const std::string& line);

  const std::string& path() const { return path_; }

 private:
  MetricsLog(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  std::string path_;
  int fd_ = -1;
};

}  // namespace sluice::pipeline

#endif  // SLUICE_SRC_PIPELINE_METRICS_LOG_H_
