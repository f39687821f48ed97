// The main of every gtest binary: gtest's own, plus a listener that reports
// each skipped test (GTEST_SKIP) by name on stderr and, where the environment
// names one, in the file SLUICE_SKIP_LOG (a line each, appended), which the
// test command reads to list what did not run (setup.sh). Child entry points
// (skip.h) are not reported.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "common/testing/skip.h"

namespace {

class SkipReporter : public ::testing::EmptyTestEventListener {
 public:
  explicit SkipReporter(std::string binary) : binary_(std::move(binary)) {}

  void OnTestEnd(const ::testing::TestInfo& info) override {
    const ::testing::TestResult* result = info.result();
    if (result == nullptr || !result->Skipped()) return;
    std::string why;
    for (int i = 0; i < result->total_part_count(); ++i) {
      const ::testing::TestPartResult& part = result->GetTestPartResult(i);
      if (part.skipped() && part.message() != nullptr) why = part.message();
    }
    if (why.rfind(sluice::testing::kChildEntrySkip, 0) == 0) return;
    for (char& c : why) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    const std::string line = binary_ + ": " + info.test_suite_name() + "." + info.name() +
                             " skipped: " + (why.empty() ? "(no reason)" : why) + "\n";
    static_cast<void>(::write(STDERR_FILENO, line.data(), line.size()));
    const char* log = std::getenv("SLUICE_SKIP_LOG");
    if (log == nullptr || *log == '\0') return;
    const int fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return;
    static_cast<void>(::write(fd, line.data(), line.size()));  // one append: whole lines even from parallel tests
    ::close(fd);
  }

 private:
  std::string binary_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string binary = argc > 0 && argv[0] != nullptr ? argv[0] : "test";
  if (const size_t slash = binary.rfind('/'); slash != std::string::npos) binary.erase(0, slash + 1);
  ::testing::UnitTest::GetInstance()->listeners().Append(new SkipReporter(std::move(binary)));
  return RUN_ALL_TESTS();
}
