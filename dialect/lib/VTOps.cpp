//===- VTOps.cpp - vTensor operations -------------------------------------===//
//
// Verifiers, builders and custom directives of the vt ops (the structure
// ops' are in VTStructureOps.cpp), and the helpers shared with the lowering
// (broadcasting, host-evaluability).
//
//===----------------------------------------------------------------------===//

#include "vflow/Dialect/VT/VTOps.h"
#include "VTOpsInternal.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/OpImplementation.h"
#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/DenseSet.h"
#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/SmallSet.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/Support/MathExtras.h"

#include <cstdint>

using namespace mlir;

namespace vflow::vt {

//===----------------------------------------------------------------------===//
// Custom directives
//===----------------------------------------------------------------------===//

/// `[name, name, ...]`: an array of axis names.
static ParseResult parseAxisList(OpAsmParser &parser, ArrayAttr &axes) {
  SmallVector<Attribute> names;
  auto parseOne = [&]() -> ParseResult {
    std::string name;
    if (parser.parseKeywordOrString(&name))
      return failure();
    names.push_back(parser.getBuilder().getStringAttr(name));
    return success();
  };
  if (parser.parseCommaSeparatedList(OpAsmParser::Delimiter::Square, parseOne))
    return failure();
  axes = parser.getBuilder().getArrayAttr(names);
  return success();
}

static void printAxisList(OpAsmPrinter &printer, Operation *, ArrayAttr axes) {
  printer << '[';
  llvm::interleaveComma(axes, printer, [&](Attribute attr) {
    printAxisName(printer, attr.cast<StringAttr>().getValue());
  });
  printer << ']';
}

} // namespace vflow::vt

#define GET_OP_CLASSES
#include "vflow/Dialect/VT/VTOps.cpp.inc"

