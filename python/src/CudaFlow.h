//===- CudaFlow.h - vflow._vflow.CudaFlow ------------------------*- C++
//-*-===//
//
// Binds CudaFlow (CudaFlow.cpp): a flow's kernels on the device for the
// torch ops. Only in builds with the CUDA runtime.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_PYTHON_CUDAFLOW_H
#define VFLOW_PYTHON_CUDAFLOW_H

#include <pybind11/pybind11.h>

namespace vflow::python {

void bindCudaFlow(pybind11::module_ &m);

} // namespace vflow::python

#endif // VFLOW_PYTHON_CUDAFLOW_H
