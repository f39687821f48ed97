#include "sluice/model/device.h"

#include <torch/cuda.h>

#include <charconv>

namespace sluice::model {

namespace {

// The index of "cuda:N" (-1 for plain "cuda"), or an error naming the text.
Result<int> CudaIndex(const std::string& name) {
  if (name == "cuda") return -1;
  const std::string prefix = "cuda:";
  if (name.rfind(prefix, 0) == 0 && name.size() > prefix.size() && name.size() <= prefix.size() + 3) {
    int index = 0;
    const char* begin = name.data() + prefix.size();
    const char* end = name.data() + name.size();
    auto [ptr, ec] = std::from_chars(begin, end, index);
    if (ec == std::errc() && ptr == end && index >= 0) return index;
  }
  return Status::InvalidArgument("device '" + name + "' is not one of auto, cpu, cuda, cuda:N");
}

}  // namespace

bool CudaAvailable() { return torch::cuda::is_available(); }

Status CheckDeviceName(const std::string& name) {
  if (name == "auto" || name == "cpu") return Status::Ok();
  return CudaIndex(name).status();
}

Result<c10::Device> ResolveDevice(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "auto") return CudaAvailable() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  SLUICE_ASSIGN_OR_RETURN(int index, CudaIndex(name));
  if (!CudaAvailable()) {
    return Status::FailedPrecondition("device '" + name +
                                      "' asked for, but no CUDA device is available to this process (a CPU-only "
                                      "libtorch, no GPU, or CUDA_VISIBLE_DEVICES hides it)");
  }
  const auto count = static_cast<int>(torch::cuda::device_count());
  if (index >= count) {
    return Status::FailedPrecondition("device '" + name + "' asked for, but only " + std::to_string(count) +
                                      " CUDA device(s) are visible");
  }
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(index < 0 ? 0 : index));
}

Result<c10::ScalarType> ResolveDtype(const std::string& name, c10::Device device) {
  if (name == "float32") return c10::ScalarType::Float;
  if (name == "bfloat16") return c10::ScalarType::BFloat16;
  if (name == "auto") return device.is_cuda() ? c10::ScalarType::BFloat16 : c10::ScalarType::Float;
  return Status::InvalidArgument("dtype '" + name + "' is not one of auto, float32, bfloat16");
}

}  // namespace sluice::model
