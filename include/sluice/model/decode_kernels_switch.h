// The switch for the model's CPU decode kernels (src/model/decode_kernels.h),
// without libtorch. On by default; off sends the cached (decode) path through
// libtorch, as on GPUs: to test that path, or to compare the two.
#pragma once

namespace sluice::model {

bool DecodeKernelsEnabled();
void SetDecodeKernelsEnabled(bool enabled);  // process-wide

}  // namespace sluice::model
