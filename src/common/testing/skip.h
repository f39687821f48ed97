// Private to the tests. Every test binary's main (test_main.cc) reports each
// skipped test by name, so the test command can say what did not run. A test
// that is only the entry point of a child process its suite spawns skips in
// an ordinary run by design: it says so with SLUICE_CHILD_ENTRY_ONLY, which
// the report leaves out.
#ifndef SLUICE_SRC_COMMON_TESTING_SKIP_H_
#define SLUICE_SRC_COMMON_TESTING_SKIP_H_

#include <gtest/gtest.h>

namespace sluice::testing {

// The prefix of a child entry point's skip message.
inline constexpr char kChildEntrySkip[] = "[child entry point]";

}  // namespace sluice::testing

// Ends the test as skipped, not reported: `spawner` names the test that runs
// this one in a child process.
#define SLUICE_CHILD_ENTRY_ONLY(spawner) \
  GTEST_SKIP() << ::sluice::testing::kChildEntrySkip << " runs only as a child process of " << (spawner)

#endif  // SLUICE_SRC_COMMON_TESTING_SKIP_H_
