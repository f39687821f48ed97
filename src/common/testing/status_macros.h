// gtest checks of a Status or a Result, for every test binary.
#ifndef SLUICE_COMMON_TESTING_STATUS_MACROS_H_
#define SLUICE_COMMON_TESTING_STATUS_MACROS_H_

#include <gtest/gtest.h>

#include <string>

#include "sluice/common/status.h"

namespace sluice::status_testing {

inline Status StatusOf(const Status& s) { return s; }
template <typename T>
Status StatusOf(const Result<T>& r) {
  return r.status();
}

}  // namespace sluice::status_testing

#define SLUICE_ASSERT_OK(expr)                                                        \
  do {                                                                                \
    const ::sluice::Status sluice_status_ = ::sluice::status_testing::StatusOf(expr); \
    ASSERT_TRUE(sluice_status_.ok()) << sluice_status_.ToString();                    \
  } while (0)
#define SLUICE_EXPECT_OK(expr)                                                        \
  do {                                                                                \
    const ::sluice::Status sluice_status_ = ::sluice::status_testing::StatusOf(expr); \
    EXPECT_TRUE(sluice_status_.ok()) << sluice_status_.ToString();                    \
  } while (0)
// Expects a Status or Result to carry `expected_code` and a message containing `needle`.
#define SLUICE_EXPECT_ERROR(expr, expected_code, needle)                                                \
  do {                                                                                                  \
    const ::sluice::Status sluice_status_ = ::sluice::status_testing::StatusOf((expr));                 \
    EXPECT_EQ(sluice_status_.code(), ::sluice::StatusCode::expected_code) << sluice_status_.ToString(); \
    EXPECT_NE(sluice_status_.message().find(needle), std::string::npos) << sluice_status_.ToString();   \
  } while (0)

// Asserts a Result is ok and moves its value into `lhs` (a declaration or
// an lvalue).
#define SLUICE_ASSERT_OK_AND_ASSIGN(lhs, expr) \
  SLUICE_ASSERT_OK_AND_ASSIGN_IMPL_(SLUICE_TESTING_CONCAT_(sluice_result_, __LINE__), lhs, expr)
#define SLUICE_TESTING_CONCAT_INNER_(a, b) a##b
#define SLUICE_TESTING_CONCAT_(a, b) SLUICE_TESTING_CONCAT_INNER_(a, b)
#define SLUICE_ASSERT_OK_AND_ASSIGN_IMPL_(result, lhs, expr) \
  auto result = (expr);                                      \
  ASSERT_TRUE(result.ok()) << result.status().ToString();    \
  lhs = std::move(result).value()

#endif  // SLUICE_COMMON_TESTING_STATUS_MACROS_H_
