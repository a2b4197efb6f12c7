//===- LatentAttention.h - Attention over a latent (MLA) cache --*- C++ -*-===//
//
// The kernels pagedDecodeAttention and prefillAttention hand a latent cache
// to (PagedKVArgs::valueDim set: one bf16 pool of rows whose first
// valueDim dims are the values; LatentAttention.cu).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_ATTENTION_LATENTATTENTION_H
#define VFLOW_RUNTIME_CUDA_ATTENTION_LATENTATTENTION_H

#include "vflow/Runtime/cuda/Attention.h"

#include <cuda_runtime_api.h>

#include <cstddef>

namespace vflow::rt::cuda::detail {

/// The widest latent row and value the kernels take.
constexpr int kLatentMaxHeadDim = 1024;
constexpr int kLatentMaxValueDim = 1024;

int latentDecodeSplits(int batch, int group, int maxEntries);
size_t latentDecodeWorkspaceBytes(int batch, int group, int valueDim,
                                  int maxEntries);
void latentDecodeAttention(const PagedAttentionArgs &args, cudaStream_t stream);
void latentPrefillAttention(const PrefillAttentionArgs &args,
                            cudaStream_t stream);

} // namespace vflow::rt::cuda::detail

#endif // VFLOW_RUNTIME_CUDA_ATTENTION_LATENTATTENTION_H
