// SLUICE_CHECK: broken invariants (bugs), not bad input. Aborts with file:line.
// Bad input from users, files or the wire is reported with Status instead;
// see docs/errors.md for which is which.
#ifndef SLUICE_COMMON_CHECK_H_
#define SLUICE_COMMON_CHECK_H_

#include <sstream>
#include <string>

namespace sluice::internal {

[[noreturn]] void CheckFailed(const char* file, int line, const char* condition, const std::string& message);

// Collects an optional streamed message, then aborts in its destructor.
class CheckFailureStream {
 public:
  CheckFailureStream(const char* file, int line, const char* condition)
      : file_(file), line_(line), condition_(condition) {}
  [[noreturn]] ~CheckFailureStream() { CheckFailed(file_, line_, condition_, stream_.str()); }
  template <typename T>
  CheckFailureStream& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  const char* file_;
  int line_;
  const char* condition_;
  std::ostringstream stream_;
};

// Makes `cond ? (void)0 : Voidify() & stream << ...` type-check.
struct Voidify {
  void operator&(const CheckFailureStream&) {}
};

}  // namespace sluice::internal

// SLUICE_CHECK(x > 0) << "extra context " << x;
#define SLUICE_CHECK(cond) \
  (cond) ? (void)0 : ::sluice::internal::Voidify() & ::sluice::internal::CheckFailureStream(__FILE__, __LINE__, #cond)

#define SLUICE_CHECK_EQ(a, b) SLUICE_CHECK((a) == (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define SLUICE_CHECK_LE(a, b) SLUICE_CHECK((a) <= (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "
#define SLUICE_CHECK_LT(a, b) SLUICE_CHECK((a) < (b)) << #a " = " << (a) << ", " #b " = " << (b) << ". "

#endif  // SLUICE_COMMON_CHECK_H_
