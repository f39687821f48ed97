#include "sluice/simulate/fit.h"

#include <gtest/gtest.h>

namespace sluice::simulate {
namespace {

TEST(FitTest, RecoversAnExactLinearCost) {
  std::vector<std::vector<double>> x;
  std::vector<double> y, w;
  for (double rows : {1.0, 4.0, 16.0, 64.0}) {
    for (double ctx : {16.0, 100.0, 300.0}) {
      x.push_back({1.0, rows, rows * ctx});
      y.push_back(0.002 + 3e-5 * rows + 2e-7 * rows * ctx);
      w.push_back(1.0 / (y.back() * y.back()));
    }
  }
  auto c = FitNonNegative(x, y, w);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_NEAR((*c)[0], 0.002, 1e-9);
  EXPECT_NEAR((*c)[1], 3e-5, 1e-11);
  EXPECT_NEAR((*c)[2], 2e-7, 1e-13);
}

TEST(FitTest, ACoefficientThatWouldBeNegativeIsZero) {
  // y falls with the second feature: unconstrained, its coefficient is
  // negative; constrained, it is 0 and the first absorbs the data.
  std::vector<std::vector<double>> x = {{1, 0}, {1, 1}, {1, 2}, {1, 3}};
  std::vector<double> y = {4, 3, 2, 1}, w(4, 1.0);
  auto c = FitNonNegative(x, y, w);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[1], 0.0);
  EXPECT_NEAR((*c)[0], 2.5, 1e-12);
}

TEST(FitTest, RefusesBadInput) {
  EXPECT_FALSE(FitNonNegative({}, {}, {}).ok());
  EXPECT_FALSE(FitNonNegative({{1, 2}, {1}}, {1, 2}, {1, 1}).ok());
  EXPECT_FALSE(FitNonNegative({{1}}, {1, 2}, {1}).ok());
  EXPECT_FALSE(FitNonNegative({{1}}, {1}, {0}).ok());
}

}  // namespace
}  // namespace sluice::simulate