namespace vflow::vt {

//===----------------------------------------------------------------------===//
// Shared helpers
//===----------------------------------------------------------------------===//

/// `[block, token]`, for messages.
static std::string formatNames(ArrayRef<StringRef> names) {
  std::string text = "[";
  llvm::raw_string_ostream os(text);
  llvm::interleaveComma(names, os);
  os << ']';
  return os.str();
}

/// True when `type` has exactly the axis names in `names` (sizes ignored).
static bool hasExactlyAxisNames(TensorType type, ArrayRef<StringRef> names) {
  return type.getRank() == names.size() &&
         llvm::all_of(names,
                      [&](StringRef name) { return type.hasAxis(name); });
}

static LogicalResult verifyF32Result(Operation *op, TensorType type) {
  if (!type.getElementType().isF32())
    return op->emitOpError("result element type must be f32, got ")
           << type.getElementType();
  return success();
}

/// The result has the axes of `expected` (any order) and element type f32.
static LogicalResult verifyResultAxes(Operation *op, TensorType result,
                                      TensorType expected) {
  if (!result.hasSameAxes(expected))
    return op->emitOpError("result axes ")
           << formatAxes(result) << " must be " << formatAxes(expected);
  return verifyF32Result(op, result);
}

FailureOr<TensorType> inferBroadcastType(ArrayRef<TensorType> operands) {
  if (operands.empty())
    return failure();
  MLIRContext *context = operands.front().getContext();
  SmallVector<AxisAttr> axes;
  llvm::StringMap<int64_t> sizes;
  for (TensorType type : operands) {
    if (!type)
      return failure();
    for (AxisAttr axis : type.getAxes()) {
      auto [it, inserted] = sizes.try_emplace(axis.getName(), axis.getSize());
      if (inserted)
        axes.push_back(axis);
      else if (it->second != axis.getSize())
        return failure();
    }
  }
  return TensorType::get(context, axes, Float32Type::get(context));
}

TensorType inferBroadcastResultType(ArrayRef<Value> operands) {
  SmallVector<TensorType> types = llvm::to_vector(llvm::map_range(
      operands, [](Value value) { return getTensorType(value); }));
  FailureOr<TensorType> type = inferBroadcastType(types);
  assert(succeeded(type) && "operands of a broadcasting op must have "
                            "compatible axes");
  return *type;
}

namespace detail {
LogicalResult verifyBroadcastElementwise(Operation *op) {
  llvm::StringMap<std::pair<int64_t, unsigned>> seen;
  SmallVector<TensorType> types;
  for (auto [index, operand] : llvm::enumerate(op->getOperands())) {
    TensorType type = getTensorType(operand);
    if (!type)
      return op->emitOpError("operand #") << index << " must be a vt tensor";
    types.push_back(type);
    for (AxisAttr axis : type.getAxes()) {
      auto [it, inserted] = seen.try_emplace(
          axis.getName(), std::make_pair(axis.getSize(), unsigned(index)));
      if (!inserted && it->second.first != axis.getSize())
        return op->emitOpError("axis '")
               << axis.getName() << "' has size "
               << formatAxisSize(it->second.first) << " in operand #"
               << it->second.second << " but " << formatAxisSize(axis.getSize())
               << " in operand #" << index;
    }
  }
  auto result = op->getResult(0).getType().dyn_cast<TensorType>();
  if (!result)
    return op->emitOpError("result must be a vt tensor");
  TensorType expected = *inferBroadcastType(types);
  if (!result.hasSameAxes(expected))
    return op->emitOpError("result axes ")
           << formatAxes(result) << " must be the union of the operand axes "
           << formatAxes(expected);
  return verifyF32Result(op, result);
}
} // namespace detail

static bool isHostEvaluableImpl(Value value,
                                llvm::DenseMap<Value, bool> &cache) {
  auto type = getTensorType(value);
  if (!type || !type.isScalar())
    return false;
  auto it = cache.find(value);
  if (it != cache.end())
    return it->second;
  Operation *def = value.getDefiningOp();
  bool result = false;
  if (!def) {
    result = false;
  } else if (isa<ConstantOp, ParamLoadOp>(def)) {
    result = true;
  } else if (auto input = dyn_cast<InputOp>(def)) {
    result = input.getKind() == InputKind::num_blocks ||
             input.getKind() == InputKind::context_len ||
             input.getKind() == InputKind::group ||
             input.getKind() == InputKind::layer ||
             input.getKind() == InputKind::kv_head;
  } else if (isa<AddOp, SubOp, MulOp, DivOp, MaximumOp, MinimumOp>(def)) {
    cache[value] = false; // Guards against cycles in invalid IR.
    result = llvm::all_of(def->getOperands(), [&](Value operand) {
      return isHostEvaluableImpl(operand, cache);
    });
  }
  cache[value] = result;
  return result;
}

bool isHostEvaluable(Value value) {
  llvm::DenseMap<Value, bool> cache;
  return isHostEvaluableImpl(value, cache);
}

static LogicalResult verifyHostEvaluable(Operation *op, Value value,
                                         StringRef what) {
  if (isHostEvaluable(value))
    return success();
  return op->emitOpError() << what
                           << " must be host-evaluable: a scalar defined only "
                              "through vt.constant, vt.param_load, vt.input "
                              "num_blocks|context_len|group|layer|kv_head and "
                              "add/sub/mul/div/maximum/minimum of such values";
}

enum class Stage { None, Cache, Index, Const };

static Stage getStage(Operation *op) {
  for (Operation *parent = op->getParentOp(); parent;
       parent = parent->getParentOp()) {
    if (isa<CacheStageOp>(parent))
      return Stage::Cache;
    if (isa<IndexStageOp>(parent))
      return Stage::Index;
    if (isa<ConstOp>(parent))
      return Stage::Const;
  }
  return Stage::None;
}

static LogicalResult verifyInStage(Operation *op, Stage stage) {
  if (getStage(op) == stage)
    return success();
  StringRef name = stage == Stage::Cache   ? "vt.cache_stage"
                   : stage == Stage::Index ? "vt.index_stage"
                                           : "vt.const";
  return op->emitOpError("is only allowed inside ") << name;
}

template <typename OpT>
static OpT lookupSymbol(Operation *op, SymbolTableCollection &symbolTable,
                        FlatSymbolRefAttr ref, StringRef kind) {
  Operation *symbol = symbolTable.lookupNearestSymbolFrom(op, ref.getAttr());
  auto result = dyn_cast_or_null<OpT>(symbol);
  if (!result)
    op->emitOpError("'") << ref << "' does not name a " << kind
                         << " of the enclosing vt.flow";
  return result;
}

/// The largest number of conv weights (docs/language.md).
static constexpr size_t kMaxConvWeights = 15;

/// Checks the builtin axes of `type`, which `op` makes (`what` says how):
/// each has the flow's size; with `exact` false, a static `token` or `dim`
/// may also have a size that divides the flow's (what vt.split leaves).
LogicalResult verifyBuiltinAxes(Operation *op, TensorType type,
                                const BuiltinAxisSizes &sizes, bool exact,
                                StringRef what) {
  for (AxisAttr axis : type.getAxes()) {
    StringRef name = axis.getName();
    if (!isBuiltinAxis(name))
      continue;
    int64_t expected = sizes.get(name);
    int64_t size = axis.getSize();
    if (size == expected)
      continue;
    bool split = expected > 0 && size > 0 && expected % size == 0;
    if (!exact && split)
      continue;
    InFlightDiagnostic diag = op->emitOpError()
                              << what << " axis '" << name
                              << "' must have size " << sizes.describe(name);
    if (!exact && expected > 0)
      diag << " or, after vt.split, a divisor of it";
    return diag << ", got " << formatAxisSize(size);
  }
  return success();
}

//===----------------------------------------------------------------------===//
// Inputs and symbol accesses
//===----------------------------------------------------------------------===//

LogicalResult InputOp::verify() {
  Stage stage = getStage(*this);
  if (stage != Stage::Cache && stage != Stage::Index)
    return emitOpError("must be inside vt.cache_stage or vt.index_stage");
  InputKind kind = getKind();
  bool isKV = kind == InputKind::K || kind == InputKind::V;
  if (stage == Stage::Cache && !isKV)
    return emitOpError("input ") << stringifyInputKind(kind)
                                 << " is only available in vt.index_stage";
  SmallVector<StringRef> expected;
  switch (kind) {
  case InputKind::K:
  case InputKind::V:
    if (stage == Stage::Index)
      expected = {"block", "token", "dim"};
    else
      expected = {"token", "dim"};
    break;
  case InputKind::q:
    expected = {"head", "dim"};
    break;
  case InputKind::mass:
    expected = {"block", "head"};
    break;
  case InputKind::position:
  case InputKind::first_token:
    expected = {"block"};
    break;
  case InputKind::num_blocks:
  case InputKind::context_len:
  case InputKind::step:
  case InputKind::group:
  case InputKind::layer:
  case InputKind::kv_head:
    break;
  }
  TensorType type = getResult().getType();
  if (!hasExactlyAxisNames(type, expected))
    return emitOpError("input ")
           << stringifyInputKind(kind) << " must have the axes "
           << formatNames(expected) << " here, got " << formatAxes(type);
  return success();
}

LogicalResult ParamLoadOp::verifySymbolUses(SymbolTableCollection &symbols) {
  if (!lookupSymbol<ParamOp>(*this, symbols, getParamAttr(), "vt.param"))
    return failure();
  if (!getResult().getType().getElementType().isF32())
    return emitOpError("result must be a scalar f32 tensor");
  return success();
}

LogicalResult ConstLoadOp::verifySymbolUses(SymbolTableCollection &symbols) {
  auto constOp =
      lookupSymbol<ConstOp>(*this, symbols, getNameAttr(), "vt.const");
  if (!constOp)
    return failure();
  TensorType declared = constOp.getTensorType();
  TensorType result = getResult().getType();
  if (!result.hasSameAxes(declared) ||
      result.getElementType() != declared.getElementType())
    return emitOpError("result type ") << result << " does not match the type "
                                       << declared << " of " << getNameAttr();
  return success();
}

/// The vt.cache_field that a field access (vt.field_store, vt.field_load)
/// names; null, with an error on `op`, when there is none.
template <typename OpT>
static CacheFieldOp lookupField(OpT op, SymbolTableCollection &symbols) {
  return lookupSymbol<CacheFieldOp>(op, symbols, op.getFieldAttr(),
                                    "vt.cache_field");
}

LogicalResult FieldStoreOp::verify() {
  return verifyInStage(*this, Stage::Cache);
}

LogicalResult FieldStoreOp::verifySymbolUses(SymbolTableCollection &symbols) {
  CacheFieldOp field = lookupField(*this, symbols);
  if (!field)
    return failure();
  TensorType value = getValue().getType();
  if (!value.hasSameAxes(field.getTensorType()))
    return emitOpError("stored value axes ")
           << formatAxes(value) << " differ from the axes "
           << formatAxes(field.getTensorType()) << " of field "
           << getFieldAttr();
  return success();
}

LogicalResult FieldLoadOp::verify() {
  return verifyInStage(*this, Stage::Index);
}

LogicalResult FieldLoadOp::verifySymbolUses(SymbolTableCollection &symbols) {
  CacheFieldOp field = lookupField(*this, symbols);
  if (!field)
    return failure();
  TensorType result = getResult().getType();
  TensorType fieldType = field.getTensorType();
  std::optional<int64_t> blockSize = result.getAxisSize("block");
  if (!blockSize || !result.withoutAxes({"block"}).hasSameAxes(fieldType))
    return emitOpError("result axes ")
           << formatAxes(result) << " must be the axes "
           << formatAxes(fieldType) << " of field " << getFieldAttr()
           << " plus 'block'";
  return verifyF32Result(*this, result);
}

/// A state access (vt.state_load, vt.state_store) of a value of `type`: it
/// names a vt.state, has its axes, and element type f32 or the state's.
template <typename OpT>
static LogicalResult verifyStateAccess(OpT op, SymbolTableCollection &symbols,
                                       TensorType type, StringRef what) {
  auto state =
      lookupSymbol<StateOp>(op, symbols, op.getStateAttr(), "vt.state");
  if (!state)
    return failure();
  TensorType declared = state.getTensorType();
  if (!type.hasSameAxes(declared))
    return op.emitOpError()
           << what << " axes " << formatAxes(type) << " differ from the axes "
           << formatAxes(declared) << " of state @" << state.getSymName();
  if (!type.getElementType().isF32() &&
      type.getElementType() != declared.getElementType())
    return op.emitOpError()
           << what << " element type must be f32 or "
           << declared.getElementType() << ", got " << type.getElementType();
  return success();
}

LogicalResult StateLoadOp::verify() {
  return verifyInStage(*this, Stage::Index);
}

LogicalResult StateLoadOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStateAccess(*this, symbols, getResult().getType(), "result");
}

