//===- VTDialect.h - vTensor dialect ----------------------------*- C++ -*-===//
//
// The vt dialect class. Include VTOps.h for the whole dialect (types,
// attributes, ops and helpers).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_DIALECT_VT_VTDIALECT_H
#define VFLOW_DIALECT_VT_VTDIALECT_H

#include "mlir/IR/Dialect.h"

#include "vflow/Dialect/VT/VTDialect.h.inc"

#endif // VFLOW_DIALECT_VT_VTDIALECT_H
