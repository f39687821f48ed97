// Where a model runs and in which dtype, as users name them in configs and
// flags: "auto", "cpu", "cuda", "cuda:N"; "auto", "float32", "bfloat16".
#ifndef SLUICE_MODEL_DEVICE_H_
#define SLUICE_MODEL_DEVICE_H_

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <string>

#include "sluice/common/status.h"

namespace sluice::model {

// "auto": cuda:0 when libtorch sees a CUDA device, else cpu; "cpu"; "cuda"
// (cuda:0); "cuda:N". InvalidArgument for any other name, FailedPrecondition
// for a CUDA device this process cannot use (no GPU, a CPU-only libtorch, N
// beyond the device count).
Result<c10::Device> ResolveDevice(const std::string& name);

// Checks a device name's spelling only (no CUDA query): for config
// validation on a machine other than the one that will run it.
Status CheckDeviceName(const std::string& name);

// "auto": bfloat16 on CUDA, float32 elsewhere; "float32"; "bfloat16" (on a
// CPU: bfloat16 matrices computed in float32, see PlaceModel). InvalidArgument
// for any other name.
Result<c10::ScalarType> ResolveDtype(const std::string& name, c10::Device device);

// Whether a CUDA device is usable (libtorch built with CUDA and a GPU seen).
bool CudaAvailable();

}  // namespace sluice::model

#endif  // SLUICE_MODEL_DEVICE_H_
