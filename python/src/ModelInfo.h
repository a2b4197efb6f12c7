//===- ModelInfo.h - vflow._vflow.model_info --------------------*- C++ -*-===//
//
// Binds model_info(path): a model's config and GGUF metadata as JSON text,
// for the Python side of the serving engine (its tokenizer reads the GGUF
// vocabulary from there). checkPath refuses a path no file can have.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_PYTHON_MODELINFO_H
#define VFLOW_PYTHON_MODELINFO_H

#include <pybind11/pybind11.h>

#include <string>

namespace vflow::python {

void bindModelInfo(pybind11::module_ &m);

/// A ValueError naming `what` when `path` cannot name a file (it is empty
/// or holds a NUL byte, which the operating system would cut the name at):
/// rt::checkPathText for every path a binding passes to the runtime.
void checkPath(const std::string &path, const std::string &what);

} // namespace vflow::python

#endif // VFLOW_PYTHON_MODELINFO_H
