//===- IndexCheck.cuh - Indices a kernel reads from its caller --*- CUDA
//-*-===//
//
// The runtime's kernels read page ids, slot positions and list counts from
// memory their caller filled (the torch ops take them from another engine).
// An index outside its range would read or write past a pool: other memory,
// silently. So a kernel checks each such index where it reads it and, for
// one outside [0, limit), prints which argument of which op holds what, and
// stops the grid (the launch fails; the CUDA context cannot be used after
// it, as after PyTorch's device-side asserts). Indices the runtime computes
// itself are in range by construction; the check is one compare.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_INDEXCHECK_CUH
#define VFLOW_RUNTIME_CUDA_INDEXCHECK_CUH

#include <cstdio>

namespace vflow::rt::cuda {

/// Stops the grid: `what` (e.g. "paged_decode: pages entry") is `index`,
/// outside [0, limit).
__device__ __noinline__ inline void
indexOutOfRange(const char *what, long long index, long long limit) {
  printf("vflow: %s is %lld, outside [0, %lld): stopping the kernel "
         "(block %d, thread %d)\n",
         what, index, limit, int(blockIdx.x), int(threadIdx.x));
  __trap();
}

/// `index` itself when it is in [0, limit), else indexOutOfRange.
__device__ __forceinline__ int checkedIndex(const char *what, int index,
                                            int limit) {
  if (static_cast<unsigned>(index) >= static_cast<unsigned>(limit))
    indexOutOfRange(what, index, limit);
  return index;
}

} // namespace vflow::rt::cuda

#endif // VFLOW_RUNTIME_CUDA_INDEXCHECK_CUH
