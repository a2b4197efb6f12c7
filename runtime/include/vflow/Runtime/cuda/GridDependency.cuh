//===- GridDependency.cuh - Programmatic dependent launch ------*- CUDA -*-===//
//
// What lets a step's kernels start while the one before them runs: the
// device half of programmatic dependent launch (sm_90 and later; the
// functions are no-ops in code for older archs, which the runtime then
// launches in plain stream order). Generated kernels get it through
// FlowDevice.cuh (it is embedded for NVRTC next to it); the runtime's own
// kernels include it directly.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_GRIDDEPENDENCY_CUH
#define VFLOW_RUNTIME_CUDA_GRIDDEPENDENCY_CUH

namespace vd {

/// Blocks until the grid before this one in its stream completed and its
/// writes are visible (a kernel that must start its own dependents later,
/// like the attention, calls the two halves apart).
__device__ __forceinline__ void waitForEarlierGrids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/// Lets the grid launched after this one start its CTAs.
__device__ __forceinline__ void launchDependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
/// Programmatic dependent launch (sm_90 and later; no-ops before). A grid
/// launched as a programmatic dependent of the one before it in its stream
/// may start while that one runs; awaitEarlierGrids() then blocks until the
/// earlier grid completed and its writes are visible, and lets the grid
/// after this one start its CTAs (they wait the same way). The contract
/// every kernel the runtime launches so keeps: each CTA calls it before its
/// first write to global memory, before reading anything an earlier grid of
/// the stream may have written (the step's query, fields, workspace, lists)
/// and before it returns; only inputs the host wrote before the step began
/// (lengths, block tables, params) are read before it. Since every grid of
/// the chain waits before it lets its dependents start, a grid that starts
/// has every grid but its direct predecessor complete.
__device__ __forceinline__ void awaitEarlierGrids() {
  waitForEarlierGrids();
  launchDependents();
}

} // namespace vd

#endif // VFLOW_RUNTIME_CUDA_GRIDDEPENDENCY_CUH
