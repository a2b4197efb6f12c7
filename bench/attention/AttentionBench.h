//===- AttentionBench.h - Paged decode attention benchmark ------*- C++ -*-===//
//
// Measures vflow's paged decode attention kernel (dense: every block of each
// sequence; sparse: k random distinct blocks per kv head) and the
// device-to-device copy ceiling, following docs/design/PERFORMANCE.md: random
// data on the device, CUDA events around each launch, warm-up, the median of
// the timed runs, input sets rotated so that repeated runs do not hit L2.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_BENCH_ATTENTION_ATTENTIONBENCH_H
#define VFLOW_BENCH_ATTENTION_ATTENTIONBENCH_H

#include "vflow/Runtime/cuda/Attention.h"

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

namespace vflow {
namespace bench {

struct AttentionShape {
  int batch = 1;
  int length = 4096; ///< tokens of every sequence
  int numKVHeads = 8;
  int group = 4;
  int headDim = 128;
  int pageSize = 16;
  int selected = 64; ///< blocks per kv head of the sparse row
  rt::cuda::KVType type = rt::cuda::KVType::BF16;
};

struct BenchOptions {
  int warmup = 5;
  int iterations = 30; ///< timed runs (the median is reported)
  int inputSets = 4;   ///< rotated sets, as many as memory allows
  /// Device bytes the inputs may take; 0: 85% of what is free.
  size_t memoryBudget = 0;
};

/// One measurement; `what` is copy, dense_attention or sparse_attention
/// (bench/README.md's row schema), or `skipped` with the reason in `note`.
struct BenchRow {
  std::string source = "vflow"; ///< or "peer" (FlashInfer's rows)
  std::string what;
  AttentionShape shape;
  double ms = 0;     ///< median
  double minMs = 0;  ///< fastest run
  double bytes = 0;  ///< what the operation must move
  double gbps = 0;   ///< bytes / ms / 1e6
  int splits = 0;    ///< the kernel's split count
  int inputSets = 0; ///< rotated input sets
  std::string note;

  /// The row as one JSON object (source "vflow").
  std::string json() const;
};

/// Device-to-device copies of `bytes` (cudaMemcpyAsync); bytes counts what
/// is read plus what is written.
BenchRow benchCopy(size_t bytes, const BenchOptions &options);

/// The dense and the sparse decode attention rows of `shape` (a single
/// `skipped` row when one input set does not fit); built with FlashInfer
/// (VFLOW_FLASHINFER_INCLUDE), each is followed by FlashInfer's row on the
/// same pools and lists (FlashInferPeer.h).
std::vector<BenchRow> benchDecodeAttention(const AttentionShape &shape,
                                           const BenchOptions &options);

/// "bf16", "f16" or "fp8".
const char *benchTypeName(rt::cuda::KVType type);
/// The KV type benchTypeName calls `name`, or nothing.
std::optional<rt::cuda::KVType> parseBenchType(const std::string &name);

} // namespace bench
} // namespace vflow

#endif // VFLOW_BENCH_ATTENTION_ATTENTIONBENCH_H
