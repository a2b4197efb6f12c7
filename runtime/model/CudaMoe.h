//===- CudaMoe.h - A mixture of experts on the GPU --------------*- C++ -*-===//
//
// Private to the engine's GPU runner (CudaModel): the routed experts of a
// mixture-of-experts layer (Qwen3-MoE, Mixtral) without a host round trip,
// so a decode step that holds them is still captured in a CUDA graph. From
// the router's f32 logits each row picks its experts by Runner.cpp's rule
// (route(): softmax or sigmoid scores, groups, the k best, renormalized and
// scaled); each expert's rows are listed on the device; one kernel computes
// every listed (row, expert)'s SwiGLU hidden vector, one its weighted down
// projection, one sums a row's experts. Each expert's weights are read once
// a step whatever its rows (they stay in L1/L2 across them), which is what
// a decode step costs. A prefill step (many rows, not captured) gathers
// each expert's rows and runs them as cuBLAS GEMMs instead (one host sync
// for the experts' row counts).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_CUDAMOE_H
#define VFLOW_MODEL_CUDAMOE_H

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>

namespace vflow::model {

struct MoeArgs {
  int rows = 0;       ///< T
  int hidden = 0;     ///< E
  int inner = 0;      ///< I: an expert's intermediate size
  int experts = 0;    ///< X
  int perToken = 0;   ///< K
  int groups = 0;     ///< expert groups (0: none)
  int keptGroups = 0; ///< groups a row chooses among
  bool sigmoid = false;
  bool normalize = false;
  float scaling = 1.0f;
  const float *logits = nullptr;         ///< [T, X] f32
  const float *bias = nullptr;           ///< [X] choice bias, or null
  const __nv_bfloat16 *x = nullptr;      ///< [T, E] the layer's normed input
  const __nv_bfloat16 *gateUp = nullptr; ///< [X, 2I, E]: gate rows, up rows
  const __nv_bfloat16 *down = nullptr;   ///< [X, E, I]
  __nv_bfloat16 *out = nullptr;          ///< [T, E]; may alias x
  void *workspace = nullptr;             ///< moeWorkspaceBytes(...) bytes
  /// With a handle (on `stream`), a step of at least kMoeGemmRows rows
  /// that is not being captured runs each expert's rows as cuBLAS GEMMs
  /// (prefill); else, and for decode, the kernels below.
  cublasHandle_t blas = nullptr;
};

/// Rows from which moeForward runs the experts as GEMMs (given a handle).
constexpr int kMoeGemmRows = 64;

/// Workspace bytes for `rows` rows (16-byte aligned parts).
size_t moeWorkspaceBytes(int rows, int hidden, int inner, int experts,
                         int perToken);

/// The routed experts' output of every row into args.out (on `stream`,
/// capturable). Throws vflow::rt::Error on a launch error.
void moeForward(const MoeArgs &args, cudaStream_t stream);

} // namespace vflow::model

#endif // VFLOW_MODEL_CUDAMOE_H
