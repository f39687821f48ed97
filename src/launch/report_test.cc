#include "sluice/launch/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "sluice/common/file_util.h"

namespace sluice::launch {
namespace {

namespace fs = std::filesystem;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice_report_" + std::to_string(::getpid()));
    static_cast<void>(sluice::RemoveTree(dir_));
    fs::create_directories(dir_);
  }
  void TearDown() override { static_cast<void>(sluice::RemoveTree(dir_)); }
  void WriteMetrics(const std::string& text) { std::ofstream(dir_ / "metrics.jsonl") << text; }
  fs::path dir_;
};

TEST_F(ReportTest, RendersEveryChartAsInlineSvgWithoutScriptsOrFetches) {
  WriteMetrics(
      "{\"step\":1,\"reward_mean\":0.25,\"accuracy\":0.25,\"staleness_mean\":0.5,\"staleness_max\":1}\n"
      "{\"step\":2,\"reward_mean\":0.75,\"accuracy\":0.7,\"eval_accuracy\":0.6,\"staleness_max\":2}\n");
  std::ofstream(dir_ / "config.yaml") << "run:\n  dir: <here>\n";
  auto path = WriteRunReport(dir_.string());
  ASSERT_TRUE(path.ok()) << path.status().ToString();
  std::ifstream in(*path);
  std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_NE(html.find("Held-out accuracy"), std::string::npos);
  EXPECT_NE(html.find("2 RL steps recorded"), std::string::npos);
  EXPECT_NE(html.find("&lt;here&gt;"), std::string::npos) << "config text is escaped";
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org/2000/svg")) << "no external resources";
  EXPECT_EQ(html.find("https://"), std::string::npos);
  EXPECT_EQ(html.find("before RL</text>"), std::string::npos) << "no evaluation before RL recorded";
}

TEST_F(ReportTest, HeldOutAccuracyStartsFromTheModelBeforeRl) {
  WriteMetrics("{\"step\":4,\"eval_accuracy\":0.75}\n{\"step\":8,\"eval_accuracy\":0.8}\n");
  std::ofstream(dir_ / kEvalBeforeRlFile) << "{\"eval_accuracy\":0.5,\"examples\":100}\n";
  auto html = RenderRunReport(dir_.string());
  ASSERT_TRUE(html.ok()) << html.status().ToString();
  EXPECT_NE(html->find("<td>50%</td><td>80% (best 80%)</td>"), std::string::npos) << *html;
  EXPECT_NE(html->find(">before RL</text>"), std::string::npos) << "the level before RL has a legend entry";
  EXPECT_NE(html->find("% correct"), std::string::npos) << "the accuracy axis has its unit";
  // The greedy line has three points, the first at step 0 (x = the plot's left edge, 58).
  const size_t chart = html->find("Held-out accuracy");
  const size_t line = html->find("<polyline fill='none' stroke='#d62728'", chart);
  ASSERT_NE(line, std::string::npos);
  const std::string points = html->substr(html->find("points='", line) + 8, 80);
  EXPECT_EQ(points.rfind("58,", 0), 0u) << points;
  // A malformed file is left out with a warning; the report is still written.
  std::ofstream(dir_ / kEvalBeforeRlFile) << "[1]";
  auto without = RenderRunReport(dir_.string());
  ASSERT_TRUE(without.ok()) << without.status().ToString();
  EXPECT_EQ(without->find(">before RL</text>"), std::string::npos);
}

TEST_F(ReportTest, StreamingRunsGetARoleTimelineAndAStalenessHistogram) {
  WriteMetrics(
      "{\"step\":1,\"rollout_busy\":0.9,\"trainer_busy\":0.4,\"rollout_tokens\":100,\"gen_seconds\":2,"
      "\"staleness_hist\":[3,1]}\n"
      "{\"step\":2,\"rollout_busy\":0.8,\"trainer_busy\":0.5,\"rollout_tokens\":100,\"gen_seconds\":2,"
      "\"staleness_hist\":[0,2,2],\"train_tokens\":50,\"train_seconds\":1}\n");
  auto html = RenderRunReport(dir_.string());
  ASSERT_TRUE(html.ok()) << html.status().ToString();
  EXPECT_NE(html->find("Role timeline"), std::string::npos);
  EXPECT_NE(html->find("Staleness of trained samples"), std::string::npos);
  // Counts 3, 3, 2 of 8 samples: 37.5%, 37.5%, 25%.
  EXPECT_NE(html->find(">37.5%<"), std::string::npos);
  EXPECT_NE(html->find(">25%<"), std::string::npos);
}

