#include "remote_link.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "sluice/common/logging.h"
#include "sluice/common/trace.h"

namespace sluice::pipeline {

using std::chrono::milliseconds;

std::string RemoteBeatKey(const std::string& process_name) { return "beat/" + process_name; }

namespace {

std::string TraceChunkKey(const std::string& process_name, int64_t pid, int64_t n) {
  return "trace/" + process_name + "/" + std::to_string(pid) + "/" + std::to_string(n);
}

// How long after its last report a process counts as alive at the run's end.
constexpr std::chrono::milliseconds kAliveFor{2500};
// Chunks rank 0 takes from one process per poll (the process sends at most 8 a second).
constexpr int kChunksPerPoll = 16;

}  // namespace

std::string EncodeRemoteBeat(const RunHealth& health, int slot, int64_t seq, pid_t pid, const std::string& host,
                             bool failed) {
  const int64_t now = std::chrono::steady_clock::now().time_since_epoch().count();
  const SlotHealth h = health.Slot(slot);
  const int64_t beat = h.beat_ns, since = h.activity_since_ns;
  auto age_ms = [&](int64_t t) { return t <= 0 ? int64_t{-1} : (now - t) / 1000000; };
  return nlohmann::json{{"seq", seq},
                        {"beat_age_ms", age_ms(beat)},
                        {"finished", beat == SlotHealth::kFinished && !failed},
                        {"failed", failed},
                        {"activity", h.activity},
                        {"activity_age_ms", age_ms(since)},
                        {"pid", pid},
                        {"host", host},
                        {"clock_us", TraceClockOffsetUs()},
                        {"tokens", health.rollout().tokens},
                        {"busy_us", health.rollout().busy_us},
                        {"slot_steps", health.slot_steps()},
                        {"active_slot_steps", health.active_slot_steps()},
                        {"reward_errors", health.reward_errors()}}
      .dump();
}

Result<RemoteBeat> DecodeRemoteBeat(const std::string& text) {
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  auto integer = [&](const char* k) { return j.contains(k) && j[k].is_number_integer(); };
  auto boolean = [&](const char* k) { return j.contains(k) && j[k].is_boolean(); };
  const char* const counters[] = {"tokens", "busy_us", "slot_steps", "active_slot_steps", "reward_errors"};
  bool ok = j.is_object() && integer("seq") && integer("beat_age_ms") && integer("activity_age_ms") && integer("pid") &&
            integer("clock_us") && j.contains("activity") && j["activity"].is_number_unsigned() &&
            boolean("finished") && boolean("failed") && j.contains("host") && j["host"].is_string() &&
            j["host"].get<std::string>().size() <= 255;
  for (const char* k : counters) ok = ok && integer(k);
  if (!ok) return Status::DataLoss("malformed heartbeat report: " + text.substr(0, 120));
  RemoteBeat b;
  b.seq = j["seq"].get<int64_t>();
  b.beat_age_ms = j["beat_age_ms"].get<int64_t>();
  b.activity_age_ms = j["activity_age_ms"].get<int64_t>();
  b.finished = j["finished"].get<bool>();
  b.failed = j["failed"].get<bool>();
  const uint64_t activity = j["activity"].get<uint64_t>();
  b.pid = j["pid"].get<int64_t>();
  b.host = j["host"].get<std::string>();
  b.clock_us = j["clock_us"].get<int64_t>();
  RemoteCounters& n = b.counters;
  int64_t* const values[] = {&n.tokens, &n.busy_us, &n.slot_steps, &n.active_slot_steps, &n.reward_errors};
  // Counters never negative and far from overflowing when added up; ages up
  // to a year (they become times on this host's clock); a pid and an
  // activity in their types' range.
  constexpr int64_t kMaxCounter = int64_t{1} << 56;
  bool in_range = true;
  for (size_t i = 0; i < std::size(counters); ++i) {
    *values[i] = j[counters[i]].get<int64_t>();
    in_range = in_range && *values[i] >= 0 && *values[i] <= kMaxCounter;
  }
  constexpr int64_t kYearMs = int64_t{366} * 24 * 3600 * 1000;
  if (!in_range || b.beat_age_ms < -1 || b.beat_age_ms > kYearMs || b.activity_age_ms < -1 ||
      b.activity_age_ms > kYearMs || b.pid <= 0 || b.pid > INT32_MAX || activity > UINT32_MAX) {
    return Status::DataLoss("heartbeat report out of range: " + text.substr(0, 120));
  }
  b.activity = static_cast<uint32_t>(activity);
  return b;
}

TraceShipper::TraceShipper(std::string path, const std::string& process_name, pid_t pid)
    : path_(std::move(path)), key_prefix_(TraceChunkKey(process_name, pid, 0)) {
  key_prefix_.pop_back();  // ".../<pid>/": the chunk's number follows
}

void TraceShipper::Ship(trainer::DataParallelStore& store, int max_chunks) {
  std::ifstream in(path_, std::ios::binary);
  if (!in) return;  // nothing recorded yet
  for (int sent = 0; max_chunks == 0 || sent < max_chunks; ++sent) {
    in.clear();
    in.seekg(static_cast<std::streamoff>(offset_));
    std::string chunk(kChunkBytes, '\0');
    in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()));
    chunk.resize(static_cast<size_t>(in.gcount()));
    const size_t end = chunk.rfind('\n');
    if (end == std::string::npos) {
      // A line longer than a chunk (none is): passed over, so the rest moves on.
      if (chunk.size() == kChunkBytes) offset_ += chunk.size();
      return;
    }
    chunk.resize(end + 1);  // whole lines; the rest when its line is flushed
    if (!store.SetShared(key_prefix_ + std::to_string(next_), chunk).ok()) return;  // again next time
    ++next_;
    offset_ += chunk.size();
  }
}

