//===- FuseKernels.cpp - Group stage ops into kernels ---------------------===//
//
// --vt-fuse-kernels. Ops are classed by the kernel template that can run
// them: `map` (work per block, or per sequence), `cross` (needs every block:
// reductions over block, softmax, normalize, conv, kth_largest) and
// `select`. Sources (inputs, loads, constants) and the host-evaluable budget
// arithmetic stay outside kernels.
//
// Levels order the kernels: a map op sits at the highest level of its
// operands; a cross op one level above its operands (it needs all of them
// finished). Each level becomes a cross_block kernel followed by a
// block_map kernel, then one select kernel ends the stage. Values used
// outside the kernel that computes them are yielded.
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

#include "mlir/IR/Builders.h"
#include "llvm/ADT/SetVector.h"

namespace vflow {
#define GEN_PASS_DEF_FUSEKERNELS
#include "vflow/Compiler/Passes.h.inc"
} // namespace vflow

using namespace mlir;
using namespace vflow;

namespace {

enum class OpClass { Outside, Map, Cross, Select };

OpClass classify(Operation *op) {
  if (op->hasTrait<OpTrait::IsTerminator>())
    return OpClass::Outside;
  if (isa<vt::InputOp, vt::FieldLoadOp, vt::StateLoadOp, vt::ParamLoadOp,
          vt::ConstLoadOp, vt::ConstantOp>(op))
    return OpClass::Outside;
  if (isa<vt::TopKOp, vt::ApproxTopKOp, vt::ThresholdOp, vt::TopPOp,
          vt::UnionOp>(op))
    return OpClass::Select;
  if (isa<vt::SoftmaxOp, vt::NormalizeOp, vt::ConvOp, vt::KthLargestOp>(op))
    return OpClass::Cross;
  if (auto r = dyn_cast<vt::ReduceOp>(op))
    for (Attribute a : r.getAxes())
      if (a.cast<StringAttr>().getValue() == "block")
        return OpClass::Cross;
  // Budget arithmetic is evaluated by the host planner.
  if (op->getNumResults() == 1 && vt::isHostEvaluable(op->getResult(0)))
    return OpClass::Outside;
  return OpClass::Map;
}

/// Wraps `ops` (in order) into one kernel inserted before `before`.
void wrap(ArrayRef<Operation *> ops, vt::KernelKind kind, Operation *before) {
  if (ops.empty())
    return;
  llvm::SmallPtrSet<Operation *, 16> inGroup(ops.begin(), ops.end());
  SmallVector<Value> escapes;
  for (Operation *op : ops)
    for (Value result : op->getResults())
      if (llvm::any_of(result.getUsers(),
                       [&](Operation *user) { return !inGroup.count(user); }))
        escapes.push_back(result);
  OpBuilder b(before);
  Location loc = ops.front()->getLoc();
  SmallVector<Type> types;
  for (Value v : escapes)
    types.push_back(v.getType());
  auto kernel = b.create<vt::KernelOp>(loc, types, kind);
  Block *body = new Block();
  kernel.getBody().push_back(body);
  for (Operation *op : ops)
    op->moveBefore(body, body->end());
  OpBuilder::atBlockEnd(body).create<vt::YieldOp>(loc, escapes);
  for (auto [value, result] : llvm::zip(escapes, kernel.getResults()))
    value.replaceUsesWithIf(result, [&](OpOperand &use) {
      return !kernel->isAncestor(use.getOwner());
    });
}

void fuseIndexStage(Block &block) {
  llvm::DenseMap<Operation *, int> level;
  SmallVector<Operation *> ordered;
  SmallVector<Operation *> selects;
  // A state read after the state was stored must run after the store, in
  // the store's kernel or a later one.
  llvm::StringMap<int> storedAt;
  int maxLevel = 0;
  for (Operation &op : block) {
    OpClass c = classify(&op);
    if (auto load = dyn_cast<vt::StateLoadOp>(op)) {
      auto it = storedAt.find(load.getState());
      if (it != storedAt.end()) {
        level[&op] = it->second;
        ordered.push_back(&op);
      }
      continue;
    }
    if (c == OpClass::Outside)
      continue;
    if (c == OpClass::Select) {
      selects.push_back(&op);
      continue;
    }
    int l = 0;
    for (Value operand : op.getOperands())
      if (Operation *def = operand.getDefiningOp())
        if (level.count(def))
          l = std::max(l, level[def]);
    if (c == OpClass::Cross)
      ++l;
    level[&op] = l;
    maxLevel = std::max(maxLevel, l);
    ordered.push_back(&op);
    if (auto store = dyn_cast<vt::StateStoreOp>(op))
      storedAt[store.getState()] = l;
  }
  Operation *terminator = block.getTerminator();
  for (int l = 0; l <= maxLevel; ++l) {
    SmallVector<Operation *> cross, map;
    for (Operation *op : ordered)
      if (level[op] == l)
        (classify(op) == OpClass::Cross ? cross : map).push_back(op);
    wrap(cross, vt::KernelKind::cross_block, terminator);
    wrap(map, vt::KernelKind::block_map, terminator);
  }
  wrap(selects, vt::KernelKind::select, terminator);
}

void fuseCacheStage(Block &block) {
  SmallVector<Operation *> ops;
  for (Operation &op : block)
    if (classify(&op) != OpClass::Outside)
      ops.push_back(&op);
  wrap(ops, vt::KernelKind::cache_map, block.getTerminator());
}

struct FuseKernels : vflow::impl::FuseKernelsBase<FuseKernels> {
  void runOnOperation() override {
    vt::FlowOp flow = getOperation();
    // Already fused: nothing to do (the pass is idempotent).
    if (!flow.getBody()->getOps<vt::CacheStageOp>().empty() &&
        !flow.getCacheStage().getBody().front().getOps<vt::KernelOp>().empty())
      return;
    if (!flow.getIndexStage().getBody().front().getOps<vt::KernelOp>().empty())
      return;
    if (vt::CacheStageOp cache = flow.getCacheStage())
      fuseCacheStage(cache.getBody().front());
    fuseIndexStage(flow.getIndexStage().getBody().front());
  }
};

} // namespace
