//===- ParamSpec.cpp - A vt.param as the runtime sees it ------------------===//

#include "vflow/Compiler/ParamSpec.h"

#include "mlir/IR/BuiltinAttributes.h"

using namespace vflow;

rt::ParamSpec vflow::paramSpecOf(vt::ParamOp param) {
  rt::ParamSpec p;
  p.name = param.getSymName().str();
  mlir::Attribute v = param.getValue();
  if (auto i = v.dyn_cast<mlir::IntegerAttr>()) {
    bool isBool = i.getType().isInteger(1);
    p.type = isBool ? "bool" : "int";
    p.value = isBool ? double(i.getValue().getBoolValue()) : double(i.getInt());
  } else if (auto fl = v.dyn_cast<mlir::FloatAttr>()) {
    p.type = "float";
    p.value = fl.getValueAsDouble();
  }
  p.compileTime = param.getCompileTime();
  return p;
}
