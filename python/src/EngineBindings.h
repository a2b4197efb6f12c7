//===- EngineBindings.h - vflow._vflow.Engine --------------------*- C++
//-*-===//
//
// Binds the serving engine (EngineBindings.cpp). Only in builds with BLAS
// (the CPU model runner's GEMMs).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_PYTHON_ENGINEBINDINGS_H
#define VFLOW_PYTHON_ENGINEBINDINGS_H

#include <pybind11/pybind11.h>

namespace vflow::python {

void bindEngine(pybind11::module_ &m);

} // namespace vflow::python

#endif // VFLOW_PYTHON_ENGINEBINDINGS_H
