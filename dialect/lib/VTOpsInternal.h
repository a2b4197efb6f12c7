//===- VTOpsInternal.h - Helpers the vt op files share ----------*- C++ -*-===//
//
// Not installed: what VTOps.cpp and VTStructureOps.cpp both use.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_DIALECT_VT_VTOPSINTERNAL_H
#define VFLOW_DIALECT_VT_VTOPSINTERNAL_H

#include "vflow/Dialect/VT/VTOps.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/raw_ostream.h"

#include <string>

namespace vflow::vt {

/// `[block:N, dim:D]`, for messages.
inline std::string formatAxes(TensorType type) {
  std::string text = "[";
  llvm::raw_string_ostream os(text);
  llvm::interleaveComma(type.getAxes(), os, [&](AxisAttr axis) {
    os << axis.getName() << ':' << formatAxisSize(axis.getSize());
  });
  os << ']';
  return os.str();
}

inline TensorType getTensorType(mlir::Value value) {
  return value.getType().dyn_cast<TensorType>();
}

/// The largest size of a declared axis (docs/language.md; the runtime's
/// limits::kMaxAxisSize).
constexpr int64_t kMaxAxisSize = 65536;

/// The axes every flow has (docs/language.md, Named axes); user axes may
/// not take these names.
inline bool isBuiltinAxis(llvm::StringRef name) {
  return name == "block" || name == "head" || name == "token" || name == "dim";
}

/// The sizes of the builtin axes in one flow: `block` is N, `head` is G,
/// `token` the flow's block_size (16, the language's default, when the flow
/// declares none) and `dim` its head_dim when positive, else D.
struct BuiltinAxisSizes {
  int64_t token = 16;
  int64_t dim = kSizeHeadDim;

  explicit BuiltinAxisSizes(FlowOp flow) {
    for (ParamOp param : flow.getBody()->getOps<ParamOp>()) {
      auto value = param.getValue().dyn_cast<mlir::IntegerAttr>();
      if (!value || !value.getType().isInteger(64))
        continue;
      if (param.getSymName() == "block_size" && value.getInt() > 0)
        token = value.getInt();
      else if (param.getSymName() == "head_dim" && value.getInt() > 0)
        dim = value.getInt();
    }
  }

  /// The size of builtin axis `name`.
  int64_t get(llvm::StringRef name) const {
    if (name == "block")
      return kSizeBlocks;
    if (name == "head")
      return kSizeGroup;
    return name == "token" ? token : dim;
  }

  /// `32 (the flow's block_size)`, for messages.
  std::string describe(llvm::StringRef name) const {
    std::string text = formatAxisSize(get(name));
    if (name == "token")
      text += " (the flow's block_size)";
    else if (name == "dim" && dim > 0)
      text += " (the flow's head_dim)";
    return text;
  }
};

/// Checks the builtin axes of `type`, which `op` makes (`what` says how):
/// each has the flow's size; with `exact` false, a static `token` or `dim`
/// may also have a size that divides the flow's (what vt.split leaves).
mlir::LogicalResult verifyBuiltinAxes(mlir::Operation *op, TensorType type,
                                      const BuiltinAxisSizes &sizes, bool exact,
                                      llvm::StringRef what);

} // namespace vflow::vt

#endif // VFLOW_DIALECT_VT_VTOPSINTERNAL_H
