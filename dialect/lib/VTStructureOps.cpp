//===- VTStructureOps.cpp - The vt structure ops --------------------------===//
//
// Verifiers and builders of the ops that make a flow's structure: vt.flow,
// its params, axes, consts, cache fields and states, and the two stages.
//
//===----------------------------------------------------------------------===//

#include "VTOpsInternal.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"

using namespace mlir;

namespace vflow::vt {

//===----------------------------------------------------------------------===//
// Structure ops
//===----------------------------------------------------------------------===//

void FlowOp::build(OpBuilder &builder, OperationState &state, StringRef name) {
  state.addAttribute(mlir::SymbolTable::getSymbolAttrName(),
                     builder.getStringAttr(name));
  state.addRegion()->emplaceBlock();
}

CacheStageOp FlowOp::getCacheStage() {
  auto range = getBody()->getOps<CacheStageOp>();
  return range.empty() ? CacheStageOp() : *range.begin();
}

IndexStageOp FlowOp::getIndexStage() {
  auto range = getBody()->getOps<IndexStageOp>();
  return range.empty() ? IndexStageOp() : *range.begin();
}

/// The flow-wide checks: every builtin axis has the flow's size (exactly
/// where an op makes it: inputs, generators, renames to it, state
/// declarations; anywhere else up to vt.split), and the cache stage stores
/// every cache field. Each type is checked once.
static LogicalResult verifyAxesAndStores(FlowOp flow) {
  BuiltinAxisSizes sizes(flow);
  llvm::DenseSet<Type> checked;
  auto checkType = [&](Operation *op, Type type, bool exact,
                       StringRef what) -> LogicalResult {
    auto tensor = type.dyn_cast<TensorType>();
    if (!tensor || (!exact && checked.contains(type)))
      return success();
    if (failed(verifyBuiltinAxes(op, tensor, sizes, exact, what)))
      return failure();
    if (!exact)
      checked.insert(type);
    return success();
  };
  llvm::StringSet<> stored;
  WalkResult result = flow.walk([&](Operation *op) {
    if (op == flow.getOperation())
      return WalkResult::advance();
    if (auto store = dyn_cast<FieldStoreOp>(op))
      stored.insert(store.getField());
    bool exact = isa<InputOp, RademacherOp, GaussianOp, LiteralOp>(op);
    if (auto rename = dyn_cast<RenameOp>(op))
      exact = isBuiltinAxis(rename.getTo());
    for (Type type : op->getResultTypes())
      if (failed(checkType(op, type, exact, "result")))
        return WalkResult::interrupt();
    Type declared;
    if (auto constOp = dyn_cast<ConstOp>(op))
      declared = constOp.getType();
    else if (auto field = dyn_cast<CacheFieldOp>(op))
      declared = field.getType();
    else if (auto state = dyn_cast<StateOp>(op))
      declared = state.getType();
    if (declared && failed(checkType(op, declared, isa<StateOp>(op), "type")))
      return WalkResult::interrupt();
    return WalkResult::advance();
  });
  if (result.wasInterrupted())
    return failure();
  for (CacheFieldOp field : flow.getBody()->getOps<CacheFieldOp>())
    if (!stored.contains(field.getSymName()))
      return field.emitOpError("is never stored: the cache stage must store "
                               "every cache field");
  return success();
}

LogicalResult FlowOp::verifyRegions() {
  auto cacheStages = getBody()->getOps<CacheStageOp>();
  auto indexStages = getBody()->getOps<IndexStageOp>();
  size_t numCache = std::distance(cacheStages.begin(), cacheStages.end());
  size_t numIndex = std::distance(indexStages.begin(), indexStages.end());
  if (numCache > 1)
    return emitOpError("expects at most one vt.cache_stage, found ")
           << numCache;
  if (numIndex != 1)
    return emitOpError("expects exactly one vt.index_stage, found ")
           << numIndex;
  return verifyAxesAndStores(*this);
}

/// The reserved params (docs/language.md, Reserved params): i64 values in
/// their ranges; the kernels are specialized on block_size and head_dim.
static LogicalResult verifyReservedParam(ParamOp param) {
  StringRef name = param.getSymName();
  bool isBlockSize = name == "block_size";
  bool isHeadDim = name == "head_dim";
  if (!isBlockSize && !isHeadDim && name != "keep_first" && name != "keep_last")
    return success();
  auto value = param.getValue().dyn_cast<IntegerAttr>();
  if (!value || !value.getType().isInteger(64))
    return param.emitOpError("'")
           << name << "' must be an i64, got " << param.getValue();
  int64_t v = value.getInt();
  if (isBlockSize && !(v >= 1 && v <= 1024 && llvm::isPowerOf2_64(v)))
    return param.emitOpError("'block_size' must be a power of two in "
                             "1..1024, got ")
           << v;
  if (isHeadDim && !(v >= 0 && v <= 1024))
    return param.emitOpError("'head_dim' must be in 0..1024, got ") << v;
  if (v < 0)
    return param.emitOpError("'") << name << "' must be >= 0, got " << v;
  if ((isBlockSize || isHeadDim) && !param.getCompileTime())
    return param.emitOpError("'")
           << name << "' must be compile_time: the kernels are specialized "
           << "on it";
  return success();
}

LogicalResult ParamOp::verify() {
  Attribute value = getValue();
  if (auto intAttr = value.dyn_cast<IntegerAttr>()) {
    if (intAttr.getType().isInteger(64) || intAttr.getType().isInteger(1))
      return verifyReservedParam(*this);
  } else if (auto floatAttr = value.dyn_cast<FloatAttr>()) {
    if (floatAttr.getType().isF64())
      return verifyReservedParam(*this);
  }
  return emitOpError("value must be an i64, f64 or i1 attribute, got ")
         << value;
}

LogicalResult AxisOp::verify() {
  if (isBuiltinAxis(getSymName()))
    return emitOpError("'") << getSymName() << "' is a builtin axis";
  if (getSize() <= 0)
    return emitOpError("size must be positive, got ") << getSize();
  if (getSize() > kMaxAxisSize)
    return emitOpError("size must be at most ")
           << kMaxAxisSize << ", got " << getSize();
  return success();
}

/// A declaration's `type` has none of `axes`; `why` says why not.
static LogicalResult verifyNoAxes(Operation *op, TensorType type,
                                  ArrayRef<StringRef> axes, StringRef why) {
  for (StringRef name : axes)
    if (type.hasAxis(name))
      return op->emitOpError("type must not have a '")
             << name << "' axis (" << why << ")";
  return success();
}

LogicalResult ConstOp::verify() {
  if (failed(verifyNoAxes(*this, getTensorType(), {"block", "head"},
                          "a const is the same for every sequence and head")))
    return failure();
  for (AxisAttr axis : getTensorType().getAxes())
    if (axis.getSize() == kSizeBlocks)
      return emitOpError("type must not depend on the block count N (axis '")
             << axis.getName() << "')";
  return success();
}

LogicalResult ConstOp::verifyRegions() {
  auto yield = dyn_cast<YieldOp>(getBody().front().getTerminator());
  if (!yield || yield.getValues().size() != 1)
    return emitOpError("region must end with vt.yield of one value");
  Type yielded = yield.getValues().front().getType();
  if (yielded != getType())
    return emitOpError("yielded type ")
           << yielded << " differs from the declared type " << getType();
  return success();
}

LogicalResult CacheFieldOp::verify() {
  return verifyNoAxes(*this, getTensorType(), {"block", "token"},
                      "a field holds one value per block");
}

LogicalResult StateOp::verify() {
  TensorType type = getTensorType();
  if (failed(verifyNoAxes(*this, type, {"token"},
                          "a state lives per sequence or per block")))
    return failure();
  // The runtimes grow per-block states by whole blocks.
  if (type.hasAxis("block") && type.getAxes().front().getName() != "block")
    return emitOpError("a per-block state must have its 'block' axis first, "
                       "got ")
           << formatAxes(type);
  return success();
}

void CacheStageOp::build(OpBuilder &builder, OperationState &state) {
  state.addRegion()->emplaceBlock();
}

/// The symbol a store writes.
static FlatSymbolRefAttr getStored(FieldStoreOp store) {
  return store.getFieldAttr();
}
static FlatSymbolRefAttr getStored(StateStoreOp store) {
  return store.getStateAttr();
}

/// Each symbol stored by an op of type `StoreOpT` in `stage` is stored at
/// most once; `kind` names it in the message.
template <typename StoreOpT>
static LogicalResult verifyStoredOnce(Operation *stage, StringRef kind) {
  llvm::StringMap<StoreOpT> stores;
  WalkResult result = stage->walk([&](StoreOpT store) {
    FlatSymbolRefAttr symbol = getStored(store);
    auto [it, inserted] = stores.try_emplace(symbol.getValue(), store);
    if (inserted)
      return WalkResult::advance();
    InFlightDiagnostic diag = store.emitOpError("stores ")
                              << kind << " " << symbol
                              << " a second time in this stage";
    diag.attachNote(it->second.getLoc()) << "first store here";
    return WalkResult::interrupt();
  });
  return failure(result.wasInterrupted());
}

LogicalResult CacheStageOp::verifyRegions() {
  auto yield = dyn_cast<YieldOp>(getBody().front().getTerminator());
  if (!yield || !yield.getValues().empty())
    return emitOpError("must end with vt.yield without operands");
  return verifyStoredOnce<FieldStoreOp>(*this, "field");
}

void IndexStageOp::build(OpBuilder &builder, OperationState &state) {
  state.addRegion()->emplaceBlock();
}

LogicalResult IndexStageOp::verifyRegions() {
  if (!isa<ReturnOp>(getBody().front().getTerminator()))
    return emitOpError("must end with vt.return");
  return verifyStoredOnce<StateStoreOp>(*this, "state");
}

LogicalResult ReturnOp::verify() {
  Value score = getRetainScore(), capacity = getRetainCapacity();
  if (!score && !capacity && !getCombine())
    return success();
  if (!score || !capacity || !getCombine())
    return emitOpError("retain needs a score, a capacity and combine");
  auto scoreType = llvm::cast<TensorType>(score.getType());
  const bool perBlock = scoreType.getRank() == 1 && scoreType.hasAxis("block");
  const bool perToken = scoreType.getRank() == 2 &&
                        scoreType.hasAxis("block") &&
                        scoreType.hasAxis("token");
  if (!perBlock && !perToken)
    return emitOpError("retain score must have the block axis, or the block "
                       "and token axes, only; got ")
           << scoreType;
  if (!llvm::cast<TensorType>(capacity.getType()).isScalar())
    return emitOpError("retain capacity must be a scalar");
  if (*getCombine() != "sum" && *getCombine() != "max")
    return emitOpError("combine must be \"sum\" or \"max\", got \"")
           << *getCombine() << "\"";
  return success();
}

} // namespace vflow::vt