TEST_F(ReportTest, CompareAggregatesSeedsAndChecksParityAgainstTheBaseline) {
  // Two configurations x two seeds; evaluations at steps 2 and 4, 10 samples per step.
  auto run = [&](const std::string& name, double a2, double a4) {
    fs::create_directories(dir_ / name);
    std::ofstream out(dir_ / name / "metrics.jsonl");
    for (int step = 1; step <= 4; ++step) {
      out << "{\"step\":" << step << ",\"samples_trained\":10,\"reward_mean\":0.5,\"elapsed_seconds\":" << step;
      if (step == 2) out << ",\"eval_accuracy\":" << a2;
      if (step == 4) out << ",\"eval_accuracy\":" << a4;
      out << "}\n";
    }
    return (dir_ / name).string();
  };
  std::vector<LabeledRun> runs = {{"sync", run("s0", 0.5, 0.7)},
                                  {"sync", run("s1", 0.6, 0.8)},
                                  {"async", run("a0", 0.55, 0.9)},  // mean 0.55 inside [0.5, 0.6]; 0.85 outside
                                  {"async", run("a1", 0.55, 0.8)}};
  auto c = CompareRuns(runs);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(c->markdown.find("| sync | 2 | 75.0% (70.0..80.0) |"), std::string::npos) << c->markdown;
  EXPECT_NE(c->markdown.find("| async | 2 | 85.0% (80.0..90.0) |"), std::string::npos) << c->markdown;
  // Final accuracy: async - sync = +10 points; seeds' variances 0.005 each: se 0.0707, 2 df -> t 4.303.
  // At the first evaluation async's seeds agree (variance 0): Welch's df is 1, t 12.706 x se 0.05.
  EXPECT_NE(c->markdown.find("| +10.0 ± 30.4 points |"), std::string::npos) << c->markdown;
  EXPECT_NE(c->markdown.find("not shown: interval up to ±63.5 points"), std::string::npos) << c->markdown;
  EXPECT_NE(c->markdown.find("(baseline)"), std::string::npos);
  EXPECT_NE(c->html.find("<svg"), std::string::npos);
  EXPECT_NE(c->html.find("stroke-dasharray"), std::string::npos) << "seed ranges are drawn";

  EXPECT_EQ(CompareRuns({}).status().code(), StatusCode::kInvalidArgument);
  fs::create_directories(dir_ / "noeval");
  std::ofstream(dir_ / "noeval" / "metrics.jsonl") << "{\"step\":1}\n";
  auto missing = CompareRuns({{"x", (dir_ / "noeval").string()}});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

// Parity is a difference of means with a confidence interval, not "inside
// the baseline's seed range" (which let a 2-3 point drop pass).
TEST(DifferenceOfMeansTest, WelchIntervalAcrossSeeds) {
  // Equal spreads, 3 seeds each: diff -0.02, se sqrt(2 * 1e-4 / 3), df 4 -> t 2.776.
  MeanDifference d = DifferenceOfMeans({0.94, 0.95, 0.96}, {0.92, 0.93, 0.94});
  EXPECT_TRUE(d.has_interval);
  EXPECT_NEAR(d.diff, -0.02, 1e-12);
  EXPECT_NEAR(d.half_width, 2.776 * std::sqrt(2 * 1e-4 / 3), 1e-9);
  // A clear drop: the interval excludes 0.
  d = DifferenceOfMeans({0.94, 0.95, 0.96, 0.95}, {0.91, 0.92, 0.93, 0.92});
  EXPECT_LT(d.diff + d.half_width, 0);
  // One seed: a difference but no interval.
  d = DifferenceOfMeans({0.9}, {0.8, 0.85});
  EXPECT_FALSE(d.has_interval);
  EXPECT_NEAR(d.diff, -0.075, 1e-12);
}

TEST(DifferenceOfMeansTest, PairedIntervalLeavesOutTheSpreadSeedsShare) {
  // Seeds differ by 4 points from each other, the configurations by exactly
  // 1 point within each seed: paired, the difference is certain.
  MeanDifference d = PairedDifference({0.90, 0.94, 0.98}, {0.91, 0.95, 0.99});
  EXPECT_TRUE(d.has_interval);
  EXPECT_NEAR(d.diff, 0.01, 1e-12);
  EXPECT_NEAR(d.half_width, 0.0, 1e-9);
  // Unpaired, the seeds' spread swamps it.
  EXPECT_GT(DifferenceOfMeans({0.90, 0.94, 0.98}, {0.91, 0.95, 0.99}).half_width, 0.05);
  // Differences +1, +3 points: mean 2, sd sqrt(2)/100, 1 df -> t 12.706.
  d = PairedDifference({0.90, 0.94}, {0.91, 0.97});
  EXPECT_NEAR(d.diff, 0.02, 1e-12);
  EXPECT_NEAR(d.half_width, 12.706 * std::sqrt(2e-4 / 2), 1e-9);
  EXPECT_FALSE(PairedDifference({0.9}, {0.8}).has_interval);
}

TEST_F(ReportTest, ComparePairsRunsBySeedWhenTheyRanTheSameSeeds) {
  auto run = [&](const std::string& name, int seed, double acc) {
    fs::create_directories(dir_ / name);
    std::ofstream(dir_ / name / "metrics.jsonl")
        << "{\"step\":1,\"samples_trained\":10,\"reward_mean\":0.5,\"eval_accuracy\":" << acc << "}\n";
    if (seed >= 0) std::ofstream(dir_ / name / "config.yaml") << "run:\n  seed: " << seed << "\n";
    return (dir_ / name).string();
  };
  // Given in another seed order than the baseline's: pairs by seed, not by position.
  auto c = CompareRuns({{"sync", run("s0", 0, 0.90)},
                        {"sync", run("s1", 1, 0.94)},
                        {"sync", run("s2", 2, 0.98)},
                        {"async", run("a2", 2, 0.99)},
                        {"async", run("a0", 0, 0.91)},
                        {"async", run("a1", 1, 0.95)},
                        {"other", run("o0", 0, 0.91)},
                        {"other", run("o1", 1, 0.95)},
                        {"other", run("o3", 3, 0.99)}});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(c->markdown.find("| async | 3 | 95.0% (91.0..99.0) | +1.0 ± 0.0 points | no: better at some evaluation"),
            std::string::npos)
      << c->markdown;
  // "other" ran seed 3, which the baseline did not: Welch's interval, wide.
  EXPECT_EQ(c->markdown.find("| other | 3 | 95.0% (91.0..99.0) | +1.0 ± 0.0 points"), std::string::npos) << c->markdown;
  EXPECT_NE(c->markdown.find("the others are Welch's (unpaired)"), std::string::npos) << c->markdown;
}

TEST_F(ReportTest, CompareSaysWhereAsyncIsNotAtParity) {
  auto run = [&](const std::string& name, double acc) {
    fs::create_directories(dir_ / name);
    std::ofstream(dir_ / name / "metrics.jsonl")
        << "{\"step\":1,\"samples_trained\":10,\"reward_mean\":0.5,\"eval_accuracy\":" << acc << "}\n";
    return (dir_ / name).string();
  };
  // A baseline of three seeds, a configuration close to it and one 2.3 points lower.
  auto compare = [&](const std::string& prefix, std::vector<double> sync) {
    std::vector<LabeledRun> runs;
    for (size_t i = 0; i < sync.size(); ++i) runs.push_back({"sync", run(prefix + std::to_string(i), sync[i])});
    for (double acc : {0.945, 0.95, 0.955}) runs.push_back({"close", run("c" + std::to_string(acc), acc)});
    for (double acc : {0.93, 0.931, 0.92}) runs.push_back({"drop", run("d" + std::to_string(acc), acc)});
    return CompareRuns(runs);
  };
  // Inside sync's seed range (0.92..0.98), yet 2.3 points lower: not parity.
  auto c = compare("s", {0.92, 0.95, 0.98});
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NE(c->markdown.find("| close | 3 | 95.0% (94.5..95.5) | +0.0 ± "), std::string::npos) << c->markdown;
  EXPECT_NE(c->markdown.find("| drop | 3 | 92.7% (92.0..93.1) | -2.3 ± "), std::string::npos) << c->markdown;
  // sync's own spread (sd 3 points) keeps every interval wider than +-2 points: no claim either way.
  EXPECT_NE(c->markdown.find("not shown: interval up to"), std::string::npos) << c->markdown;
  // A tight baseline: the drop is shown as such, the close config as parity.
  c = compare("t", {0.95, 0.951, 0.949});
  ASSERT_TRUE(c.ok());
  EXPECT_NE(c->markdown.find("| close | 3 | 95.0% (94.5..95.5) | +0.0 ± 1.3 points | yes |"), std::string::npos)
      << c->markdown;
  EXPECT_NE(c->markdown.find("no: worse at some evaluation"), std::string::npos) << c->markdown;
}

TEST_F(ReportTest, MissingOrMalformedMetricsAreClearErrors) {
  EXPECT_EQ(RenderRunReport(dir_.string()).status().code(), StatusCode::kNotFound);
  WriteMetrics("{\"step\":1}\nnot json\n");
  auto r = RenderRunReport(dir_.string());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("metrics.jsonl:2"), std::string::npos) << r.status().ToString();
}

// A run stopped mid-write (a full disk, a kill) leaves half a last line
// without its newline: the report shows the steps before it. The same bytes
// with a newline after them are a damaged file, not a torn write.
TEST_F(ReportTest, ATornLastLineIsSkipped) {
  WriteMetrics("{\"step\":1,\"reward_mean\":0.5}\n{\"step\":2,\"reward_mean\":0.7}\n{\"step\":3,\"rew");
  auto r = RenderRunReport(dir_.string());
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_NE(r->find("2 RL steps recorded"), std::string::npos);
  WriteMetrics("{\"step\":1,\"reward_mean\":0.5}\n{\"step\":3,\"rew\n");
  EXPECT_EQ(RenderRunReport(dir_.string()).status().code(), StatusCode::kDataLoss);
}

}  // namespace
}  // namespace sluice::launch