LogicalResult StateStoreOp::verify() {
  return verifyInStage(*this, Stage::Index);
}

LogicalResult StateStoreOp::verifySymbolUses(SymbolTableCollection &symbols) {
  return verifyStateAccess(*this, symbols, getValue().getType(),
                           "stored value");
}

//===----------------------------------------------------------------------===//
// Value ops
//===----------------------------------------------------------------------===//

LogicalResult ConstantOp::verify() {
  return verifyF32Result(*this, getResult().getType());
}

SmallVector<StringRef> ReduceOp::getAxisNames() {
  return llvm::to_vector(llvm::map_range(getAxes(), [](Attribute attr) {
    return attr.cast<StringAttr>().getValue();
  }));
}

bool ReduceOp::isWide() {
  TensorType input = getInput().getType();
  int64_t reduced = 1;
  for (StringRef name : getAxisNames()) {
    int64_t size = *input.getAxisSize(name);
    if (name == "block")
      return false;
    if (size == kSizeHeadDim)
      return true;
    if (size > 0)
      reduced *= size;
  }
  return reduced >= 32;
}

bool ReduceOp::sumsInLanes() {
  return getKind() != ReduceKind::max && getKind() != ReduceKind::min &&
         isWide();
}

LogicalResult ReduceOp::verify() {
  TensorType input = getInput().getType();
  SmallVector<StringRef> names = getAxisNames();
  llvm::StringSet<> seen;
  for (StringRef name : names) {
    if (!input.hasAxis(name))
      return emitOpError("reduced axis '")
             << name << "' is not an axis of the input " << formatAxes(input);
    if (!seen.insert(name).second)
      return emitOpError("reduced axis '") << name << "' is listed twice";
  }
  return verifyResultAxes(*this, getResult().getType(),
                          input.withoutAxes(names));
}

