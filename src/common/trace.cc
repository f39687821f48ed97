#include "sluice/common/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

namespace sluice {
namespace {

thread_local int32_t tls_track = 0;

int64_t ThreadId() {
  thread_local const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  return tid;
}

// A JSON string literal of `s` (control characters escaped; bytes >= 0x80
// passed through, as names are UTF-8).
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// JSON has no NaN or infinity: they are written as null.
std::string Number(double v) {
  if (!std::isfinite(v)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  return buf;
}

std::string Head(const char* ph, const char* name, int64_t ts_us) {
  return std::string("{\"ph\":\"") + ph + "\",\"name\":" + Quote(name) + ",\"pid\":" + std::to_string(tls_track) +
         ",\"tid\":" + std::to_string(ThreadId()) + ",\"ts\":" + std::to_string(ts_us);
}

constexpr int64_t kFlushEveryUs = 1000000;

// Whether `line` is one JSON object whose braces close where it ends (a
// line cut short by a kill does not).
bool IsWholeObject(const std::string& line) {
  if (line.empty() || line.front() != '{') return false;
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      ++depth;
    } else if (c == '}') {
      if (--depth == 0) return i + 1 == line.size();
    }
  }
  return false;
}

}  // namespace

int64_t TraceNowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t TraceClockOffsetUs() {
  using std::chrono::microseconds;
  const int64_t wall =
      std::chrono::duration_cast<microseconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  return wall - TraceNowUs();
}

TraceRecorder& TraceRecorder::Global() {
  static TraceRecorder* recorder = new TraceRecorder();  // never destroyed: used from any thread until exit
  return *recorder;
}

Status TraceRecorder::Start(const std::string& path, size_t max_events) {
  MutexLock lock(&mu_);
  if (file_ != nullptr) return Status::FailedPrecondition("tracing already started");
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) return Status::Unavailable("cannot write the trace " + path + ": " + std::strerror(errno));
  file_ = f;
  max_events_ = max_events;
  events_ = 0;
  last_flush_us_ = TraceNowUs();
  named_tracks_.clear();
  dropped_.store(0);
  enabled_.store(true);
  return Status::Ok();
}

Status TraceRecorder::Finish() {
  MutexLock lock(&mu_);
  if (file_ == nullptr) return Status::Ok();
  enabled_.store(false);
  if (dropped_.load() > 0) {
    // Not counted against max_events: the note is always written.
    std::fprintf(file_,
                 "{\"ph\":\"i\",\"s\":\"g\",\"name\":\"trace events dropped: %lld\",\"pid\":0,\"tid\":0,\"ts\":%lld}\n",
                 static_cast<long long>(dropped_.load()), static_cast<long long>(TraceNowUs()));
  }
  const bool failed = std::fflush(file_) != 0 || std::ferror(file_) != 0;
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (failed || !closed) return Status::Unavailable("writing the trace failed");
  return Status::Ok();
}

void TraceRecorder::Write(const std::string& line) {
  if (file_ == nullptr) return;
  if (events_ >= max_events_) {
    dropped_.fetch_add(1);
    return;
  }
  ++events_;
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fputc('\n', file_);
  const int64_t now = TraceNowUs();
  if (now - last_flush_us_ >= kFlushEveryUs) {
    std::fflush(file_);
    last_flush_us_ = now;
  }
}

void TraceRecorder::SetThreadTrack(int32_t track, const std::string& track_name) {
  tls_track = track;
  if (!enabled()) return;
  MutexLock lock(&mu_);
  if (std::find(named_tracks_.begin(), named_tracks_.end(), track) != named_tracks_.end()) return;
  named_tracks_.push_back(track);
  Write("{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(track) +
        ",\"tid\":0,\"args\":{\"name\":" + Quote(track_name) + "}}");
  Write("{\"ph\":\"M\",\"name\":\"process_sort_index\",\"pid\":" + std::to_string(track) +
        ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(track) + "}}");
}

void TraceRecorder::NameThread(const std::string& name) {
  if (!enabled()) return;
  const std::string line = "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" + std::to_string(tls_track) +
                           ",\"tid\":" + std::to_string(ThreadId()) + ",\"args\":{\"name\":" + Quote(name) + "}}";
  MutexLock lock(&mu_);
  Write(line);
}

void TraceRecorder::Complete(const char* name, const char* category, int64_t start_us, int64_t end_us,
                             std::initializer_list<TraceArg> args) {
  if (!enabled()) return;
  std::string line = Head("X", name, start_us) + ",\"cat\":" + Quote(category) +
                     ",\"dur\":" + std::to_string(std::max<int64_t>(0, end_us - start_us));
  if (args.size() > 0) {
    line += ",\"args\":{";
    bool first = true;
    for (const TraceArg& a : args) {
      line += (first ? "" : ",") + Quote(a.name) + ":" + Number(a.value);
      first = false;
    }
    line += "}";
  }
  line += "}";
  MutexLock lock(&mu_);
  Write(line);
}

void TraceRecorder::Counter(const char* name, int64_t ts_us, double value) {
  if (!enabled()) return;
  const std::string line = Head("C", name, ts_us) + ",\"args\":{\"value\":" + Number(value) + "}}";
  MutexLock lock(&mu_);
  Write(line);
}

Result<int64_t> FinishTraceFile(const std::vector<std::string>& parts, const std::string& out) {
  const std::string tmp = out + ".tmp";
  std::ofstream o(tmp, std::ios::trunc);
  if (!o) return Status::Unavailable("cannot write the trace " + tmp);
  o << "[\n";
  int64_t n = 0;
  for (const std::string& part : parts) {
    std::ifstream in(part);
    if (!in) continue;
    std::string line;
    while (std::getline(in, line)) {
      if (!IsWholeObject(line)) continue;  // a line cut short by a kill
      o << (n > 0 ? ",\n" : "") << line;
      ++n;
    }
  }
  o << "\n]\n";
  o.flush();
  if (!o) return Status::Unavailable("writing the trace " + tmp + " failed");
  o.close();
  if (std::rename(tmp.c_str(), out.c_str()) != 0) {
    return Status::Unavailable("cannot move the trace to " + out + ": " + std::strerror(errno));
  }
  return n;
}

std::string RebaseTraceLines(const std::string& lines, int64_t ts_shift_us, int64_t tid_base, int64_t* rejected) {
  constexpr int64_t kMaxId = int64_t{1} << 22;  // Linux's largest pid_max
  std::string out;
  std::string_view rest(lines);
  while (!rest.empty()) {
    const size_t end = rest.find('\n');
    const std::string_view line = rest.substr(0, end);
    rest = end == std::string_view::npos ? std::string_view() : rest.substr(end + 1);
    if (line.empty()) continue;
    nlohmann::json e = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    auto id = [&](const char* k) {
      return e.contains(k) && e[k].is_number_integer() && e[k].get<int64_t>() >= 0 && e[k].get<int64_t>() < kMaxId;
    };
    const bool ok = e.is_object() && e.contains("ph") && e["ph"].is_string() && id("pid") && id("tid") &&
                    (!e.contains("ts") || e["ts"].is_number_integer());
    if (!ok) {
      ++*rejected;
      continue;
    }
    if (e.contains("ts")) e["ts"] = e["ts"].get<int64_t>() + ts_shift_us;
    if (e["tid"].get<int64_t>() != 0) e["tid"] = e["tid"].get<int64_t>() + tid_base;
    out += e.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    out += '\n';
  }
  return out;
}

}  // namespace sluice
