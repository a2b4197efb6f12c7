//===- ASTPrinter.h - Printing the AST --------------------------*- C++ -*-===//

#ifndef VFLOW_FRONTEND_ASTPRINTER_H
#define VFLOW_FRONTEND_ASTPRINTER_H

#include "vflow/Frontend/AST.h"

#include <string>

namespace vflow {

/// Prints the AST as an indented tree with line:col of each node and, after
/// semantic analysis, the shape of each expression (`vflowc --emit=ast`).
std::string printAST(const ast::Module &module, const SourceBuffer &buffer);

} // namespace vflow

#endif // VFLOW_FRONTEND_ASTPRINTER_H
