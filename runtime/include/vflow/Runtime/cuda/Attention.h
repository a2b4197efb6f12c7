//===- Attention.h - GPU paged decode and prefill attention -----*- C++ -*-===//
//
// Hand-written CUDA attention kernels over the paged KV cache.
//
// Layout, per layer:
//   K and V pools  [numPages, numKVHeads, pageSize, headDim] of kvType: bf16,
//                  f16, fp8 e4m3 (OCP "fn") or int8. 8-bit values
//                  dequantize as code * headScale * tokenScale: one float
//                  per kv head (kScale, vScale [numKVHeads]; null means 1.0)
//                  and one per stored row (kTokenScale, vTokenScale
//                  [numPages, numKVHeads, pageSize], as NumericRules' scaled
//                  8-bit KV writes them; null means 1.0, and int8 needs
//                  them). Scales are ignored for 16-bit pools.
//   q, out         bf16 [rows, numKVHeads * group, headDim]; query head h
//                  reads kv head h / group.
//
// Decode: one query row per sequence attends the entries of block lists. List
// r covers (sequence b, kv head kvh) with r = b * numKVHeads + kvh, or r = b
// when listsPerSequence (one list shared by all kv heads). Its entries are
// i in [indptr[r], indptr[r] + count[r]) of `pages` (physical page) and
// `blocks` (logical block of that page); count null means indptr[r+1] -
// indptr[r]. Entry i holds min(pageSize, seqLen[b] - blocks[i] * pageSize)
// valid tokens; an entry with none contributes nothing. A list with no valid
// token gives an output of zeros (and no mass). Within a list the blocks
// must be distinct.
//
// The launch grid depends only on host integers (shapes and maxEntries, an
// upper bound of every count: entries past it are ignored), so a launch
// captured in a CUDA graph may be replayed after the device-side counts and
// lists change.
//
// Mass epilogue: when `mass` is not null, for every attended entry,
//   mass[((b * numKVHeads + kvh) * massStride + blocks[i]) * group + g]
// receives the share of query head kvh * group + g's softmax probability on
// that block (the shares of one head sum to 1). Other elements are left as
// they are (the caller zeroes the buffer); blocks[i] < massStride.
//
// Every function throws vflow::rt::Error on unsupported shapes, bad
// arguments, or a CUDA error.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_ATTENTION_H
#define VFLOW_RUNTIME_CUDA_ATTENTION_H

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace vflow {
namespace rt {
namespace cuda {

enum class KVType : int { BF16, F16, FP8E4M3, INT8 };

/// Bytes of one stored element of `type`.
size_t kvTypeBytes(KVType type);
/// Its name, as the language spells the dtype: bf16, f16, fp8e4m3, int8.
const char *kvTypeName(KVType type);

/// What decode and prefill both read: the K and V pools of one layer, the
/// query and output rows, and the softmax scale (the layout is in the file
/// comment). Pools 16-byte aligned, q and out 4-byte aligned.
struct PagedKVArgs {
  const void *kPool = nullptr;
  const void *vPool = nullptr;
  const float *kScale = nullptr;
  const float *vScale = nullptr;
  const float *kTokenScale = nullptr;
  const float *vTokenScale = nullptr;
  KVType kvType = KVType::BF16;
  int batch = 0;
  int numKVHeads = 0;
  int group = 0;
  int headDim = 0;
  int pageSize = 0;
  /// Pages in each pool: every page id the kernels read must be in [0,
  /// numPages) (checked on the device, IndexCheck.cuh).
  int numPages = 0;
  const void *q = nullptr;
  void *out = nullptr;
  float scale = 0;
  /// A sliding window: a query at position p attends positions
  /// [p - window + 1, p] only (Mistral's and Gemma 3's sliding layers);
  /// 0: every earlier position.
  int window = 0;
  /// 0: K and V pools of headDim. Else a latent cache (DeepSeek's
  /// multi-head latent attention, absorbed): kPool holds one bf16 row of
  /// headDim (even, at most 1024) per token, numKVHeads is 1, every query
  /// head reads it, a token's value is its row's first valueDim dims (even,
  /// at most headDim; vPool and the scales are ignored), out is
  /// [rows, group, valueDim]; any group, no window. Tensor cores when
  /// headDim is a multiple of 8, else CUDA cores (LatentAttention.cu).
  int valueDim = 0;
};

/// Supported: headDim in {64, 128, 256}; group in [1, 16]; pageSize a
/// multiple of 16 in [16, 256]. For f16 and 8-bit pools the query is rounded
/// to f16 inside the kernel, so |q| must stay below 65504.
struct PagedAttentionArgs : PagedKVArgs {
  const int32_t *indptr = nullptr;
  const int32_t *count = nullptr;
  const int32_t *pages = nullptr;
  const int32_t *blocks = nullptr;
  const int32_t *seqLen = nullptr;
  bool listsPerSequence = false;
  int maxEntries = 0;
  float *mass = nullptr;
  int massStride = 0;
  /// Split-KV partials: at least pagedDecodeWorkspaceBytes(...) bytes, 16-byte
  /// aligned; may be null when that is 0. Its contents need no initializing.
  void *workspace = nullptr;
  size_t workspaceBytes = 0;
};

/// How many CTAs share one (sequence, kv head) on the current device: chosen
/// from these host-side values and the device's multiprocessor count and
/// occupancy only.
int pagedDecodeSplits(int batch, int numKVHeads, int group, int headDim,
                      KVType kvType, int maxEntries);

/// Workspace bytes pagedDecodeAttention needs on the current device for these
/// shapes, whatever the kvType (0 when every (sequence, kv head) is handled by
/// one CTA).
size_t pagedDecodeWorkspaceBytes(int batch, int numKVHeads, int group,
                                 int headDim, int maxEntries, int valueDim = 0);

/// One decode step of attention over the block lists (see the file comment).
/// Launches on `stream`; capturable in a CUDA graph.
void pagedDecodeAttention(const PagedAttentionArgs &args, cudaStream_t stream);

/// Causal attention of each sequence's new query rows over its whole page
/// list: sequence b owns q rows [qIndptr[b], qIndptr[b+1]); its n_b rows are
/// its last n_b positions, so row i (0-based within b) sits at position
/// seqLen[b] - n_b + i and attends the tokens at positions 0..that position.
/// Logical block j of b is physical page pages[indptr[b] + j]. Requires
/// seqLen[b] >= n_b (rows of a sequence that breaks it are written as zeros).
/// headDim in {64, 128, 256}, any group and pageSize; 8-bit pools are widened
/// to f16 with their token scales on the way in, so their dequantized K and V
/// (fp8: divided by 256) must stay below 65504. On tensor cores: the
/// FlashAttention-2 forward over pages (64-row query tiles, key tiles
/// streamed through shared memory, an online softmax per row; Prefill.cu).
struct PrefillAttentionArgs : PagedKVArgs {
  int totalTokens = 0;              ///< rows of q and out (host-side)
  const int32_t *qIndptr = nullptr; ///< [batch + 1]
  const int32_t *seqLen = nullptr;  ///< [batch]
  const int32_t *indptr = nullptr;  ///< [batch + 1]
  const int32_t *pages = nullptr;
};

void prefillAttention(const PrefillAttentionArgs &args, cudaStream_t stream);

} // namespace cuda
} // namespace rt
} // namespace vflow

#endif // VFLOW_RUNTIME_CUDA_ATTENTION_H
