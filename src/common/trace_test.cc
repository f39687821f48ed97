#include "sluice/common/trace.h"

#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "sluice/common/file_util.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

class TraceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice_trace_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    (void)TraceRecorder::Global().Finish();
    (void)RemoveTree(dir_.string());
  }
  std::string Path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string Read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  // The merged trace, parsed: a JSON array of events.
  static nlohmann::json Merge(const std::vector<std::string>& parts, const std::string& out, int64_t* n = nullptr) {
    Result<int64_t> merged = FinishTraceFile(parts, out);
    EXPECT_TRUE(merged.ok()) << merged.status().ToString();
    if (n != nullptr) *n = merged.ok() ? *merged : -1;
    return nlohmann::json::parse(Read(out));
  }
  fs::path dir_;
};

TEST_F(TraceTest, RecordsNothingUntilStarted) {
  TraceRecorder& r = TraceRecorder::Global();
  EXPECT_FALSE(r.enabled());
  { TraceSpan span("idle", "test"); }
  r.Counter("c", TraceNowUs(), 1);
  ASSERT_TRUE(r.Start(Path("a.jsonl")).ok());
  EXPECT_EQ(r.Start(Path("b.jsonl")).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(r.Finish().ok());
  EXPECT_EQ(Read(Path("a.jsonl")), "");
  EXPECT_TRUE(r.Finish().ok());  // idempotent
}

TEST_F(TraceTest, SpansCountersAndNamesFromManyThreadsMakeOneValidTrace) {
  TraceRecorder& r = TraceRecorder::Global();
  ASSERT_TRUE(r.Start(Path("t.jsonl")).ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t, &r] {
      r.SetThreadTrack(t % 2 + 1, t % 2 == 0 ? "role \"a\"" : "role\nb");  // names needing escapes
      r.NameThread("worker " + std::to_string(t));
      for (int i = 0; i < 50; ++i) {
        TraceSpan span("step", "test");
        r.Counter("value", TraceNowUs(), i * 0.5);
      }
      const int64_t t0 = TraceNowUs();
      r.Complete("with args", "test", t0, t0 + 7, {{"rows", 3}, {"nan", 0.0 / 0.0}});
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(r.Finish().ok());
  int64_t n = 0;
  nlohmann::json trace = Merge({Path("t.jsonl")}, Path("trace.json"), &n);
  ASSERT_TRUE(trace.is_array());
  EXPECT_EQ(static_cast<int64_t>(trace.size()), n);
  int spans = 0, counters = 0, process_names = 0, thread_names = 0;
  std::set<std::string> names;
  for (const auto& e : trace) {
    const std::string ph = e.at("ph");
    if (ph == "X") {
      ++spans;
      EXPECT_GE(e.at("dur").get<int64_t>(), 0);
      EXPECT_TRUE(e.at("pid") == 1 || e.at("pid") == 2);
      if (e.at("name") == "with args") {
        EXPECT_EQ(e.at("args").at("rows"), 3);
        EXPECT_TRUE(e.at("args").at("nan").is_null());
        EXPECT_EQ(e.at("dur"), 7);
      }
    } else if (ph == "C") {
      ++counters;
    } else if (ph == "M" && e.at("name") == "process_name") {
      ++process_names;
      names.insert(e.at("args").at("name").get<std::string>());
    } else if (ph == "M" && e.at("name") == "thread_name") {
      ++thread_names;
    }
  }
  EXPECT_EQ(spans, 4 * 51);
  EXPECT_EQ(counters, 4 * 50);
  EXPECT_EQ(process_names, 2);  // once per track
  EXPECT_EQ(names, (std::set<std::string>{"role \"a\"", "role\nb"}));
  EXPECT_EQ(thread_names, 4);
}

TEST_F(TraceTest, EventsPastTheBoundAreCountedNotRecorded) {
  TraceRecorder& r = TraceRecorder::Global();
  ASSERT_TRUE(r.Start(Path("b.jsonl"), /*max_events=*/10).ok());
  for (int i = 0; i < 25; ++i) r.Counter("c", TraceNowUs(), i);
  EXPECT_EQ(r.dropped(), 15);
  ASSERT_TRUE(r.Finish().ok());
  nlohmann::json trace = Merge({Path("b.jsonl")}, Path("trace.json"));
  ASSERT_EQ(trace.size(), 11u);
  EXPECT_EQ(trace.back().at("name"), "trace events dropped: 15");
}

TEST_F(TraceTest, MergingSkipsMissingPartsAndTornLines) {
  {
    std::ofstream a(Path("a.jsonl"));
    a << "{\"ph\":\"X\",\"name\":\"a\",\"pid\":1,\"tid\":1,\"ts\":5,\"dur\":1}\n";
    a << "{\"ph\":\"X\",\"name\":\"b}\",\"pid\":1,\"tid\":1,\"ts\":6,\"dur\":1,\"args\":{\"x\":1}";  // cut short
    std::ofstream b(Path("b.jsonl"));
    b << "{\"ph\":\"C\",\"name\":\"c\",\"pid\":2,\"tid\":1,\"ts\":7,\"args\":{\"value\":2}}\n\n";
  }
  int64_t n = 0;
  nlohmann::json trace = Merge({Path("a.jsonl"), Path("missing.jsonl"), Path("b.jsonl")}, Path("trace.json"), &n);
  EXPECT_EQ(n, 2);
  ASSERT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace[0].at("name"), "a");
  EXPECT_EQ(trace[1].at("name"), "c");
  // Nothing at all is still a valid (empty) trace.
  nlohmann::json empty = Merge({Path("missing.jsonl")}, Path("empty.json"));
  EXPECT_TRUE(empty.is_array() && empty.empty());
}

TEST_F(TraceTest, AnUnwritablePathIsAnError) {
  EXPECT_EQ(TraceRecorder::Global().Start(Path("no/such/dir/t.jsonl")).code(), StatusCode::kUnavailable);
  EXPECT_FALSE(TraceRecorder::Global().enabled());
  EXPECT_EQ(FinishTraceFile({}, Path("no/such/dir/t.json")).status().code(), StatusCode::kUnavailable);
}

TEST_F(TraceTest, LinesFromAnotherHostAreCheckedAndMovedOntoThisHostsTimeline) {
  // What a recorder on the other host wrote, as it wrote it.
  ASSERT_TRUE(TraceRecorder::Global().Start(Path("remote.jsonl")).ok());
  TraceRecorder::Global().SetThreadTrack(2, "rollout");
  TraceRecorder::Global().NameThread("rollout-1 engine 0");
  TraceRecorder::Global().Complete("decode step", "rollout", 1000, 1500, {{"rows", 3}});
  TraceRecorder::Global().Counter("serving version", 1600, 2);
  ASSERT_TRUE(TraceRecorder::Global().Finish().ok());
  const std::string recorded = Read(Path("remote.jsonl"));
  const int64_t tid_base = int64_t{5} << 22;
  int64_t rejected = 0;
  const std::string rebased = RebaseTraceLines(recorded, -400, tid_base, &rejected);
  EXPECT_EQ(rejected, 0);
  std::vector<nlohmann::json> events;
  std::istringstream lines(rebased);
  for (std::string line; std::getline(lines, line);) events.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(events.size(), 5u);  // process name, sort index, thread name, span, counter
  const int64_t tid = static_cast<int64_t>(::syscall(SYS_gettid));
  for (const nlohmann::json& e : events) {
    EXPECT_EQ(e.at("pid"), 2);
    // (a track's metadata is on thread 0, which stays 0)
    const bool track_metadata = e.at("ph") == "M" && e.at("name") != "thread_name";
    EXPECT_EQ(e.at("tid"), track_metadata ? 0 : tid + tid_base) << e;
  }
  EXPECT_EQ(events[3].at("ts"), 600);
  EXPECT_EQ(events[3].at("dur"), 500);
  EXPECT_EQ(events[3].at("args").at("rows"), 3);
  EXPECT_EQ(events[4].at("ts"), 1200);

  // Foreign or torn lines are left out, counted; the good ones between them kept.
  const std::string good = R"({"ph":"X","name":"a","pid":1,"tid":7,"ts":10,"dur":1})";
  const std::string bad[] = {
      R"({"ph":"X","name":"a","pid":1,"tid":7,"ts":10)",  // torn
      R"([1,2,3])",                                       // not an object
      R"({"name":"a","pid":1,"tid":7,"ts":10})",          // no ph
      R"({"ph":"X","pid":-1,"tid":7,"ts":10})",           // negative track
      R"({"ph":"X","pid":1,"tid":4194304,"ts":10})",      // tid past 2^22
      R"({"ph":"X","pid":1,"tid":7,"ts":"soon"})",        // ts not a number
      R"({"ph":"X","pid":1.5,"tid":7,"ts":10})",          // pid not an integer
      "\x01\x02 not json at all",
  };
  std::string mixed = good + "\n";
  for (const std::string& b : bad) mixed += b + "\n" + good + "\n";
  rejected = 0;
  const std::string kept = RebaseTraceLines(mixed + good, 0, 0, &rejected);  // (the last line has no newline)
  EXPECT_EQ(rejected, static_cast<int64_t>(std::size(bad)));
  std::istringstream kept_lines(kept);
  int n = 0;
  for (std::string line; std::getline(kept_lines, line); ++n) EXPECT_EQ(nlohmann::json::parse(line).at("tid"), 7);
  EXPECT_EQ(n, static_cast<int>(std::size(bad)) + 2);
}

}  // namespace
}  // namespace sluice
