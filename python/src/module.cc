// sluice._C: the extension module behind the `sluice` Python package. It is
// private; the public API is the Python modules (python/sluice/), which
// import torch before this module (libtorch_python must be initialized first).
#include <malloc.h>
#include <pybind11/pybind11.h>

#include <cstdlib>
#include <exception>
#include <string>

#include "bindings.h"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "Sluice's C++ core (private: use the sluice package)";

  // glibc serves allocations over 128 KiB-32 MiB (its dynamic threshold)
  // with fresh mappings and trims freed heap early, so every hub message of
  // that size faulted its pages in anew: a Python put of 256 x 4 KiB rows
  // over TCP took 4.8 ms, 0.86 ms with buffers below 32 MiB kept in the
  // heap. docs/python.md says how to opt out (SLUICE_KEEP_MALLOC=1).
  if (const char* keep = std::getenv("SLUICE_KEEP_MALLOC"); keep == nullptr || std::string(keep) != "1") {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 256 << 20);
  }

  // A StatusError becomes sluice.errors.<Code>(message), e.g.
  // sluice.errors.NotFound; the class carries .code and .message.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const sluice::python::StatusError& e) {
      const sluice::Status& s = e.status();
      py::object make = py::module_::import("sluice.errors").attr("_from_status");
      py::object exc = make(std::string(sluice::StatusCodeName(s.code())), s.message());
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  py::module_ tq = m.def_submodule("transfer_queue", "TransferQueue client (private: use sluice.transfer_queue)");
  sluice::python::BindTransferQueue(tq);

  py::module_ ce =
      m.def_submodule("checkpoint_engine", "CheckpointEngine stores (private: use sluice.checkpoint_engine)");
  sluice::python::BindCheckpointEngine(ce);
}
