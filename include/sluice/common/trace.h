// A timeline of what each role of a run does, in the Chrome trace-event
// format (JSON; chrome://tracing and ui.perfetto.dev open it): complete
// events ("ph":"X": a name, a start and a duration) for spans of work,
// counter events ("ph":"C") for values over time, and metadata naming the
// processes and threads.
//
// One recorder per process (TraceRecorder::Global()); it records nothing
// until Start, so instrumented code costs one relaxed atomic load when
// tracing is off. Events go to a file as they are recorded, one JSON object
// per line (JSON Lines), flushed at least once a second and at Finish: a
// process killed mid-run leaves every event up to its last flush.
// FinishTraceFile turns one or more such files into the trace-event JSON
// array (a launcher merges its roles' files that way).
//
// Tracks: an event's "pid" is the calling thread's track (SetThreadTrack):
// the pipeline gives each role its own track, whether roles are threads of
// one process or processes, so a run's trace looks the same either way;
// "tid" is the OS thread id. Timestamps are CLOCK_MONOTONIC microseconds
// (std::chrono::steady_clock): comparable across the processes of one host.
//
// Bounded: at most max_events events per process; later ones are counted in
// dropped() and noted in the file's last line, not recorded.
//
// Thread safety: every method may be called from any thread.
#ifndef SLUICE_COMMON_TRACE_H_
#define SLUICE_COMMON_TRACE_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "sluice/common/mutex.h"
#include "sluice/common/status.h"

namespace sluice {

// Microseconds on the steady clock (CLOCK_MONOTONIC).
int64_t TraceNowUs();
// The wall clock minus the steady clock, in microseconds, now: two hosts'
// values give the shift between their steady clocks (as close as their wall
// clocks agree, e.g. through NTP).
int64_t TraceClockOffsetUs();

struct TraceArg {
  const char* name;  // a static string of [A-Za-z0-9_]
  double value;
};

class TraceRecorder {
 public:
  static TraceRecorder& Global();

  // Opens `path` (created, or appended to: a process started again adds its
  // events after its previous life's) and starts recording. Unavailable
  // if the file cannot be opened; FailedPrecondition if already started.
  Status Start(const std::string& path, size_t max_events = size_t{1} << 20);
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Stops recording and closes the file (with a last line counting dropped
  // events, if any). A no-op when not started. Errors: the final write.
  Status Finish();

  // The calling thread's track: its events carry this pid. The first call
  // for a track with a name records that name (process_name metadata). A
  // thread that never calls it records on track 0.
  void SetThreadTrack(int32_t track, const std::string& track_name);
  // Names the calling thread (thread_name metadata).
  void NameThread(const std::string& name);

  // A span of work on the calling thread: `name` and `category` static
  // strings, times from TraceNowUs.
  void Complete(const char* name, const char* category, int64_t start_us, int64_t end_us,
                std::initializer_list<TraceArg> args = {});
  // A counter track `name` on the calling thread's track.
  void Counter(const char* name, int64_t ts_us, double value);

  int64_t dropped() const { return dropped_.load(); }

 private:
  void Write(const std::string& line) SLUICE_REQUIRES(mu_);

  std::atomic<bool> enabled_{false};
  std::atomic<int64_t> dropped_{0};
  Mutex mu_;
  std::FILE* file_ SLUICE_GUARDED_BY(mu_) = nullptr;
  size_t max_events_ SLUICE_GUARDED_BY(mu_) = 0;
  size_t events_ SLUICE_GUARDED_BY(mu_) = 0;
  int64_t last_flush_us_ SLUICE_GUARDED_BY(mu_) = 0;
  std::vector<int32_t> named_tracks_ SLUICE_GUARDED_BY(mu_);
};

// Records a span from construction to destruction on the global recorder
// (nothing when tracing is off).
class TraceSpan {
 public:
  TraceSpan(const char* name, const char* category)
      : name_(name), category_(category), start_us_(TraceRecorder::Global().enabled() ? TraceNowUs() : -1) {}
  ~TraceSpan() {
    if (start_us_ >= 0) TraceRecorder::Global().Complete(name_, category_, start_us_, TraceNowUs());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* name_;
  const char* category_;
  int64_t start_us_;
};

// Writes `out` as a trace-event JSON array holding the events of every file
// in `parts` (JSON Lines as TraceRecorder writes them; a missing part is
// skipped, a torn last line dropped). Unavailable if `out` cannot be
// written. Returns the number of events written.
Result<int64_t> FinishTraceFile(const std::vector<std::string>& parts, const std::string& out);

// Lines of a trace part that came from another host (JSON Lines as
// TraceRecorder writes them), checked and moved onto this host's timeline,
// ready to append to a part of this host's trace. Every line must be one
// JSON object with a string "ph" and integer "pid" and "tid" in [0, 2^22),
// and an integer "ts" if it has one (metadata has none); its "ts" moves by
// `ts_shift_us` and a nonzero "tid" by `tid_base` (a multiple of 2^22 below
// 2^32: threads of different hosts never share a row, and ids stay 32-bit
// as trace viewers read them). Lines that fail (a torn or foreign line) are
// left out and counted in *rejected.
std::string RebaseTraceLines(const std::string& lines, int64_t ts_shift_us, int64_t tid_base, int64_t* rejected);

}  // namespace sluice

#endif  // SLUICE_COMMON_TRACE_H_
