//===- LatentAttention.cu - Attention over a latent (MLA) cache -----------===//
//
// Decode and prefill attention when the cache holds one latent row a token
// and the values are the first valueDim dims of those rows (PagedKVArgs::
// valueDim; DeepSeek's multi-head latent attention, absorbed: a row is
// [c_kv; k_pe], 576 wide for DeepSeek-V2/V3, values the 512-wide c_kv). One
// bf16 pool, one KV head that every query head reads (group = the model's
// heads, 16 to 128).
//
// Two kernels with one grid and one result: a CTA takes 16 query heads of
// one query row (a sequence's decode row, or a prompt row in prefill) and
// one split of its entries. latentMmaKernel (LatentMma.cu; rows of a
// multiple of 8 dims) runs each 32-token tile as two small GEMMs on tensor
// cores; latentKernel (here),
// the CUDA-core kernel the first tests held the GPU to, takes other rows:
// it streams tokens through shared memory 16 at a time, a thread computes
// one (head, token) logit, a half-warp keeps one head's online softmax, and
// each thread accumulates 2 of every 32 value dims of its head. Decode
// splits a row's entries over CTAs as the paged decode does (partials
// merged by a second kernel), and writes the mass epilogue the same way
// (log2-sum-exp of each entry's logits, turned into its share of the
// head's mass at the end).
//
//===----------------------------------------------------------------------===//

#include "LatentAttention.h"
#include "LatentKernels.cuh"

#include "vflow/Runtime/cuda/IndexCheck.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

