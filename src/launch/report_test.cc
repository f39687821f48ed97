#include "sluice/launch/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace sluice::launch {
namespace {

namespace fs = std::filesystem;

class ReportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("sluice_report_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
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
}

TEST_F(ReportTest, MissingOrMalformedMetricsAreClearErrors) {
  EXPECT_EQ(RenderRunReport(dir_.string()).status().code(), StatusCode::kNotFound);
  WriteMetrics("{\"step\":1}\nnot json\n");
  auto r = RenderRunReport(dir_.string());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("metrics.jsonl:2"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace sluice::launch
