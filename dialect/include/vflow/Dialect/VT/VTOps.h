//===- VTOps.h - vTensor operations -----------------------------*- C++ -*-===//
//
// The whole vt dialect: ops, types, attributes, and the helpers shared with
// the lowering (broadcast type inference, host-evaluability).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_DIALECT_VT_VTOPS_H
#define VFLOW_DIALECT_VT_VTOPS_H

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/OpImplementation.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/ControlFlowInterfaces.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "vflow/Dialect/VT/VTAttrs.h"
#include "vflow/Dialect/VT/VTDialect.h"
#include "vflow/Dialect/VT/VTTypes.h"

namespace vflow {
namespace vt {

/// The result type of a broadcasting elementwise op over `operands`: the
/// union of their axes in canonical order (the first operand's axes, then
/// each new axis in order of appearance), element type f32. Fails when a
/// shared axis name has different sizes.
mlir::FailureOr<TensorType>
inferBroadcastType(llvm::ArrayRef<TensorType> operands);

/// inferBroadcastType over the types of `operands` (which must be vt
/// tensors with compatible axes); used by the builders that take no result
/// type.
TensorType inferBroadcastResultType(llvm::ArrayRef<mlir::Value> operands);

/// True when `value` can be computed on the host before the step runs: it
/// is a scalar defined by vt.constant, vt.param_load, vt.input num_blocks or
/// context_len, group, layer or kv_head, or vt.add/sub/mul/div/maximum/minimum
/// of such values.
bool isHostEvaluable(mlir::Value value);

namespace detail {
mlir::LogicalResult verifyBroadcastElementwise(mlir::Operation *op);
} // namespace detail

namespace OpTrait {
/// Elementwise op broadcasting by axis name: the result axes are the union
/// of the operand axes (shared names with equal sizes), element type f32.
template <typename ConcreteType>
class BroadcastElementwise
    : public mlir::OpTrait::TraitBase<ConcreteType, BroadcastElementwise> {
public:
  static mlir::LogicalResult verifyTrait(mlir::Operation *op) {
    return detail::verifyBroadcastElementwise(op);
  }
};
} // namespace OpTrait

} // namespace vt
} // namespace vflow

#define GET_OP_CLASSES
#include "vflow/Dialect/VT/VTOps.h.inc"

#endif // VFLOW_DIALECT_VT_VTOPS_H
