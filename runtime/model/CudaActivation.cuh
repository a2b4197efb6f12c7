//===- CudaActivation.cuh - The gated MLP activation on the GPU -*- CUDA
//-*-===//
//
// act(gate) * up, the one rule of the dense MLP (CudaModel.cu) and the
// experts (CudaMoe.cu, both its kernels and its GEMM path): SiLU, or GELU's
// tanh approximation (Gemma's GeGLU).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_CUDAACTIVATION_CUH
#define VFLOW_MODEL_CUDAACTIVATION_CUH

#include <cuda_bf16.h>

namespace vflow::model::detail {

__device__ __forceinline__ float gatedActivation(float gate, float up,
                                                 bool geluTanh) {
  const float act =
      geluTanh ? 0.5f * gate *
                     (1.0f + tanhf(0.7978845608028654f *
                                   (gate + 0.044715f * gate * gate * gate)))
               : gate / (1.0f + expf(-gate));
  return act * up;
}

/// In the fused gate/up product gu (a row: I gate values, then I up
/// values; n = rows x I elements), the gate half becomes act(gate) * up.
static __global__ void gatedKernel(__nv_bfloat16 *gu, int I, long long n,
                                   bool geluTanh) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / I, c = i - r * I;
    __nv_bfloat16 *g = gu + r * 2 * I + c;
    *g = __float2bfloat16(gatedActivation(__bfloat162float(*g),
                                          __bfloat162float(g[I]), geluTanh));
  }
}

} // namespace vflow::model::detail

#endif // VFLOW_MODEL_CUDAACTIVATION_CUH
