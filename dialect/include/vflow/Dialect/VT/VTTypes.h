//===- VTTypes.h - vTensor types --------------------------------*- C++ -*-===//
//
// `!vt.tensor<[axis:size, ...], elem>` (vt::TensorType) and
// `!vt.selection` (vt::SelectionType).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_DIALECT_VT_VTTYPES_H
#define VFLOW_DIALECT_VT_VTTYPES_H

#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/Types.h"
#include "mlir/Support/LogicalResult.h"

#include "vflow/Dialect/VT/VTAttrs.h"
#include "vflow/Runtime/AxisSize.h"

#include <cstdint>
#include <optional>
#include <string>

namespace vflow {
namespace vt {

/// Symbolic axis sizes: `N` (blocks of the sequence), `G` (query heads per
/// KV head), `D` (head dimension). Any other size is a positive integer. The
/// encoding is the one the frontend and the runtime share
/// (vflow/Runtime/AxisSize.h).
constexpr int64_t kSizeBlocks = rt::kAxisSizeBlocks;
constexpr int64_t kSizeGroup = rt::kAxisSizeGroup;
constexpr int64_t kSizeHeadDim = rt::kAxisSizeHeadDim;

/// True for a positive size or one of N, G, D.
inline bool isValidAxisSize(int64_t size) {
  return size > 0 || size == kSizeBlocks || size == kSizeGroup ||
         size == kSizeHeadDim;
}

/// "N", "G", "D" or the decimal number, for messages and printing.
using rt::formatAxisSize;

/// True for the element types a vt tensor may hold: f32, bf16, f16,
/// f8E4M3FN, f8E5M2.
bool isValidElementType(mlir::Type type);

/// Prints an axis name as a bare keyword when it reads back as one, else as
/// a quoted string (the form parseKeywordOrString accepts).
void printAxisName(mlir::AsmPrinter &printer, llvm::StringRef name);

} // namespace vt
} // namespace vflow

#define GET_TYPEDEF_CLASSES
#include "vflow/Dialect/VT/VTTypes.h.inc"

#endif // VFLOW_DIALECT_VT_VTTYPES_H
