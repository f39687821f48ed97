// Least squares with non-negative coefficients, for fitting cost profiles
// from measurements (a cost never shrinks with more work).
//
// Thread safety: pure function.
#ifndef SLUICE_SIMULATE_FIT_H_
#define SLUICE_SIMULATE_FIT_H_

#include <vector>

#include "sluice/common/status.h"

namespace sluice::simulate {

// Minimises sum_i weight_i (y_i - x_i . c)^2 over c >= 0 (an active-set
// method: a coefficient the unconstrained fit makes negative is fixed at 0
// and the rest refitted). Returns c, one entry per column of x.
// InvalidArgument on ragged or empty input, mismatched sizes, or
// non-finite values or weights <= 0.
Result<std::vector<double>> FitNonNegative(const std::vector<std::vector<double>>& x, const std::vector<double>& y,
                                           const std::vector<double>& weight);

}  // namespace sluice::simulate

#endif  // SLUICE_SIMULATE_FIT_H_
