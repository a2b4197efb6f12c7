//===- PlanLaunches.cpp - Choose the launch of every kernel ---------------===//
//
// --vt-plan-launches. Every vt.kernel gets its `launch` (#vt.launch), the
// one place a kernel's GPU launch is decided; the CUDA backend emits and
// describes each kernel by it and the runtime launches what it describes:
//   cache_map               fields (a CTA per (page, KV head)), 256 threads;
//                           the runtime's append kernel runs the same body
//   block_map               tile (a CTA per (tile, sequence, KV head)),
//                           256 threads, tile_blocks blocks per tile
//   cross_block, select     row (a CTA per (sequence, KV head) over every
//                           block), 512 threads: their scans and selections
//                           take few serial steps, and two or three CTAs
//                           fit a multiprocessor (one of 1024 threads at
//                           up to 64 registers: a batch of 64 ran in four
//                           waves, 1.02-1.05x slower steps)
//
//===----------------------------------------------------------------------===//

#include "vflow/Compiler/Passes.h"

namespace vflow {
#define GEN_PASS_DEF_PLANLAUNCHES
#include "vflow/Compiler/Passes.h.inc"
} // namespace vflow

using namespace mlir;
using namespace vflow;

namespace {

struct PlanLaunches : vflow::impl::PlanLaunchesBase<PlanLaunches> {
  using PlanLaunchesBase::PlanLaunchesBase;

  void runOnOperation() override {
    if (tileBlocks < 1) {
      getOperation().emitError("--tile-blocks must be at least 1");
      return signalPassFailure();
    }
    MLIRContext *context = &getContext();
    getOperation().walk([&](vt::KernelOp kernel) {
      vt::LaunchAttr launch;
      switch (kernel.getKind()) {
      case vt::KernelKind::cache_map:
        launch = vt::LaunchAttr::get(context, vt::LaunchGrid::fields, 256,
                                     /*tileBlocks=*/0);
        break;
      case vt::KernelKind::block_map:
        launch =
            vt::LaunchAttr::get(context, vt::LaunchGrid::tile, 256, tileBlocks);
        break;
      case vt::KernelKind::cross_block:
      case vt::KernelKind::select:
        launch = vt::LaunchAttr::get(context, vt::LaunchGrid::row, 512,
                                     /*tileBlocks=*/0);
        break;
      }
      kernel.setLaunchAttr(launch);
    });
  }
};

} // namespace
