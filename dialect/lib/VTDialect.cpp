//===- VTDialect.cpp - vTensor dialect ------------------------------------===//

#include "vflow/Dialect/VT/VTOps.h"

#include "mlir/IR/Builders.h"

using namespace mlir;

#include "vflow/Dialect/VT/VTDialect.cpp.inc"

namespace vflow::vt {

void VTDialect::initialize() {
  registerAttributes();
  registerTypes();
  addOperations<
#define GET_OP_LIST
#include "vflow/Dialect/VT/VTOps.cpp.inc"
      >();
}

Operation *VTDialect::materializeConstant(OpBuilder &builder, Attribute value,
                                          Type type, Location loc) {
  auto tensorType = type.dyn_cast<TensorType>();
  auto floatAttr = value.dyn_cast<FloatAttr>();
  if (!tensorType || !floatAttr || !tensorType.isScalar() ||
      !tensorType.getElementType().isF32())
    return nullptr;
  auto f32Attr =
      builder.getF32FloatAttr(static_cast<float>(floatAttr.getValueAsDouble()));
  return builder.create<ConstantOp>(loc, tensorType, f32Attr);
}

} // namespace vflow::vt
