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

def InferLayouts : Pass<"vt-infer-layouts", "::vflow::vt::FlowOp"> {
  let summary = "Give every tensor value its layout";
  let description = [{
    Sets the layout of every value of a flow: `paged` for what is read from
    or computed per physical page (K, V, cache fields, the whole cache
    stage), `ragged` for values per logical block of a sequence (anything
    with a `block` axis computed in the index stage, `mass`, `position`,
    per-block states), `batched` for per-sequence values (`q`, per-sequence
    states, scalars that depend on the sequence) and `parameter` for values
    shared by the whole batch (params, consts, constants). Kernel templates
    are chosen by these layouts.
  }];
}

def IncrementalCache : Pass<"vt-incremental-cache", "::vflow::vt::FlowOp"> {
  let summary = "Mark cache fields whose statistic can be merged per token";
  let description = [{
    A cache field is mergeable when its value is a reduction over `token`
    (sum, mean, max, min, or l2norm as a sum of squares) of a per-token
    expression, optionally followed by a per-block elementwise epilogue
    (e.g. sqrt). Such a field can be updated as tokens are appended instead
    of recomputed when the block completes. The pass sets `merge` (the
    combining reduction) and `finalize` (whether an epilogue follows) on
    each `vt.cache_field`; fields that do not qualify get `merge = "none"`.
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
  let summary = "Choose the launch shape of every kernel";
  let description = [{
    Attaches a `plan` dictionary to every `vt.kernel`: the grid it is
    launched over (`page_kvhead` for the cache stage, `seq_kvhead_tile` for
    block maps, `seq_kvhead` for cross-block and select kernels), the
    number of blocks a program instance handles (`tile_blocks`), and the
    work per block in elements (`elements_per_block`) used by the runtime's
    planner to size the worklist.
  }];
  let options = [
    Option<"tileBlocks", "tile-blocks", "int64_t", /*default=*/"64",
           "Blocks per program instance of a block_map kernel">
  ];
}

def AssignBuffers : Pass<"vt-assign-buffers", "::vflow::vt::FlowOp"> {
  let summary = "Give every value that crosses kernels a scratch buffer";
  let description = [{
    Every value produced by one kernel and used by another (or by the
    return) lives in device memory between the two launches. The pass
    attaches to each kernel a `buffers` array with, per result, the buffer
    slot and its size per (sequence, KV head) as a multiple of the number
    of blocks (`per_block` elements) plus a constant (`fixed` elements).
    Slots are reused once their last reader has run.
  }];
}

#endif // VFLOW_COMPILER_PASSES_TD
