//===- Passes.td - vflow compiler passes --------------------*- tablegen -*-===//
//
// The passes that take a lowered vt.flow to planned kernels. Each has a lit
// test named after its flag (tests/lit/passes/<flag>.mlir) and is
// differential-tested against the reference interpreter.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_COMPILER_PASSES_TD
#define VFLOW_COMPILER_PASSES_TD

include "mlir/Pass/PassBase.td"

def HoistConsts : Pass<"vt-hoist-consts", "::vflow::vt::FlowOp"> {
  let summary = "Move work on consts alone out of the stages into consts";
  let description = [{
    A value of the cache or index stage computed from consts, constants,
    generators and compile-time params alone is the same for every block,
    head and step. When its computation holds a reduction (or softmax,
    normalize, conv, kth_largest, a generator), it becomes a new `vt.const`
    (named `hoisted.N`, after the flow's consts) computed once per flow and
    head dimension, and the stage reads it with `vt.const_load`. Cheap
    elementwise work on consts stays inline. Kernels then neither redo the
    reduction per block nor hold its intermediates (which can exceed a GPU
    thread block's shared memory).
  }];
}

def FuseKernels : Pass<"vt-fuse-kernels", "::vflow::vt::FlowOp"> {
  let summary = "Group the ops of each stage into kernels by template class";
  let description = [{
    Wraps the ops of the cache stage into one `vt.kernel cache_map`, and
    splits the index stage into `block_map` kernels (work per block, and
    per-sequence scalars), `cross_block` kernels (reductions, softmax,
    normalize, conv and kth_largest along `block`) and one `select` kernel
    (topk, approx_topk, threshold, union). A kernel holds all the ops at
    the same cross-block depth, so a flow with no cross-block op runs in one
    map kernel and one select kernel. Stage inputs, loads and the
    host-evaluable budget arithmetic stay outside kernels: the kernel
    templates read inputs themselves and the host planner evaluates budgets.
  }];
}

def PlanLaunches : Pass<"vt-plan-launches", "::vflow::vt::FlowOp"> {
  let summary = "Decide how every kernel is launched on the GPU";
  let description = [{
    Sets the `launch` (`#vt.launch`) of every `vt.kernel`: the grid
    (`fields` for the cache stage's `cache_map`, `tile` for `block_map`,
    `row` for `cross_block` and `select`), the threads per CTA (256, 512
    for `row`) and, for `tile`, the most blocks of a tile (`tile_blocks`).
    The CUDA backend emits each kernel by its launch and describes it to the
    runtime with the same grid (`rt::GpuGrid`), which launches it.
  }];
  let options = [
    Option<"tileBlocks", "tile-blocks", "int64_t", /*default=*/"64",
           "The most blocks of a tile of a block_map kernel">
  ];
}

#endif // VFLOW_COMPILER_PASSES_TD
