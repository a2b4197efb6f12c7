//===- LatentKernels.cuh - What the latent kernels share --------*- CUDA
//-*-===//
//
// The parameters, the work of a CTA (a query row's split of its entries),
// the mass shares and the launch helper shared by LatentAttention.cu (the
// CUDA-core kernel, the merge, the entry points) and LatentMma.cu (the
// tensor-core kernel).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_ATTENTION_LATENTKERNELS_CUH
#define VFLOW_RUNTIME_CUDA_ATTENTION_LATENTKERNELS_CUH

#include "AttentionCommon.h"
#include "DeviceHelpers.cuh"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace vflow::rt::cuda::detail::latent {

constexpr int kHeads = 16; ///< query heads of a CTA
/// The fewest entries a decode split takes while a row has more.
constexpr int kMinEntriesPerSplit = 4;

struct LatentParams {
  const __nv_bfloat16 *pool; ///< [numPages, pageSize, dk]
  const __nv_bfloat16 *q;    ///< [rows, heads, dk]
  __nv_bfloat16 *out;        ///< [rows, heads, dv]
  int heads, dk, dv, pageSize, numPages;
  float scaleLog2;
  const int32_t *indptr, *count, *pages, *blocks, *seqLen;
  /// Prefill: q rows of sequence b are [qIndptr[b], qIndptr[b + 1]);
  /// null in decode (row b is sequence b's one row).
  const int32_t *qIndptr;
  int batch;
  int entriesPerSplit, numSplits;
  float *mass;
  int massStride;
  float *partAcc; ///< [splits, rows, heads, dv]
  float *partML;  ///< [splits, rows, heads, 2]
};

/// What a CTA attends: for row `row` (its sequence `b`), entries [first,
/// last) of its list, each `pages[base + e]` holding logical block
/// `blocks`-or-e, with `len` tokens in the sequence as this row sees it.
struct Work {
  int b, base, first, last, len;
  bool dense; ///< prefill: entry e is logical block e
};

__device__ inline Work workOf(const LatentParams &p, int row, int split) {
  Work w;
  if (p.qIndptr) {
    // The row's sequence: the last b with qIndptr[b] <= row.
    int lo = 0, hi = p.batch;
    while (lo + 1 < hi) {
      const int mid = (lo + hi) / 2;
      if (p.qIndptr[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    w.b = lo;
    const int rows = p.qIndptr[lo + 1] - p.qIndptr[lo];
    // A sequence shorter than its new rows breaks the contract: zeros.
    w.len = p.seqLen[lo] < rows
                ? 0
                : p.seqLen[lo] - rows + (row - p.qIndptr[lo]) + 1;
    w.base = p.indptr[lo];
    w.first = 0;
    w.last = w.len > 0 ? (w.len + p.pageSize - 1) / p.pageSize : 0;
    w.dense = true;
    return w;
  }
  w.b = row;
  w.len = p.seqLen[row];
  w.base = p.indptr[row];
  const int2 share =
      splitShare(p.count ? p.count[row] : p.indptr[row + 1] - w.base,
                 p.numSplits, p.entriesPerSplit, kMinEntriesPerSplit, split);
  w.first = share.x;
  w.last = share.y;
  w.dense = false;
  return w;
}

/// Head h's entries' log2-sum-exps (written by this thread) turned into
/// their shares of the head's mass (max m, sum l; one split).
__device__ inline void massShares(const LatentParams &p, const Work &w, int h,
                                  float m, float l) {
  if (!p.mass || l <= 0.0f)
    return;
  const float lse = m + __log2f(l);
  for (int e = w.first; e < w.last; ++e) {
    const int block = w.dense ? e : p.blocks[w.base + e];
    if (block * p.pageSize >= w.len)
      continue;
    float *share = p.mass + (size_t(w.b) * p.massStride + block) * p.heads + h;
    *share = ex2(*share - lse);
  }
}

/// Sets a kernel's dynamic shared memory past the default when it needs
/// more, then launches it.
template <class Kernel>
inline void launchKernel(Kernel kernel, const LatentParams &p, dim3 grid,
                         int threads, size_t bytes, cudaStream_t stream,
                         const char *op) {
  if (bytes > 48 * 1024)
    checkCuda(cudaFuncSetAttribute(kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(bytes)),
              op);
  kernel<<<grid, threads, bytes, stream>>>(p);
  checkCuda(cudaGetLastError(), op);
}

/// The tensor-core kernel (LatentMma.cu) on `grid`: rows of a multiple of 8
/// dims.
void launchMma(const LatentParams &p, dim3 grid, cudaStream_t stream,
               const char *op);

} // namespace vflow::rt::cuda::detail::latent

#endif // VFLOW_RUNTIME_CUDA_ATTENTION_LATENTKERNELS_CUH
