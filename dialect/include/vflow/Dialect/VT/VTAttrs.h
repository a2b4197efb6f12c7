//===- VTAttrs.h - vTensor attributes and enums -----------------*- C++ -*-===//
//
// Enums InputKind, ReduceKind, CmpPredicate (with stringify*/symbolize*
// helpers) and AxisAttr (`#vt.axis<"name", size>`).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_DIALECT_VT_VTATTRS_H
#define VFLOW_DIALECT_VT_VTATTRS_H

#include "mlir/IR/Attributes.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/DialectImplementation.h"

#include "vflow/Dialect/VT/VTDialect.h"

#include "vflow/Dialect/VT/VTEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "vflow/Dialect/VT/VTAttrs.h.inc"

#endif // VFLOW_DIALECT_VT_VTATTRS_H
