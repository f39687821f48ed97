#include "sluice/common/status.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sluice/common/check.h"
#include "sluice/common/enum_names.h"
#include "sluice/common/host_tensor.h"

namespace sluice {
namespace {

// An enum's one list of names serves both ways; a value past the list gets
// the fallback. Fails if EnumName or EnumNamed is off by one, or a name
// list's order drifts from its enum's (DType's, StatusCode's).
TEST(EnumNamesTest, NamesAndValuesComeFromOneList) {
  enum class Color { kRed, kGreen, kBlue };
  static constexpr const char* kColors[] = {"red", "green", "blue"};
  EXPECT_STREQ(EnumName(kColors, Color::kRed), "red");
  EXPECT_STREQ(EnumName(kColors, Color::kBlue), "blue");
  EXPECT_STREQ(EnumName(kColors, static_cast<Color>(7)), "?");
  EXPECT_STREQ(EnumName(kColors, static_cast<Color>(7), "no color"), "no color");
  EXPECT_EQ(EnumNamed<Color>(kColors, "green"), Color::kGreen);
  EXPECT_EQ(EnumNamed<Color>(kColors, "Green"), std::nullopt);
  for (DType d : {DType::kF64, DType::kBF16, DType::kI8, DType::kBool}) {
    EXPECT_EQ(ParseDTypeName(DTypeName(d)), d) << DTypeName(d);
  }
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(StatusCodeName(StatusCode::kDataLoss), "DataLoss");
  EXPECT_EQ(StatusCodeName(static_cast<StatusCode>(99)), "Unknown");
}

TEST(StatusTest, DefaultIsOk) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(s, Status::Ok());
}

TEST(StatusTest, FactoriesSetCodeAndMessage) {
  struct Case {
    Status status;
    StatusCode code;
    const char* name;
  };
  const std::vector<Case> cases = {
      {Status::InvalidArgument("m"), StatusCode::kInvalidArgument, "InvalidArgument"},
      {Status::NotFound("m"), StatusCode::kNotFound, "NotFound"},
      {Status::AlreadyExists("m"), StatusCode::kAlreadyExists, "AlreadyExists"},
      {Status::OutOfRange("m"), StatusCode::kOutOfRange, "OutOfRange"},
      {Status::FailedPrecondition("m"), StatusCode::kFailedPrecondition, "FailedPrecondition"},
      {Status::ResourceExhausted("m"), StatusCode::kResourceExhausted, "ResourceExhausted"},
      {Status::Timeout("m"), StatusCode::kTimeout, "Timeout"},
      {Status::Aborted("m"), StatusCode::kAborted, "Aborted"},
      {Status::Unavailable("m"), StatusCode::kUnavailable, "Unavailable"},
      {Status::DataLoss("m"), StatusCode::kDataLoss, "DataLoss"},
      {Status::Unimplemented("m"), StatusCode::kUnimplemented, "Unimplemented"},
      {Status::Internal("m"), StatusCode::kInternal, "Internal"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_FALSE(c.status.ok());
    EXPECT_EQ(c.status.code(), c.code);
    EXPECT_EQ(c.status.message(), "m");
    EXPECT_EQ(StatusCodeName(c.code), c.name);
    EXPECT_EQ(c.status.ToString(), std::string(c.name) + ": m");
  }
  EXPECT_EQ(StatusCodeName(StatusCode::kOk), "OK");
}

TEST(StatusTest, ConstructingWithOkCodeIsOkAndDropsMessage) {
  Status s(StatusCode::kOk, "ignored");
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.message(), "");
}

TEST(StatusTest, EqualityComparesCodeAndMessage) {
  EXPECT_EQ(Status::NotFound("a"), Status::NotFound("a"));
  EXPECT_FALSE(Status::NotFound("a") == Status::NotFound("b"));
  EXPECT_FALSE(Status::NotFound("a") == Status::Internal("a"));
  EXPECT_FALSE(Status::NotFound("") == Status::Ok());
}

TEST(StatusTest, WithContextPrefixesMessageAndKeepsCode) {
  Status s = Status::DataLoss("bad byte").WithContext("reading x.bin");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "reading x.bin: bad byte");
  EXPECT_EQ(s.ToString(), "DataLoss: reading x.bin: bad byte");
  EXPECT_TRUE(Status::Ok().WithContext("anything").ok());
}

TEST(StatusTest, CopiesAreIndependentValues) {
  Status a = Status::Timeout("slow");
  Status b = a;
  a = Status::Ok();
  EXPECT_TRUE(a.ok());
  EXPECT_EQ(b.code(), StatusCode::kTimeout);
  EXPECT_EQ(b.message(), "slow");
}

