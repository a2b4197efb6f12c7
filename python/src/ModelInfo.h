//===- ModelInfo.h - vflow._vflow.model_info --------------------*- C++ -*-===//
//
// Binds model_info(path): a model's config and GGUF metadata as JSON text,
// for the Python side of the serving engine (its tokenizer reads the GGUF
// vocabulary from there).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_PYTHON_MODELINFO_H
#define VFLOW_PYTHON_MODELINFO_H

#include <pybind11/pybind11.h>

namespace vflow::python {

void bindModelInfo(pybind11::module_ &m);

} // namespace vflow::python

#endif // VFLOW_PYTHON_MODELINFO_H
