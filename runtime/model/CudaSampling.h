//===- CudaSampling.h - The sampling rule on the GPU -----------*- C++ -*-===//
//
// Private to the engine's GPU runner (CudaModel.cu): each row's token from
// its logits by Sampling.h's rule (greedy, temperature, top-k, top-p, the
// row's seeded draw), one CTA a row, so a decode step that samples is
// still captured in a CUDA graph.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_CUDASAMPLING_H
#define VFLOW_MODEL_CUDASAMPLING_H

#include "vflow/Model/Sampling.h"

#include <cuda_runtime_api.h>

namespace vflow::model {

/// tokens[r] for rows r < `rows` of logits [rows, V] (f32) with draws[r]
/// (device memory), on `stream`; kNonFiniteLogits for a row with a
/// non-finite logit.
void sampleRows(const float *logits, int rows, int V, const RowSampling *draws,
                int *tokens, cudaStream_t stream);

} // namespace vflow::model

#endif // VFLOW_MODEL_CUDASAMPLING_H