Result<int> Half(int x) {
  if (x % 2 != 0) return Status::InvalidArgument("odd: " + std::to_string(x));
  return x / 2;
}

TEST(ResultTest, ValuePath) {
  Result<int> r = Half(10);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r.status().ok());
  EXPECT_EQ(r.value(), 5);
  EXPECT_EQ(*r, 5);
}

TEST(ResultTest, ErrorPath) {
  Result<int> r = Half(3);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().message(), "odd: 3");
}

TEST(ResultTest, OkStatusWithoutValueBecomesInternal) {
  Result<int> r{Status::Ok()};
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
}

TEST(ResultTest, MoveOnlyValueAndArrow) {
  Result<std::unique_ptr<std::string>> r = std::make_unique<std::string>("hello");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->size(), 5u);
  std::unique_ptr<std::string> taken = std::move(r).value();
  EXPECT_EQ(*taken, "hello");

  Result<std::string> s = std::string("abc");
  EXPECT_EQ(s->size(), 3u);
}

TEST(ResultDeathTest, ValueOnErrorAbortsWithMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Result<int> r = Status::NotFound("no such widget");
  EXPECT_DEATH((void)r.value(), "NotFound: no such widget");
}

Status FailIf(bool fail, int* calls) {
  ++*calls;
  return fail ? Status::Aborted("stopped") : Status::Ok();
}

Status TwoSteps(bool fail_first, int* calls) {
  SLUICE_RETURN_IF_ERROR(FailIf(fail_first, calls));
  SLUICE_RETURN_IF_ERROR(FailIf(false, calls));
  return Status::Ok();
}

TEST(StatusMacroTest, ReturnIfErrorPropagatesFirstError) {
  int calls = 0;
  Status s = TwoSteps(/*fail_first=*/true, &calls);
  EXPECT_EQ(s, Status::Aborted("stopped"));
  EXPECT_EQ(calls, 1);  // the second step never ran

  calls = 0;
  EXPECT_TRUE(TwoSteps(/*fail_first=*/false, &calls).ok());
  EXPECT_EQ(calls, 2);
}

Result<int> Quarter(int x) {
  SLUICE_ASSIGN_OR_RETURN(int half, Half(x));
  SLUICE_ASSIGN_OR_RETURN(auto quarter, Half(half));  // two on different lines: distinct temporaries
  return quarter;
}

Status StoreQuarter(int x, int* out) {
  SLUICE_ASSIGN_OR_RETURN(*out, Quarter(x));
  return Status::Ok();
}

TEST(StatusMacroTest, AssignOrReturnAssignsOrPropagates) {
  Result<int> ok = Quarter(12);
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(*ok, 3);

  Result<int> err = Quarter(6);  // 6 -> 3 -> odd
  ASSERT_FALSE(err.ok());
  EXPECT_EQ(err.status(), Status::InvalidArgument("odd: 3"));

  int out = -1;
  EXPECT_TRUE(StoreQuarter(8, &out).ok());
  EXPECT_EQ(out, 2);
  out = -1;
  EXPECT_EQ(StoreQuarter(7, &out).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(out, -1);  // untouched on error
}

TEST(CheckTest, PassingCheckDoesNotEvaluateStream) {
  int evaluated = 0;
  auto side_effect = [&] { return ++evaluated; };
  SLUICE_CHECK(1 + 1 == 2) << side_effect();
  SLUICE_CHECK_EQ(2, 2);
  SLUICE_CHECK_LE(1, 2);
  SLUICE_CHECK_LT(1, 2);
  SLUICE_CHECK_OK(Status::Ok());
  EXPECT_EQ(evaluated, 0);
}

TEST(CheckDeathTest, CheckAbortsWithFileLineAndMessage) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int line = __LINE__ + 1;
  EXPECT_DEATH(SLUICE_CHECK(1 > 2) << "extra " << 42,
               "status_test\\.cc:" + std::to_string(line) + ": SLUICE_CHECK\\(1 > 2\\) failed\\. extra 42");
}

TEST(CheckDeathTest, CheckEqShowsBothValues) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  int a = 3, b = 4;
  EXPECT_DEATH(SLUICE_CHECK_EQ(a, b), "a = 3, b = 4");
}

TEST(CheckDeathTest, CheckOkAbortsWithFileLineAndStatus) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const int line = __LINE__ + 1;
  EXPECT_DEATH(SLUICE_CHECK_OK(Status::Internal("boom")),
               "status_test\\.cc:" + std::to_string(line) + ": SLUICE_CHECK_OK failed: Internal: boom");
}