namespace vflow::rt::cuda::detail {
using namespace latent;
namespace {

constexpr int kTokens = 16; ///< tokens of a tile
constexpr int kThreads = kHeads * kTokens;
constexpr int kMergeThreads = 256;

/// Words (bf16 pairs) between rows of a tile in shared memory: odd, so the
/// 16 rows of one column fall in 16 different banks.
__host__ __device__ inline int tileStride(int dk) { return dk / 2 | 1; }

__device__ __forceinline__ float2 pair(const __nv_bfloat162 *p) {
  return __bfloat1622float2(*p);
}

/// The shared memory of a CTA: its queries and a tile of rows (bf16
/// pairs, rows `stride` words apart), the tile's probabilities and each
/// head's correction of its accumulators.
struct Smem {
  __nv_bfloat162 *q, *k; ///< [kHeads][stride], [kTokens][stride]
  float *p, *corr;       ///< [kHeads][kTokens], [kHeads]
  int stride;
};

/// A head's online softmax (log2 domain): the running max and sum, and the
/// current entry's (its log2-sum-exp is the mass epilogue's).
struct Softmax {
  float m = -INFINITY, l = 0.0f, eM = -INFINITY, eS = 0.0f;
};

/// The CTA's queries, heads [h0, h0 + 16) of q row `row` (heads past the
/// model's are zeros).
__device__ void loadQueries(const LatentParams &p, const Smem &sm, int row,
                            int h0) {
  const int pairs = p.dk / 2;
  for (int i = threadIdx.x; i < kHeads * pairs; i += kThreads) {
    const int qh = i / pairs, c = i - qh * pairs;
    __nv_bfloat162 v = __floats2bfloat162_rn(0.0f, 0.0f);
    if (h0 + qh < p.heads)
      v = reinterpret_cast<const __nv_bfloat162 *>(
          p.q + (size_t(row) * p.heads + h0 + qh) * p.dk)[c];
    sm.q[qh * sm.stride + c] = v;
  }
}

/// Tokens [t0, t0 + n) of a page's `rows` into the tile; the rest of the
/// tile zeros, never the pool's slack.
__device__ void loadTile(const LatentParams &p, const Smem &sm,
                         const __nv_bfloat16 *rows, int t0, int n) {
  const int pairs = p.dk / 2;
  for (int i = threadIdx.x; i < kTokens * pairs; i += kThreads) {
    const int t = i / pairs, c = i - t * pairs;
    sm.k[t * sm.stride + c] = t < n ? reinterpret_cast<const __nv_bfloat162 *>(
                                          rows + size_t(t0 + t) * p.dk)[c]
                                    : __floats2bfloat162_rn(0.0f, 0.0f);
  }
}

/// Thread (head hl, token j)'s logit of the tile (log2 domain), or -inf.
__device__ float logitOf(const LatentParams &p, const Smem &sm, int hl, int j,
                         bool live, int n) {
  if (!live || j >= n)
    return -INFINITY;
  float dot = 0.0f;
  const __nv_bfloat162 *qr = sm.q + hl * sm.stride, *kr = sm.k + j * sm.stride;
  for (int c = 0; c < p.dk / 2; ++c) {
    const float2 a = pair(qr + c), b = pair(kr + c);
    dot = fmaf(a.x, b.x, fmaf(a.y, b.y, dot));
  }
  return dot * p.scaleLog2;
}

/// The tile's logit s of this thread into its head's softmax (the head's
/// 16 logits live in one half-warp); returns its probability relative to
/// the new max and sets `corr`, the factor the accumulators take.
__device__ float softmaxStep(float s, Softmax &f, float &corr) {
  float top = s;
#pragma unroll
  for (int o = kTokens / 2; o > 0; o /= 2)
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
  const float newM = fmaxf(f.m, top);
  const float prob = s == -INFINITY ? 0.0f : ex2(s - newM);
  float sum = prob;
#pragma unroll
  for (int o = kTokens / 2; o > 0; o /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  corr = f.m == -INFINITY ? 0.0f : ex2(f.m - newM);
  f.l = f.l * corr + sum;
  f.m = newM;
  // The entry's own log2-sum-exp, from sums relative to the tile's and the
  // entry's maxima (factors at most 1: an entry far below the running max
  // keeps its share). Reduced by every lane: a half-warp whose head is past
  // the model's (top -inf) still takes part in the shuffles.
  float own = s == -INFINITY ? 0.0f : ex2(s - top);
#pragma unroll
  for (int o = kTokens / 2; o > 0; o /= 2)
    own += __shfl_xor_sync(0xffffffffu, own, o);
  if (top != -INFINITY) {
    const float eNew = fmaxf(f.eM, top);
    f.eS = f.eS * (f.eM == -INFINITY ? 0.0f : ex2(f.eM - eNew)) +
           own * ex2(top - eNew);
    f.eM = eNew;
  }
  return prob;
}

/// acc[k] (value dims 2 j + 32 k and the next) = acc[k] * corr + the
/// tile's n tokens' values weighted by their probabilities.
template <int Pairs>
__device__ void accumulate(const LatentParams &p, const Smem &sm, int hl, int j,
                           int n, float2 (&acc)[Pairs]) {
  const float c = sm.corr[hl];
#pragma unroll
  for (int k = 0; k < Pairs; ++k) {
    const int d = 2 * j + 32 * k;
    float2 a = make_float2(acc[k].x * c, acc[k].y * c);
    if (d < p.dv)
      for (int t = 0; t < n; ++t) {
        const float pt = sm.p[hl * kTokens + t];
        const float2 v = pair(sm.k + t * sm.stride + d / 2);
        a.x = fmaf(pt, v.x, a.x);
        a.y = fmaf(pt, v.y, a.y);
      }
    acc[k] = a;
  }
}

/// Head h's result: its split's partials, or its output and its entries'
/// mass shares (this thread wrote their log2-sum-exps).
template <int Pairs>
__device__ void finish(const LatentParams &p, const Work &w, int row, int split,
                       int h, int j, const Softmax &f,
                       const float2 (&acc)[Pairs]) {
  if (p.numSplits > 1) {
    const size_t at = (size_t(split) * gridDim.y + row) * p.heads + h;
#pragma unroll
    for (int k = 0; k < Pairs; ++k) {
      const int d = 2 * j + 32 * k;
      if (d < p.dv) {
        p.partAcc[at * p.dv + d] = acc[k].x;
        p.partAcc[at * p.dv + d + 1] = acc[k].y;
      }
    }
    if (j == 0)
      reinterpret_cast<float2 *>(p.partML)[at] = make_float2(f.m, f.l);
    return;
  }
  const float inv = f.l > 0.0f ? 1.0f / f.l : 0.0f;
  __nv_bfloat16 *o = p.out + (size_t(row) * p.heads + h) * p.dv;
#pragma unroll
  for (int k = 0; k < Pairs; ++k) {
    const int d = 2 * j + 32 * k;
    if (d < p.dv)
      *reinterpret_cast<__nv_bfloat162 *>(o + d) =
          __floats2bfloat162_rn(acc[k].x * inv, acc[k].y * inv);
  }
  if (j == 0)
    massShares(p, w, h, f.m, f.l);
}

/// One CTA: heads [blockIdx.z * 16, +16) of row blockIdx.y (decode: split
/// blockIdx.x of its entries); each thread holds Pairs bf16 pairs of its
/// head's output (values up to 32 Pairs wide).
template <int Pairs>
__global__ void __launch_bounds__(kThreads) latentKernel(const LatentParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  Smem sm;
  sm.stride = tileStride(p.dk);
  sm.q = reinterpret_cast<__nv_bfloat162 *>(smem);
  sm.k = sm.q + kHeads * sm.stride;
  sm.p = reinterpret_cast<float *>(sm.k + kTokens * sm.stride);
  sm.corr = sm.p + kHeads * kTokens;
  // Decode: grid (splits, rows, head blocks); prefill: (rows, 1, head
  // blocks).
  const bool prefill = p.qIndptr != nullptr;
  const int row = prefill ? blockIdx.x : blockIdx.y;
  const int split = prefill ? 0 : blockIdx.x, h0 = blockIdx.z * kHeads;
  const int hl = threadIdx.x / kTokens, j = threadIdx.x % kTokens;
  const int h = h0 + hl;
  const bool live = h < p.heads;
  const Work w = workOf(p, row, split);
  loadQueries(p, sm, row, h0);
  Softmax f;
  float2 acc[Pairs];
#pragma unroll
  for (int k = 0; k < Pairs; ++k)
    acc[k] = make_float2(0.0f, 0.0f);
  for (int e = w.first; e < w.last; ++e) {
    const int block = w.dense ? e : p.blocks[w.base + e];
    const int valid = min(p.pageSize, w.len - block * p.pageSize);
    if (valid <= 0)
      continue;
    const int page = checkedIndex("latent attention: pages entry",
                                  p.pages[w.base + e], p.numPages);
    const __nv_bfloat16 *rows = p.pool + size_t(page) * p.pageSize * p.dk;
    f.eM = -INFINITY;
    f.eS = 0.0f;
    for (int t0 = 0; t0 < valid; t0 += kTokens) {
      const int n = min(kTokens, valid - t0);
      __syncthreads(); // the previous tile is consumed (and the queries in)
      loadTile(p, sm, rows, t0, n);
      __syncthreads();
      float corr;
      sm.p[hl * kTokens + j] =
          softmaxStep(logitOf(p, sm, hl, j, live, n), f, corr);
      if (j == 0)
        sm.corr[hl] = corr;
      __syncthreads();
      accumulate(p, sm, hl, j, n, acc);
    }
    // Every attended entry's log2-sum-exp (finish and the merge turn each
    // into its share).
    if (p.mass && live && j == 0)
      p.mass[(size_t(w.b) * p.massStride + block) * p.heads + h] =
          f.eS > 0.0f ? f.eM + __log2f(f.eS) : -INFINITY;
  }
  if (live)
    finish(p, w, row, split, h, j, f, acc);
}

/// The splits' (max, sum) of (row, head) merged.
__device__ float2 mergedML(const LatentParams &p, int rows, int row, int h) {
  const float2 *ml = reinterpret_cast<const float2 *>(p.partML);
  float top = -INFINITY, sum = 0.0f;
  // Unrolled: the loads do not wait on the sums (a profile had 64 splits'
  // dependent L2 round trips at about 33 us a merge).
#pragma unroll 8
  for (int s = 0; s < p.numSplits; ++s) {
    const float2 x = ml[(size_t(s) * rows + row) * p.heads + h];
    if (x.x == -INFINITY)
      continue;
    const float t = fmaxf(top, x.x);
    sum = sum * (top == -INFINITY ? 0.0f : ex2(top - t)) + x.y * ex2(x.x - t);
    top = t;
  }
  return make_float2(top, sum);
}

/// Output elements [blockIdx.y * 256, +256) of row blockIdx.x from the
/// splits' partials; then the row's mass shares.
__global__ void __launch_bounds__(kMergeThreads)
    latentMergeKernel(const LatentParams p) {
  const int row = blockIdx.x, rows = gridDim.x;
  const float2 *ml = reinterpret_cast<const float2 *>(p.partML);
  const int idx = blockIdx.y * kMergeThreads + threadIdx.x;
  if (idx < p.heads * p.dv) {
    const int h = idx / p.dv;
    const float2 fin = mergedML(p, rows, row, h);
    float o = 0.0f;
    if (fin.y > 0.0f)
#pragma unroll 8
      for (int s = 0; s < p.numSplits; ++s) {
        const size_t at = (size_t(s) * rows + row) * p.heads + h;
        const float ms = ml[at].x;
        if (ms != -INFINITY)
          o +=
              ex2(ms - fin.x) / fin.y * p.partAcc[at * p.dv + (idx - h * p.dv)];
      }
    p.out[size_t(row) * p.heads * p.dv + idx] = __float2bfloat16_rn(o);
  }
  if (!p.mass)
    return;
  const int base = p.indptr[row];
  const int count = min(p.count ? p.count[row] : p.indptr[row + 1] - base,
                        p.numSplits * p.entriesPerSplit);
  const int len = p.seqLen[row];
  // Each head's log2-sum-exp once (256 heads at a time), not once an entry.
  __shared__ float lse[kMergeThreads];
  for (int h0 = 0; h0 < p.heads; h0 += kMergeThreads) {
    const int hn = min(kMergeThreads, p.heads - h0);
    __syncthreads(); // the previous heads' readers are done
    if (int(threadIdx.x) < hn) {
      const float2 fin = mergedML(p, rows, row, h0 + threadIdx.x);
      lse[threadIdx.x] = fin.y > 0.0f ? fin.x + __log2f(fin.y) : INFINITY;
    }
    __syncthreads();
    for (int k = blockIdx.y * kMergeThreads + threadIdx.x; k < count * hn;
         k += gridDim.y * kMergeThreads) {
      const int e = k / hn, hl = k - e * hn;
      const int block = p.blocks[base + e];
      if (block * p.pageSize >= len || lse[hl] == INFINITY)
        continue; // past the sequence, or a head with no mass
      float *share =
          p.mass + (size_t(row) * p.massStride + block) * p.heads + h0 + hl;
      *share = ex2(*share - lse[hl]);
    }
  }
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

size_t sharedBytes(int dk) {
  return size_t(kHeads + kTokens) * tileStride(dk) * 4 +
         size_t(kHeads * kTokens + kHeads) * 4;
}

void checkLatent(const char *op, const PagedKVArgs &a) {
  require(a.kvType == KVType::BF16, op,
          "a latent cache (valueDim set) is bf16, got " +
              std::string(kvTypeName(a.kvType)));
  require(a.numKVHeads == 1, op,
          "a latent cache has one KV head, got numKVHeads " +
              std::to_string(a.numKVHeads));
  require(a.headDim % 2 == 0 && a.headDim >= 2 &&
              a.headDim <= kLatentMaxHeadDim,
          op,
          "a latent row's headDim must be even and at most " +
              std::to_string(kLatentMaxHeadDim) + ", got " +
              std::to_string(a.headDim));
  require(a.valueDim % 2 == 0 && a.valueDim > 0 && a.valueDim <= a.headDim &&
              a.valueDim <= kLatentMaxValueDim,
          op,
          "valueDim must be even, at most headDim and at most " +
              std::to_string(kLatentMaxValueDim) + ", got " +
              std::to_string(a.valueDim));
  require(a.window == 0, op, "a latent cache has no sliding window");
  require(a.group <= kHeads * 65535, op,
          "group must be at most " + std::to_string(kHeads * 65535));
  require(a.batch > 0 && a.group > 0 && a.pageSize > 0 && a.numPages > 0, op,
          "batch, group, pageSize and numPages must be positive");
  require(a.kPool && a.q && a.out, op, "kPool, q and out must not be null");
  require(aligned(a.kPool, 16) && aligned(a.q, 4) && aligned(a.out, 4), op,
          "kPool must be 16-byte aligned, q and out 4-byte aligned");
  require(std::isfinite(a.scale), op, "the softmax scale must be finite");
}

LatentParams latentParams(const PagedKVArgs &a) {
  LatentParams p{};
  p.pool = static_cast<const __nv_bfloat16 *>(a.kPool);
  p.q = static_cast<const __nv_bfloat16 *>(a.q);
  p.out = static_cast<__nv_bfloat16 *>(a.out);
  p.heads = a.group;
  p.dk = a.headDim;
  p.dv = a.valueDim;
  p.pageSize = a.pageSize;
  p.numPages = a.numPages;
  p.scaleLog2 = a.scale * kLog2e;
  p.batch = a.batch;
  p.numSplits = 1;
  return p;
}

void launchLatent(const LatentParams &p, dim3 grid, cudaStream_t stream,
                  const char *op) {
  // Tensor cores where rows copy in 16-byte pieces (LatentMma.cu); values
  // up to 512 wide (DeepSeek's c_kv) keep half the accumulators.
  if (p.dk % 8 == 0)
    return launchMma(p, grid, stream, op);
  const size_t bytes = sharedBytes(p.dk);
  if (p.dv <= 512)
    launchKernel(latentKernel<16>, p, grid, kThreads, bytes, stream, op);
  else
    launchKernel(latentKernel<32>, p, grid, kThreads, bytes, stream, op);
}

} // namespace

int latentDecodeSplits(int batch, int group, int maxEntries) {
  if (maxEntries <= 0 || batch <= 0 || group <= 0)
    return 1;
  // About two CTAs per multiprocessor, each with at least
  // kMinEntriesPerSplit entries.
  const int64_t ctas = int64_t(batch) * ceilDiv(group, kHeads);
  const int64_t want = ceilDiv(2 * int64_t(currentDeviceSMs()), ctas);
  const int64_t most =
      std::min<int64_t>(ceilDiv(maxEntries, kMinEntriesPerSplit), 65535);
  const int64_t splits = std::max<int64_t>(1, std::min(want, most));
  // The fewest splits that give the same entries per split.
  return int(ceilDiv(maxEntries, ceilDiv(maxEntries, splits)));
}

size_t latentDecodeWorkspaceBytes(int batch, int group, int valueDim,
                                  int maxEntries) {
  // Enough for a step of any maxEntries up to this one: the split count
  // before latentDecodeSplits' rounding, which never decreases with the
  // entries (the rounded one may).
  if (maxEntries <= 0 || batch <= 0 || group <= 0)
    return 0;
  const int64_t ctas = int64_t(batch) * ceilDiv(group, kHeads);
  const int64_t want = ceilDiv(2 * int64_t(currentDeviceSMs()), ctas);
  const int splits = int(std::max<int64_t>(
      1, std::min({want, ceilDiv(maxEntries, kMinEntriesPerSplit),
                   int64_t(65535)})));
  if (splits <= 1)
    return 0;
  const size_t cells = size_t(splits) * batch * group;
  return (cells * valueDim * 4 + 15) / 16 * 16 + cells * 2 * 4;
}

void latentDecodeAttention(const PagedAttentionArgs &a, cudaStream_t stream) {
  const char *op = "pagedDecodeAttention (latent)";
  checkLatent(op, a);
  require(a.indptr && a.pages && a.blocks && a.seqLen, op,
          "indptr, pages, blocks and seqLen must not be null");
  require(a.maxEntries >= 0, op, "maxEntries must not be negative");
  require(!a.mass || a.massStride > 0, op,
          "massStride must be positive when mass is given");
  require(!a.mass || aligned(a.mass, 4), op, "mass must be 4-byte aligned");
  require(a.batch <= 65535, op, "batch must be at most 65535");
  LatentParams p = latentParams(a);
  p.indptr = a.indptr;
  p.count = a.count;
  p.pages = a.pages;
  p.blocks = a.blocks;
  p.seqLen = a.seqLen;
  p.mass = a.mass;
  p.massStride = a.massStride;
  const int splits = latentDecodeSplits(a.batch, a.group, a.maxEntries);
  p.numSplits = splits;
  p.entriesPerSplit = int(ceilDiv(std::max(a.maxEntries, 0), splits));
  if (splits > 1) {
    const size_t need =
        latentDecodeWorkspaceBytes(a.batch, a.group, a.valueDim, a.maxEntries);
    require(a.workspace && a.workspaceBytes >= need && aligned(a.workspace, 16),
            op,
            "the workspace must hold " + std::to_string(need) +
                " bytes, 16-byte aligned (pagedDecodeWorkspaceBytes)");
    const size_t cells = size_t(splits) * a.batch * a.group;
    auto *bytes = static_cast<unsigned char *>(a.workspace);
    p.partAcc = reinterpret_cast<float *>(bytes);
    p.partML = reinterpret_cast<float *>(bytes + (cells * a.valueDim * 4 + 15) /
                                                     16 * 16);
  }
  launchLatent(p, dim3(splits, a.batch, unsigned(ceilDiv(a.group, kHeads))),
               stream, op);
  if (splits > 1) {
    latentMergeKernel<<<dim3(a.batch,
                             unsigned(ceilDiv(int64_t(a.group) * a.valueDim,
                                              kMergeThreads))),
                        kMergeThreads, 0, stream>>>(p);
    checkCuda(cudaGetLastError(), op);
  }
}

void latentPrefillAttention(const PrefillAttentionArgs &a,
                            cudaStream_t stream) {
  const char *op = "prefillAttention (latent)";
  checkLatent(op, a);
  require(a.qIndptr && a.seqLen && a.indptr && a.pages, op,
          "qIndptr, seqLen, indptr and pages must not be null");
  require(a.totalTokens >= 0, op,
          "totalTokens must not be negative, got " +
              std::to_string(a.totalTokens));
  if (a.totalTokens == 0)
    return;
  LatentParams p = latentParams(a);
  p.qIndptr = a.qIndptr;
  p.seqLen = a.seqLen;
  p.indptr = a.indptr;
  p.pages = a.pages;
  launchLatent(
      p, dim3(unsigned(a.totalTokens), 1, unsigned(ceilDiv(a.group, kHeads))),
      stream, op);
}

} // namespace vflow::rt::cuda::detail
