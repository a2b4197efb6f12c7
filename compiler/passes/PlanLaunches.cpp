//===- PlanLaunches.cpp - Choose the launch shape of every kernel ---------===//
//
// --vt-plan-launches. The plan is a dictionary on each vt.kernel:
//   grid:          page_kvhead | seq_kvhead_tile | seq_kvhead
//   tile_blocks:   blocks per program instance (block_map kernels)
//   widest:        the axes (besides block) of the largest value the kernel
//                  computes, e.g. ["head:G", "dim:D"]: the per-block work the
//                  runtime sizes registers and shared memory by
//   reads_kv:      the kernel reads K or V of every block (full KV bytes)
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

#include "mlir/IR/Builders.h"

namespace vflow {
#define GEN_PASS_DEF_PLANLAUNCHES
#include "vflow/Compiler/Passes.h.inc"
} // namespace vflow

using namespace mlir;
using namespace vflow;

namespace {

/// A rough size of a value's per-block work, with symbols at typical values
/// (only used to compare values of one kernel).
double weight(vt::TensorType type) {
  double w = 1;
  for (vt::AxisAttr a : type.getAxes()) {
    if (a.getName() == "block")
      continue;
    int64_t s = a.getSize();
    w *= s > 0 ? double(s) : s == vt::kSizeHeadDim ? 128.0 : 4.0;
  }
  return w;
}

struct PlanLaunches : vflow::impl::PlanLaunchesBase<PlanLaunches> {
  using PlanLaunchesBase::PlanLaunchesBase;

  void runOnOperation() override {
    if (tileBlocks < 1) {
      getOperation().emitError("--tile-blocks must be at least 1");
      return signalPassFailure();
    }
    Builder b(&getContext());
    getOperation().walk([&](vt::KernelOp kernel) {
      vt::TensorType widest;
      bool readsKV = false;
      kernel.walk([&](Operation *op) {
        for (Value operand : op->getOperands())
          if (auto in = operand.getDefiningOp<vt::InputOp>())
            readsKV |= (in.getKind() == vt::InputKind::K ||
                        in.getKind() == vt::InputKind::V) &&
                       kernel.getKind() != vt::KernelKind::cache_map;
        auto consider = [&](Value v) {
          if (auto t = v.getType().dyn_cast<vt::TensorType>())
            if (!widest || weight(t) > weight(widest))
              widest = t;
        };
        for (Value r : op->getResults())
          consider(r);
        for (Value operand : op->getOperands())
          consider(operand);
      });
      StringRef grid = "seq_kvhead";
      if (kernel.getKind() == vt::KernelKind::cache_map)
        grid = "page_kvhead";
      else if (kernel.getKind() == vt::KernelKind::block_map)
        grid = "seq_kvhead_tile";
      SmallVector<NamedAttribute> plan;
      plan.push_back(b.getNamedAttr("grid", b.getStringAttr(grid)));
      if (kernel.getKind() == vt::KernelKind::block_map)
        plan.push_back(
            b.getNamedAttr("tile_blocks", b.getI64IntegerAttr(tileBlocks)));
      SmallVector<Attribute> axes;
      if (widest)
        for (vt::AxisAttr a : widest.getAxes())
          if (a.getName() != "block")
            axes.push_back(b.getStringAttr(a.getName().str() + ":" +
                                           vt::formatAxisSize(a.getSize())));
      plan.push_back(b.getNamedAttr("widest", b.getArrayAttr(axes)));
      plan.push_back(b.getNamedAttr("reads_kv", b.getBoolAttr(readsKV)));
      kernel->setAttr("plan", b.getDictionaryAttr(plan));
    });
  }
};

} // namespace
