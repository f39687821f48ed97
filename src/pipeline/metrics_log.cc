#include "metrics_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "sluice/common/file_util.h"

namespace sluice::pipeline {

Result<MetricsLog> MetricsLog::Open(const std::string& run_dir, const std::string& file) {
  const std::string path = (std::filesystem::path(run_dir) / file).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Unavailable("cannot open " + path + " for writing: " + std::strerror(errno));
  return MetricsLog(path, fd);
}

Status MetricsLog::Clear(const std::string& run_dir, const std::string& file) {
  const std::string path = (std::filesystem::path(run_dir) / file).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_TRUNC | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::Unavailable("cannot create " + path + ": " + std::strerror(errno));
  ::close(fd);
  return Status::Ok();
}

Status MetricsLog::KeepStepsThrough(const std::string& run_dir, const std::string& file, int64_t step) {
  const std::filesystem::path path = std::filesystem::path(run_dir) / file;
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::Ok();
  std::ifstream in(path);
  std::string line, kept;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("step") || !j["step"].is_number_integer() ||
        j["step"].get<int64_t>() > step) {
      continue;
    }
    kept += line + "\n";
  }
  return WriteFileAtomically(path.string(), kept);
}

MetricsLog::MetricsLog(MetricsLog&& other) noexcept : path_(std::move(other.path_)), fd_(other.fd_) { other.fd_ = -1; }

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status MetricsLog::Append(const std::string& line) {
  if (fd_ < 0) return Status::FailedPrecondition("metrics log is closed");
  const std::string bytes = line + "\n";
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "nothing written";
      return Status::Unavailable("cannot write the metrics of this step to " + path_ + ": " + why + " (" +
                                 std::to_string(done) + " of " + std::to_string(bytes.size()) + " bytes written)");
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace sluice::pipeline
