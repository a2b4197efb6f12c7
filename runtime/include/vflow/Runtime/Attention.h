//===- Attention.h - Host reference decode attention ------------*- C++ -*-===//
//
// Reference kernels for one decode step of paged attention on the host: f32
// math, numerically stable (max-subtracted) softmax, grouped-query attention.
// They are the oracle the CPU and CUDA backends are compared against.
//
// Shapes, for one sequence and one layer, with numQHeads = numKVHeads * group:
//   q    [numQHeads, headDim] f32; query head h reads kv head h / group.
//   out  [numQHeads, headDim] f32.
//   mass [numKVHeads, numBlocks(seq), group] f32 (optional): for each kv head
//        and logical block, per query head of the group, the sum of that
//        head's softmax probabilities over the block's tokens; 0 for blocks
//        that were not attended. Over the attended blocks it sums to 1 per
//        query head. This is the language's `mass [block, head]` input.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_ATTENTION_H
#define VFLOW_RUNTIME_ATTENTION_H

#include "vflow/Runtime/PagedKVCache.h"

#include <cstdint>
#include <vector>

namespace vflow {
namespace rt {

/// Per kv head, the logical block indices (in [0, numBlocks(seq))) to attend,
/// in any order, each at most once. A partial last block is attended over its
/// valid tokens only.
using BlockLists = std::vector<std::vector<int64_t>>;

/// Attention over every token of `seq` at `layer`, or with `window` > 0
/// over its last `window` tokens only (a sliding-window layer). Throws Error
/// for an empty sequence, a bad layer or group, or null q/out.
void denseDecodeAttention(const PagedKVCache &cache, SeqId seq, int layer,
                          const float *q, int group, float scale, float *out,
                          float *mass = nullptr, int64_t window = 0);

/// Attention over the listed blocks only, per kv head (blocks.size() must be
/// numKVHeads, and every list non-empty), the tokens at positions before
/// `firstToken` left out (a sliding window; each list must keep a token).
/// Listing every block equals denseDecodeAttention.
void sparseDecodeAttention(const PagedKVCache &cache, SeqId seq, int layer,
                           const float *q, int group, float scale,
                           const BlockLists &blocks, float *out,
                           float *mass = nullptr, int64_t firstToken = 0);

/// Causal attention of the last `n` tokens of `seq` (prefill): q and out
/// are [n, numQHeads, headDim]; row i sits at position length - n + i and
/// attends every token at or before it. Throws Error when n is not in [1,
/// length] or for a bad layer or group. With `mass` ([numKVHeads,
/// numBlocks, group], as above) it also receives the observation window:
/// the mean over the last min(observe, n) rows of each query head's
/// softmax mass per block (SessionConfig::observeTokens). With
/// `slidingWindow` > 0 a row attends only the last slidingWindow positions
/// up to its own.
void causalPrefillAttention(const PagedKVCache &cache, SeqId seq, int layer,
                            const float *q, int64_t n, int group, float scale,
                            float *out, float *mass = nullptr,
                            int64_t observe = 0, int64_t slidingWindow = 0);

/// denseDecodeAttention for each of `seqs`: q and out are [seqs.size(),
/// numQHeads, headDim]. When `masses` is given it receives one mass array per
/// sequence (shaped as above).
void denseDecodeAttentionBatch(
    const PagedKVCache &cache, const std::vector<SeqId> &seqs, int layer,
    const float *q, int group, float scale, float *out,
    std::vector<std::vector<float>> *masses = nullptr);

/// sparseDecodeAttention for each of `seqs`, with blocks[i] for seqs[i].
void sparseDecodeAttentionBatch(
    const PagedKVCache &cache, const std::vector<SeqId> &seqs, int layer,
    const float *q, int group, float scale,
    const std::vector<BlockLists> &blocks, float *out,
    std::vector<std::vector<float>> *masses = nullptr);

} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_ATTENTION_H
