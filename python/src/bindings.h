// The pieces of the sluice._C extension (python/CMakeLists.txt): one Bind*
// function per component, each in its own translation unit, called by
// module.cc. Only those translation units include libtorch's Python headers.
//
// Errors: a C++ Status reaches Python as the matching exception class of
// sluice.errors (StatusError below, translated in module.cc); caller
// mistakes the binding itself detects are ValueError / TypeError.
#ifndef SLUICE_PYTHON_SRC_BINDINGS_H_
#define SLUICE_PYTHON_SRC_BINDINGS_H_

#include <pybind11/pybind11.h>

#include <exception>
#include <string>
#include <utility>

#include "sluice/common/status.h"

namespace sluice::python {

// Thrown by binding code for a non-OK Status; module.cc turns it into
// sluice.errors.<Code> carrying the code and the message.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status) : status_(std::move(status)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return std::move(result).value();
}

// Adds the TransferQueue client to `m` (sluice._C.transfer_queue).
void BindTransferQueue(pybind11::module_& m);

// Adds the CheckpointEngine's shared-memory and in-process stores to `m`
// (sluice._C.checkpoint_engine).
void BindCheckpointEngine(pybind11::module_& m);

}  // namespace sluice::python

#endif  // SLUICE_PYTHON_SRC_BINDINGS_H_
