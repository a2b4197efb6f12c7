//===- FlashInferPeer.h - FlashInfer's paged decode as a peer ---*- C++ -*-===//
//
// FlashInfer's batch paged decode (its own planner and CUDA-core decode
// kernel, header-only templates from the flashinfer-python wheel) run on
// vflow's own KV pools and block lists, for the attention benchmark's peer
// rows. Built only when CMake is given VFLOW_FLASHINFER_INCLUDE (the
// directory holding flashinfer/attention/decode.cuh); nothing in the
// runtime depends on it.
//
// vflow's pools are [page][kv head][token][dim], which is FlashInfer's HND
// layout. Dense lists (one per sequence, shared by its kv heads) map to one
// FlashInfer request per sequence. Sparse lists are per (sequence, kv head):
// each becomes a request of its own over the pool viewed as pages of one
// head (page id page * H + h, page stride P * D), with its G query heads.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_BENCH_ATTENTION_FLASHINFERPEER_H
#define VFLOW_BENCH_ATTENTION_FLASHINFERPEER_H

#include "AttentionBench.h"

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace vflow {
namespace bench {

struct FlashInferProblem {
  /// The benchmark's shape (type BF16 or FP8E4M3; group 1, 2, 4 or 8; head
  /// dim 64 or 128; `length` and `selected` are not read).
  AttentionShape shape;
  /// Sparse: a list per (sequence, kv head); dense: a list per sequence.
  bool perHeadLists = false;
  /// Host copies of the lists' shape: requests + 1 offsets into the page
  /// ids, and the tokens in each request's last page.
  std::vector<int32_t> indptr;
  std::vector<int32_t> lastPageLen;
  float scale = 0; ///< softmax scale, times the K scale for fp8
};

/// A planned FlashInfer decode. Construction plans (host work, as
/// FlashInfer's plan()) and throws rt::Error for a shape it does not
/// cover; run() launches the decode.
class FlashInferPeer {
public:
  explicit FlashInferPeer(const FlashInferProblem &problem);
  ~FlashInferPeer();
  FlashInferPeer(const FlashInferPeer &) = delete;
  FlashInferPeer &operator=(const FlashInferPeer &) = delete;

  /// q and out are bf16 [batch][kv head][group][dim]; pages are the device
  /// page ids of the lists, in FlashInfer's numbering (perHeadPageIds for
  /// sparse lists).
  void run(const void *kPool, const void *vPool, const int32_t *pages,
           const void *q, void *out, cudaStream_t stream) const;

  /// Sparse lists' page ids in FlashInfer's numbering (page * H + h for
  /// the list of kv head h).
  static std::vector<int32_t> perHeadPageIds(const std::vector<int32_t> &indptr,
                                             const std::vector<int32_t> &pages,
                                             int numKVHeads);

  struct Impl;

private:
  std::unique_ptr<Impl> impl;
};

} // namespace bench
} // namespace vflow

#endif // VFLOW_BENCH_ATTENTION_FLASHINFERPEER_H