/// Ops along `block`: the input has a `block` axis and the result the
/// input's axes.
static LogicalResult verifyAlongBlock(Operation *op, TensorType input,
                                      TensorType result) {
  if (!input.hasAxis("block"))
    return op->emitOpError("input must have a 'block' axis, got ")
           << formatAxes(input);
  return verifyResultAxes(op, result, input);
}

LogicalResult SoftmaxOp::verify() {
  return verifyAlongBlock(*this, getInput().getType(), getResult().getType());
}

LogicalResult NormalizeOp::verify() {
  return verifyAlongBlock(*this, getInput().getType(), getResult().getType());
}

LogicalResult ConvOp::verify() {
  size_t count = getWeights().size();
  if (count % 2 == 0)
    return emitOpError("expects an odd number of weights, got ") << count;
  if (count > kMaxConvWeights)
    return emitOpError("expects at most ")
           << kMaxConvWeights << " weights, got " << count;
  return verifyAlongBlock(*this, getInput().getType(), getResult().getType());
}

LogicalResult KthLargestOp::verify() {
  TensorType input = getInput().getType();
  if (!input.hasAxis("block"))
    return emitOpError("input must have a 'block' axis, got ")
           << formatAxes(input);
  if (failed(verifyHostEvaluable(*this, getK(), "k")))
    return failure();
  return verifyResultAxes(*this, getResult().getType(),
                          input.withoutAxes({"block"}));
}