TEST(DTypeTest, NamesRoundTripAndSizes) {
  struct Case {
    DType dtype;
    const char* name;
    size_t size;
  };
  const std::vector<Case> cases = {
      {DType::kF64, "F64", 8}, {DType::kF32, "F32", 4},   {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
      {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},   {DType::kI16, "I16", 2}, {DType::kI8, "I8", 1},
      {DType::kU8, "U8", 1},   {DType::kBool, "BOOL", 1},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(DTypeName(c.dtype), c.name);
    EXPECT_EQ(DTypeSize(c.dtype), c.size);
    auto parsed = ParseDTypeName(c.name);
    ASSERT_TRUE(parsed.has_value());
    EXPECT_EQ(*parsed, c.dtype);
  }
  EXPECT_FALSE(ParseDTypeName("f32").has_value());  // the spelling is case-sensitive
  EXPECT_FALSE(ParseDTypeName("F8_E4M3").has_value());
  EXPECT_FALSE(ParseDTypeName("").has_value());
}

TEST(CheckedNumelTest, Products) {
  auto scalar = CheckedNumel({});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(*scalar, 1u);
  auto matrix = CheckedNumel({3, 4, 5});
  ASSERT_TRUE(matrix.ok());
  EXPECT_EQ(*matrix, 60u);
  auto empty = CheckedNumel({7, 0, 9});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, 0u);
}

TEST(CheckedNumelTest, ZeroDimensionWinsOverHugeOnes) {
  // Regression: the overflow check used to fire before reaching the 0.
  const int64_t big = int64_t{1} << 40;
  auto r = CheckedNumel({big, big, 0});
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, 0u);
  EXPECT_EQ(CheckedNumel({0, -1}).status().code(), StatusCode::kInvalidArgument);  // still rejected
}

TEST(CheckedNumelTest, NegativeDimensionIsInvalidArgument) {
  auto r = CheckedNumel({2, -3});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("negative dimension -3"), std::string::npos) << r.status().ToString();
}

TEST(CheckedNumelTest, OverflowIsOutOfRange) {
  const int64_t big = int64_t{1} << 32;
  auto r = CheckedNumel({big, big, big});  // 2^96 would wrap a uint64_t
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);

  auto at_limit = CheckedNumel({10, 10}, /*limit=*/100);
  ASSERT_TRUE(at_limit.ok());
  EXPECT_EQ(*at_limit, 100u);
  auto over_limit = CheckedNumel({10, 11}, /*limit=*/100);
  EXPECT_EQ(over_limit.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(over_limit.status().message().find("100"), std::string::npos);
}

TEST(HostTensorTest, CopyOwnsIndependentBytes) {
  std::vector<float> values = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f};
  HostTensor t = HostTensor::Copy(DType::kF32, {2, 3}, values.data(), values.size() * sizeof(float));
  values[0] = 99.0f;  // the copy must not alias the source
  EXPECT_EQ(t.dtype, DType::kF32);
  EXPECT_EQ(t.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t.numel(), 6u);
  ASSERT_EQ(t.nbytes, 24u);
  ASSERT_NE(t.data, nullptr);
  ASSERT_NE(t.owner, nullptr);
  float first;
  std::memcpy(&first, t.data, sizeof(first));
  EXPECT_EQ(first, 1.5f);

  HostTensor shared = t;  // copies share the owner and the bytes
  EXPECT_EQ(shared.data, t.data);
  EXPECT_EQ(shared.owner.get(), t.owner.get());
}

TEST(HostTensorTest, CopyOfEmptyTensorAndScalar) {
  HostTensor empty = HostTensor::Copy(DType::kBF16, {0, 4}, nullptr, 0);
  EXPECT_EQ(empty.numel(), 0u);
  EXPECT_EQ(empty.nbytes, 0u);

  int64_t v = -7;
  HostTensor scalar = HostTensor::Copy(DType::kI64, {}, &v, sizeof(v));
  EXPECT_EQ(scalar.numel(), 1u);
  int64_t back;
  std::memcpy(&back, scalar.data, sizeof(back));
  EXPECT_EQ(back, -7);
}

TEST(HostTensorDeathTest, CopyWithWrongByteCountAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  std::vector<uint8_t> bytes(5);
  EXPECT_DEATH(HostTensor::Copy(DType::kF32, {2}, bytes.data(), bytes.size()), "host_tensor\\.cc:[0-9]+: SLUICE_CHECK");
}

TEST(HostTensorDeathTest, CopyRejectsShapesWhoseProductWraps) {
  // Regression: numel() wrapped, so these matched nbytes == 0 and were accepted.
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(HostTensor::Copy(DType::kF32, {-1, 0}, nullptr, 0), "negative dimension -1");
  EXPECT_DEATH(HostTensor::Copy(DType::kF32, {int64_t{1} << 62, 4}, nullptr, 0), "OutOfRange");
}

}  // namespace
}  // namespace sluice
