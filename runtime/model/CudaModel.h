//===- CudaModel.h - The model's math on the GPU ----------------*- C++ -*-===//
//
// Private to the engine: the CUDA half of ModelRunner. bf16 weights on the
// device, GEMMs through cuBLAS (bf16 in, f32 accumulate), a f32 residual
// stream, small kernels for norms, RoPE and SwiGLU. Attention is the
// caller's (the session, on device bf16 q/k/v/out on stream()).
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_CUDAMODEL_H
#define VFLOW_MODEL_CUDAMODEL_H

#include "vflow/Model/Runner.h"

#include <functional>
#include <memory>
#include <vector>

namespace vflow::model {

class CudaModel {
public:
  /// Device pointers of one layer's attention: q [rows, heads, D], k and v
  /// [rows, kvHeads, D] (bf16, RoPE applied), out like q.
  using Attend = std::function<void(int layer, void *q, void *k, void *v,
                                    void *out, void *stream)>;

  /// `maxBatch`: the most rows of a decode step replayed from a graph.
  CudaModel(const ModelWeights &weights, const ModelConfig &config,
            int maxBatch);
  ~CudaModel();
  CudaModel(const CudaModel &) = delete;
  CudaModel &operator=(const CudaModel &) = delete;

  void *stream() const;
  /// The forward over `ids` at `positions`; for the rows in `lastRows`,
  /// either their logits (f32, to the host) or, with `draws`, their next
  /// tokens drawn on the device (Sampling.h): only those come back.
  void forward(const std::vector<int32_t> &ids,
               const std::vector<int64_t> &positions,
               const std::vector<int64_t> &lastRows, const Attend &attend,
               ForwardTimes &times, const std::vector<RowSampling> *draws,
               std::vector<float> *logits, std::vector<int32_t> *tokens);
  /// A decode step (one token per row, every row sampled) from the CUDA
  /// graph of `key` (the session's Session::beginStep key): the first
  /// step of a key runs eagerly, the second captures, later ones replay.
  /// `stepLayer` is Session::stepLayer; a key whose capture fails stays
  /// eager. Returns false, doing nothing, for more rows than maxBatch.
  bool decodeStep(const std::vector<int32_t> &ids,
                  const std::vector<int64_t> &positions,
                  const std::vector<RowSampling> &draws, const rt::StepKey &key,
                  const Attend &stepLayer, ForwardTimes &times,
                  std::vector<int32_t> &tokens);

private:
  struct Impl;
  std::unique_ptr<Impl> impl;
};

} // namespace vflow::model

#endif // VFLOW_MODEL_CUDAMODEL_H