LogicalResult SplitOp::verify() {
  TensorType input = getInput().getType();
  StringRef axis = getAxis();
  StringRef outer = getOuter();
  int64_t factor = getFactor();
  std::optional<int64_t> size = input.getAxisSize(axis);
  if (!size)
    return emitOpError("axis '")
           << axis << "' is not an axis of the input " << formatAxes(input);
  if (*size <= 0)
    return emitOpError("axis '") << axis
                                 << "' must have a static size to be "
                                    "split, got "
                                 << formatAxisSize(*size);
  if (factor <= 0 || *size % factor != 0)
    return emitOpError("factor ") << factor << " does not divide the size "
                                  << *size << " of axis '" << axis << "'";
  if (outer.empty() || input.hasAxis(outer))
    return emitOpError("outer axis '") << outer << "' must be a new axis name";
  if (isBuiltinAxis(outer))
    return emitOpError("outer axis '") << outer << "' is a builtin axis";
  MLIRContext *context = getContext();
  SmallVector<AxisAttr> axes;
  for (AxisAttr a : input.getAxes()) {
    if (a.getName() != axis) {
      axes.push_back(a);
      continue;
    }
    axes.push_back(AxisAttr::get(context, outer, factor));
    axes.push_back(AxisAttr::get(context, axis, *size / factor));
  }
  TensorType result = getResult().getType();
  TensorType expected = input.withAxes(axes);
  if (!result.hasSameAxes(expected))
    return emitOpError("result axes ")
           << formatAxes(result) << " must be " << formatAxes(expected);
  if (result.getElementType() != input.getElementType())
    return emitOpError("result element type must match the input's");
  return success();
}

LogicalResult RenameOp::verify() {
  TensorType input = getInput().getType();
  StringRef from = getFrom();
  StringRef to = getTo();
  AxisAttr axis = input.getAxis(from);
  if (!axis)
    return emitOpError("axis '")
           << from << "' is not an axis of the input " << formatAxes(input);
  if (to.empty())
    return emitOpError("new axis name must not be empty");
  if (from == "block" || to == "block")
    return emitOpError("the 'block' axis cannot be renamed");
  if (to != from && input.hasAxis(to))
    return emitOpError("axis '") << to << "' already exists in the input";
  SmallVector<AxisAttr> axes;
  for (AxisAttr a : input.getAxes())
    axes.push_back(
        a.getName() == from ? AxisAttr::get(getContext(), to, a.getSize()) : a);
  TensorType result = getResult().getType();
  TensorType expected = input.withAxes(axes);
  if (!result.hasSameAxes(expected))
    return emitOpError("result axes ")
           << formatAxes(result) << " must be " << formatAxes(expected);
  if (result.getElementType() != input.getElementType())
    return emitOpError("result element type must match the input's");
  return success();
}

static LogicalResult verifyGenerator(Operation *op, TensorType result) {
  if (failed(verifyInStage(op, Stage::Const)))
    return failure();
  return verifyF32Result(op, result);
}

/// Random generators are seeded with a 32-bit unsigned seed
/// (docs/language.md).
static LogicalResult verifySeed(Operation *op, int64_t seed) {
  if (seed < 0 || seed > int64_t(UINT32_MAX))
    return op->emitOpError("seed must be in 0..")
           << UINT32_MAX << ", got " << seed;
  return success();
}

