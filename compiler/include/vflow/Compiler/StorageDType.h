//===- StorageDType.h - vt element types to runtime dtypes ------*- C++ -*-===//

#ifndef VFLOW_COMPILER_STORAGEDTYPE_H
#define VFLOW_COMPILER_STORAGEDTYPE_H

#include "vflow/Runtime/DType.h"

#include "mlir/IR/Types.h"

namespace vflow {

/// The runtime's storage dtype of a vt element type (f32 for anything that
/// is not a narrower float).
inline rt::DType storageDType(mlir::Type type) {
  if (type.isBF16())
    return rt::DType::BF16;
  if (type.isF16())
    return rt::DType::F16;
  if (type.isFloat8E4M3FN())
    return rt::DType::FP8E4M3;
  if (type.isFloat8E5M2())
    return rt::DType::FP8E5M2;
  return rt::DType::F32;
}

} // namespace vflow

#endif // VFLOW_COMPILER_STORAGEDTYPE_H