void RemoteBeats::Add(const std::string& name, int slot, int64_t rollout_replica) {
  Process p{name, slot, rollout_replica, 0};
  // Each process's threads on trace rows of their own (ids below 2^32).
  p.tid_base = std::min<int64_t>(static_cast<int64_t>(processes_.size()) + 1, 1023) << 22;
  processes_.push_back(std::move(p));
}

bool RemoteBeats::TakeTrace(trainer::DataParallelStore& store, Process& p) {
  if (!options_.trace_part) return false;
  std::string lines;
  bool more = true;
  for (int i = 0; more && i < kChunksPerPoll; ++i) {
    const std::string key = TraceChunkKey(p.name, p.pid, p.next_chunk);
    Result<std::string> chunk = store.GetShared(key, milliseconds(0));
    more = chunk.ok();
    if (!more) break;  // not sent yet
    (void)store.DeleteShared(key);
    ++p.next_chunk;
    // On this host's clock: its steady time = the sender's + (its wall - steady) - ours.
    lines += RebaseTraceLines(*chunk, p.clock_us - TraceClockOffsetUs(), p.tid_base, &p.rejected_lines);
  }
  if (p.rejected_lines > 0 && !p.trace_warned) {
    SLUICE_LOG(WARNING) << p.name << ": " << p.rejected_lines
                        << " line(s) of its trace were not trace events; they are left out";
    p.trace_warned = true;
  }
  if (lines.empty()) return more;
  if (p.trace_bytes + static_cast<int64_t>(lines.size()) > kMaxTraceBytes) {
    if (p.trace_bytes <= kMaxTraceBytes) {
      SLUICE_LOG(WARNING) << p.name << ": its trace passed " << (kMaxTraceBytes >> 20) << " MiB; the rest is left out";
    }
    p.trace_bytes = kMaxTraceBytes + 1;
    return more;
  }
  std::ofstream out(options_.trace_part(p.name), std::ios::app | std::ios::binary);
  out.write(lines.data(), static_cast<std::streamsize>(lines.size()));
  if (!out) SLUICE_LOG(WARNING) << p.name << ": cannot write its trace to " << options_.trace_part(p.name);
  p.trace_bytes += static_cast<int64_t>(lines.size());
  return more;
}