LogicalResult RademacherOp::verify() {
  if (failed(verifySeed(*this, getSeed())))
    return failure();
  return verifyGenerator(*this, getResult().getType());
}

LogicalResult GaussianOp::verify() {
  if (failed(verifySeed(*this, getSeed())))
    return failure();
  return verifyGenerator(*this, getResult().getType());
}

LogicalResult LiteralOp::verify() {
  TensorType result = getResult().getType();
  if (failed(verifyGenerator(*this, result)))
    return failure();
  for (AxisAttr axis : result.getAxes())
    if (!axis.isStatic())
      return emitOpError("type must have static sizes, got axis '")
             << axis.getName() << "' of size "
             << formatAxisSize(axis.getSize());
  int64_t expected = result.getNumElements();
  int64_t count = getValues().size();
  if (count != expected)
    return emitOpError("has ")
           << count << " values but the type holds " << expected;
  return success();
}

//===----------------------------------------------------------------------===//
// Selections
//===----------------------------------------------------------------------===//

static LogicalResult verifyScore(Operation *op, TensorType score) {
  if (!hasExactlyAxisNames(score, {"block"}))
    return op->emitOpError("score must have exactly the axes [block], got ")
           << formatAxes(score);
  return success();
}

LogicalResult TopKOp::verify() {
  if (failed(verifyScore(*this, getScore().getType())))
    return failure();
  return verifyHostEvaluable(*this, getK(), "k");
}

LogicalResult ApproxTopKOp::verify() {
  if (failed(verifyScore(*this, getScore().getType())))
    return failure();
  double recall = getRecall().convertToDouble();
  if (!(recall > 0.0 && recall <= 1.0))
    return emitOpError("recall must be in (0, 1], got ") << recall;
  return verifyHostEvaluable(*this, getK(), "k");
}

/// threshold and topp: a [block] score and an optional host-evaluable max.
static LogicalResult verifyScoreAndMax(Operation *op, TensorType score,
                                       Value max) {
  if (failed(verifyScore(op, score)))
    return failure();
  if (max)
    return verifyHostEvaluable(op, max, "max");
  return success();
}

LogicalResult ThresholdOp::verify() {
  return verifyScoreAndMax(*this, getScore().getType(), getMax());
}

LogicalResult TopPOp::verify() {
  return verifyScoreAndMax(*this, getScore().getType(), getMax());
}

} // namespace vflow::vt

//===----------------------------------------------------------------------===//
// KernelOp
//===----------------------------------------------------------------------===//

namespace vflow::vt {

LogicalResult KernelOp::verify() {
  Operation *stage = (*this)->getParentOp();
  while (stage && !isa<CacheStageOp, IndexStageOp>(stage))
    stage = stage->getParentOp();
  if (!stage)
    return emitOpError("must be inside vt.cache_stage or vt.index_stage");
  bool inCache = isa<CacheStageOp>(stage);
  if (inCache != (getKind() == KernelKind::cache_map))
    return emitOpError("a ") << stringifyKernelKind(getKind())
                             << " kernel cannot be in " << stage->getName();
  auto yield = dyn_cast<YieldOp>(getBody().front().getTerminator());
  if (!yield)
    return emitOpError("must end with vt.yield");
  if (yield.getValues().getTypes() != getResultTypes())
    return emitOpError("yields ")
           << yield.getValues().size()
           << " values whose types differ from its results";
  if (isa<KernelOp>((*this)->getParentOp()))
    return emitOpError("kernels do not nest");
  if (LaunchAttr launch = getLaunchAttr()) {
    // The grids the CUDA backend can run each kind in.
    LaunchGrid expected = LaunchGrid::row;
    if (getKind() == KernelKind::cache_map)
      expected = LaunchGrid::fields;
    else if (getKind() == KernelKind::block_map)
      expected = LaunchGrid::tile;
    if (launch.getGrid() != expected)
      return emitOpError("a ")
             << stringifyKernelKind(getKind()) << " kernel launches over a "
             << stringifyLaunchGrid(expected) << " grid, not "
             << stringifyLaunchGrid(launch.getGrid());
  }
  return success();
}

} // namespace vflow::vt
