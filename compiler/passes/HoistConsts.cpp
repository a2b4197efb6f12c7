//===- HoistConsts.cpp - Move work on consts alone into consts ------------===//
//
// --vt-hoist-consts. A value of a stage is *invariant* when it is computed
// from consts, constants, generators and compile-time params alone: it does
// not change with the block, the head, the sequence or the step. Each
// invariant value that a non-invariant op (or a store, yield or return)
// uses is a root; a root whose computation holds a reduction-like op or a
// generator is cloned into a new vt.const, placed after the flow's consts,
// and the stage reads it with vt.const_load. Values that only combine
// consts elementwise stay inline (they cost nothing to recompute and the
// kernels read the consts anyway).
//
// Consts are computed by the same element functions and reductions as the
// stages, in f32 results with f64 accumulation, so the stage sees the same
// numbers as before (the differential test checks it).
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/IRMapping.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"
#include "llvm/ADT/SetVector.h"

#include <string>

namespace vflow {
#define GEN_PASS_DEF_HOISTCONSTS
#include "vflow/Compiler/Passes.h.inc"
} // namespace vflow

using namespace mlir;
using namespace vflow;

namespace {

/// Ops whose work is worth computing once rather than per block.
bool isCostly(Operation *op) {
  return isa<vt::ReduceOp, vt::SoftmaxOp, vt::NormalizeOp, vt::ConvOp,
             vt::KthLargestOp, vt::RademacherOp, vt::GaussianOp>(op);
}

struct HoistConstsPass : public vflow::impl::HoistConstsBase<HoistConstsPass> {
  void runOnOperation() override {
    vt::FlowOp flow = getOperation();
    for (Operation &stage : flow.getBody()->getOperations())
      if (isa<vt::CacheStageOp, vt::IndexStageOp>(stage))
        hoistIn(flow, stage.getRegion(0).front());
  }

  /// Whether `op` (a top-level op of a stage) computes an invariant value.
  bool invariant(vt::FlowOp flow, Operation *op,
                 const llvm::DenseSet<Operation *> &known) {
    if (op->getNumResults() != 1 || op->getNumRegions() != 0)
      return false;
    auto type = op->getResult(0).getType().dyn_cast<vt::TensorType>();
    if (!type || !type.getElementType().isF32())
      return false;
    for (StringRef axis : {"block", "head", "token"})
      if (type.hasAxis(axis))
        return false;
    if (isa<vt::ConstLoadOp, vt::ConstantOp, vt::LiteralOp, vt::RademacherOp,
            vt::GaussianOp>(op))
      return true;
    if (auto load = dyn_cast<vt::ParamLoadOp>(op)) {
      auto param = flow.lookupSymbol<vt::ParamOp>(load.getParam());
      return param && param.getCompileTime();
    }
    if (isa<vt::InputOp, vt::FieldLoadOp, vt::StateLoadOp>(op) ||
        !isMemoryEffectFree(op) || op->getNumOperands() == 0)
      return false;
    for (Value operand : op->getOperands()) {
      Operation *def = operand.getDefiningOp();
      if (!def || !known.contains(def))
        return false;
    }
    return true;
  }

  void hoistIn(vt::FlowOp flow, Block &body) {
    llvm::DenseSet<Operation *> inv;
    for (Operation &op : body)
      if (invariant(flow, &op, inv))
        inv.insert(&op);
    // Roots: invariant values something outside the invariant set uses.
    std::vector<Operation *> roots;
    for (Operation &op : body) {
      if (!inv.contains(&op) || op.getNumOperands() == 0)
        continue;
      for (Operation *user : op.getResult(0).getUsers())
        if (!inv.contains(user)) {
          roots.push_back(&op);
          break;
        }
    }
    for (Operation *root : roots) {
      // The root's computation, in block order.
      llvm::SetVector<Operation *> ops;
      std::vector<Operation *> work = {root};
      bool costly = false;
      while (!work.empty()) {
        Operation *op = work.back();
        work.pop_back();
        if (!ops.insert(op))
          continue;
        costly |= isCostly(op);
        for (Value operand : op->getOperands())
          work.push_back(operand.getDefiningOp());
      }
      if (!costly)
        continue;
      std::vector<Operation *> ordered(ops.begin(), ops.end());
      llvm::sort(ordered, [](Operation *a, Operation *b) {
        return a->isBeforeInBlock(b);
      });
      hoist(flow, root, ordered);
    }
    // Drop what the hoisted values left unused: users come after their
    // operands, so one backward sweep removes whole chains.
    for (Operation &op : llvm::make_early_inc_range(llvm::reverse(body)))
      if (inv.contains(&op) && op.use_empty())
        op.erase();
  }

  /// Moves `root` (computed by `ops`, in order) into a new const.
  void hoist(vt::FlowOp flow, Operation *root,
             const std::vector<Operation *> &ops) {
    auto type = root->getResult(0).getType().cast<vt::TensorType>();
    std::string name;
    do
      name = "hoisted." + std::to_string(counter++);
    while (flow.lookupSymbol(name));
    // After the flow's last const, so every const it reads is computed
    // first; else before the first declaration that is not a param or axis.
    Operation *after = nullptr, *before = nullptr;
    for (Operation &op : flow.getBody()->getOperations()) {
      if (isa<vt::ConstOp>(op))
        after = &op;
      else if (!before && !isa<vt::ParamOp, vt::AxisOp>(op))
        before = &op;
    }
    OpBuilder builder(flow.getContext());
    if (after)
      builder.setInsertionPointAfter(after);
    else
      builder.setInsertionPoint(before);
    auto c = builder.create<vt::ConstOp>(
        root->getLoc(), builder.getStringAttr(name), TypeAttr::get(type));
    Block *block = builder.createBlock(&c.getBody());
    builder.setInsertionPointToEnd(block);
    IRMapping map;
    for (Operation *op : ops)
      builder.clone(*op, map);
    builder.create<vt::YieldOp>(root->getLoc(),
                                ValueRange{map.lookup(root->getResult(0))});
    // The stage reads the const where the root was.
    builder.setInsertionPoint(root);
    auto load = builder.create<vt::ConstLoadOp>(
        root->getLoc(), type, FlatSymbolRefAttr::get(c.getSymNameAttr()));
    root->getResult(0).replaceAllUsesWith(load.getResult());
  }

  int counter = 0;
};

} // namespace