void RemoteBeats::Poll(trainer::DataParallelStore& store, RunHealth& health, bool now_please) {
  const auto now = std::chrono::steady_clock::now();
  if (!now_please && now < next_poll_) return;
  next_poll_ = now + std::chrono::seconds(1);
  const int64_t now_ns = now.time_since_epoch().count();
  for (Process& p : processes_) {
    Result<std::string> text = store.GetShared(RemoteBeatKey(p.name), milliseconds(0));
    if (!text.ok()) continue;  // not reported yet
    Result<RemoteBeat> b = DecodeRemoteBeat(*text);
    if (!b.ok()) {
      if (!p.warned) SLUICE_LOG(WARNING) << p.name << ": " << b.status().message();
      p.warned = true;
      continue;
    }
    if (b->seq == p.seq && b->pid == p.pid) {
      TakeTrace(store, p);  // (chunks sent after the report we read)
      continue;             // nothing new: the heartbeat ages
    }
    if (b->pid != p.pid) {
      // A new life: what the last one sent, then the new one's from zero.
      if (p.pid != 0) TakeTrace(store, p);
      if (options_.on_new_life) options_.on_new_life(p.name, b->host, static_cast<pid_t>(b->pid));
      p.seen = RemoteCounters{};
      p.next_chunk = 0;
      p.final = false;
    }
    if (b->failed) {
      SLUICE_LOG(WARNING) << p.name << " (pid " << b->pid << " on host " << b->host
                          << ") failed; its log there says why (its heartbeat stops here)";
    }
    p.seq = b->seq;
    p.pid = b->pid;
    p.clock_us = b->clock_us;
    p.final = b->seq == kFinalReport;
    p.heard = now;
    // The counters' growth since the last report (they only grow in one life).
    const RemoteCounters& c = b->counters;
    if (c.tokens >= p.seen.tokens && c.busy_us >= p.seen.busy_us && c.slot_steps >= p.seen.slot_steps &&
        c.active_slot_steps >= p.seen.active_slot_steps && c.reward_errors >= p.seen.reward_errors) {
      // (a replica's to its own counters too; -1: the totals only)
      health.AddDecoding(p.rollout_replica, c.busy_us - p.seen.busy_us, c.tokens - p.seen.tokens);
      health.AddSlotSteps(c.slot_steps - p.seen.slot_steps, c.active_slot_steps - p.seen.active_slot_steps);
      health.AddRewardErrors(c.reward_errors - p.seen.reward_errors);
      added_.tokens += c.tokens - p.seen.tokens;
      added_.reward_errors += c.reward_errors - p.seen.reward_errors;
    } else if (!p.warned) {
      SLUICE_LOG(WARNING) << p.name << ": its counters went backwards in one life; they are not added";
      p.warned = true;
    }
    p.seen = c;
    TakeTrace(store, p);
    auto at = [&](int64_t age_ms) { return age_ms < 0 ? int64_t{0} : now_ns - age_ms * 1000000; };
    health.Mirror(p.slot,
                  {b->finished ? SlotHealth::kFinished : at(b->beat_age_ms), b->activity, at(b->activity_age_ms)});
  }
}

void RemoteBeats::Finish(trainer::DataParallelStore& store, RunHealth& health, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    Poll(store, health, /*now_please=*/true);
    const auto now = std::chrono::steady_clock::now();
    const bool waiting = std::any_of(processes_.begin(), processes_.end(), [&](const Process& p) {
      return p.pid != 0 && !p.final && now - p.heard < kAliveFor;
    });
    if (!waiting || now >= deadline) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  for (Process& p : processes_) {
    while (p.pid != 0 && TakeTrace(store, p)) {  // (the rest of a long last part)
    }
  }
}

}  // namespace sluice::pipeline
