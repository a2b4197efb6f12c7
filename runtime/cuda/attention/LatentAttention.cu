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
// one split of its entries. latentMmaKernel (rows of a multiple of 8 dims)
// runs each 32-token tile as two small GEMMs on tensor cores; latentKernel,
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

#include "AttentionCommon.h"
#include "DeviceHelpers.cuh"
#include "LatentAttention.h"

#include "vflow/Runtime/cuda/IndexCheck.cuh"

#include <cuda_bf16.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

namespace vflow::rt::cuda::detail {
namespace {

constexpr int kHeads = 16;  ///< query heads of a CTA
constexpr int kTokens = 16; ///< tokens of a tile
constexpr int kThreads = kHeads * kTokens;
constexpr int kMergeThreads = 256;
/// The fewest entries a decode split takes while a row has more.
constexpr int kMinEntriesPerSplit = 4;

struct LatentParams {
  const __nv_bfloat16 *pool; ///< [numPages, pageSize, dk]
  const __nv_bfloat16 *q;    ///< [rows, heads, dk]
  __nv_bfloat16 *out;        ///< [rows, heads, dv]
  int heads, dk, dv, pageSize, numPages;
  float scaleLog2;
  const int32_t *indptr, *count, *pages, *blocks, *seqLen;
  /// Prefill: q rows of sequence b are [qIndptr[b], qIndptr[b + 1]);
  /// null in decode (row b is sequence b's one row).
  const int32_t *qIndptr;
  int batch;
  int entriesPerSplit, numSplits;
  float *mass;
  int massStride;
  float *partAcc; ///< [splits, rows, heads, dv]
  float *partML;  ///< [splits, rows, heads, 2]
};

/// Words (bf16 pairs) between rows of a tile in shared memory: odd, so the
/// 16 rows of one column fall in 16 different banks.
__host__ __device__ inline int tileStride(int dk) { return dk / 2 | 1; }

__device__ __forceinline__ float2 pair(const __nv_bfloat162 *p) {
  return __bfloat1622float2(*p);
}

/// What a CTA attends: for row `row` (its sequence `b`), entries [first,
/// last) of its list, each `pages[base + e]` holding logical block
/// `blocks`-or-e, with `len` tokens in the sequence as this row sees it.
struct Work {
  int b, base, first, last, len;
  bool dense; ///< prefill: entry e is logical block e
};

__device__ Work workOf(const LatentParams &p, int row, int split) {
  Work w;
  if (p.qIndptr) {
    // The row's sequence: the last b with qIndptr[b] <= row.
    int lo = 0, hi = p.batch;
    while (lo + 1 < hi) {
      const int mid = (lo + hi) / 2;
      if (p.qIndptr[mid] <= row)
        lo = mid;
      else
        hi = mid;
    }
    w.b = lo;
    const int rows = p.qIndptr[lo + 1] - p.qIndptr[lo];
    // A sequence shorter than its new rows breaks the contract: zeros.
    w.len = p.seqLen[lo] < rows
                ? 0
                : p.seqLen[lo] - rows + (row - p.qIndptr[lo]) + 1;
    w.base = p.indptr[lo];
    w.first = 0;
    w.last = w.len > 0 ? (w.len + p.pageSize - 1) / p.pageSize : 0;
    w.dense = true;
    return w;
  }
  w.b = row;
  w.len = p.seqLen[row];
  w.base = p.indptr[row];
  const int2 share =
      splitShare(p.count ? p.count[row] : p.indptr[row + 1] - w.base,
                 p.numSplits, p.entriesPerSplit, kMinEntriesPerSplit, split);
  w.first = share.x;
  w.last = share.y;
  w.dense = false;
  return w;
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

/// Head h's entries' log2-sum-exps (written by this thread) turned into
/// their shares of the head's mass (max m, sum l; one split).
__device__ void massShares(const LatentParams &p, const Work &w, int h, float m,
                           float l) {
  if (!p.mass || l <= 0.0f)
    return;
  const float lse = m + __log2f(l);
  for (int e = w.first; e < w.last; ++e) {
    const int block = w.dense ? e : p.blocks[w.base + e];
    if (block * p.pageSize >= w.len)
      continue;
    float *share = p.mass + (size_t(w.b) * p.massStride + block) * p.heads + h;
    *share = ex2(*share - lse);
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

// ---- Tensor cores (mma.sync m16n8k16, bf16 operands, f32 accumulators) ----
//
// The same work as latentKernel (a CTA: 16 query heads of one row, one split
// of its entries), as two small GEMMs a tile: 4 warps take a tile of 32
// tokens (packed from consecutive entries, cp.async double-buffered), S =
// Q K^T [16 x 32] (a warp's quarter of the row's dims for all 32 tokens,
// the partials summed by the softmax), the online softmax with each entry's
// log2-sum-exp (mass), then O += P V [16 x dv] (a warp's 16-column groups,
// V read from the same tile with ldmatrix.trans); three barriers a tile.
// Rows need dk % 8 == 0 (16-byte copies); latentKernel takes the rest.

constexpr int kMmaTokens = 32;
constexpr int kMmaWarps = 4;
constexpr int kMmaThreads = 32 * kMmaWarps;
constexpr int kMmaParts = kMmaThreads / kHeads; ///< threads of a head
constexpr int kMmaSlotsPerPart = kMmaTokens / kMmaParts;
constexpr int kMmaMaxSegments = 4;
constexpr int kPStride = kMmaTokens + 8; ///< P's row stride (bf16)
constexpr int kSStride = kMmaTokens + 1; ///< S's row stride (f32)

/// Tokens [row, row + count) of the pool fill slots [slot, slot + count)
/// of a tile; `entry` is theirs.
struct Segment {
  int entry, slot, count;
  long long row;
};

/// The bf16 row stride of the tiles: the row rounded up to whole k-steps,
/// plus 8 so that 8 rows' 16-byte pieces fall in different banks.
__host__ __device__ inline int mmaStride(int dk) {
  return (dk + 15) / 16 * 16 + 8;
}

struct MmaSmem {
  __nv_bfloat16 *q, *k0, *p; ///< [16][ld], 2 x [32][ld], [16][kPStride]
  float *s, *corr, *m, *l;   ///< [4 warps][16][kSStride], [16] x 3
  int *slots;                ///< 2 x [32]: each slot's entry, or -1
  int *segs;                 ///< 2 x [4] x (first slot, count, entry)
  int ld;
  /// Buffer `buf`'s tile and slot entries (no arrays indexed by `buf`: the
  /// struct stays in registers).
  __device__ __nv_bfloat16 *k(int buf) const {
    return k0 + buf * kMmaTokens * ld;
  }
  __device__ int *slotEntry(int buf) const { return slots + buf * kMmaTokens; }
  __device__ int *segments(int buf) const {
    return segs + buf * 3 * kMmaMaxSegments;
  }
};

__host__ __device__ inline size_t mmaSharedBytes(int dk) {
  const int ld = mmaStride(dk);
  return size_t((kHeads + 2 * kMmaTokens) * ld + kHeads * kPStride) * 2 +
         size_t(kMmaWarps * kHeads * kSStride + 3 * kHeads + 2 * kMmaTokens +
                6 * kMmaMaxSegments) *
             4;
}

__device__ __forceinline__ MmaSmem mmaSmem(unsigned char *base, int dk) {
  MmaSmem sm;
  sm.ld = mmaStride(dk);
  auto *h = reinterpret_cast<__nv_bfloat16 *>(base);
  sm.q = h;
  sm.k0 = sm.q + kHeads * sm.ld;
  sm.p = sm.k0 + 2 * kMmaTokens * sm.ld;
  auto *f = reinterpret_cast<float *>(sm.p + kHeads * kPStride);
  sm.s = f;
  sm.corr = sm.s + kMmaWarps * kHeads * kSStride;
  sm.m = sm.corr + kHeads;
  sm.l = sm.m + kHeads;
  sm.slots = reinterpret_cast<int *>(sm.l + kHeads);
  sm.segs = sm.slots + 2 * kMmaTokens;
  return sm;
}

/// The next tile from the cursor (entry e, token o of it): up to 32 tokens
/// of consecutive entries (an entry without tokens skipped). Returns the
/// segments' count; every thread computes the same.
__device__ __forceinline__ int nextTile(const LatentParams &p, const Work &w,
                                        int &e, int &o,
                                        Segment (&seg)[kMmaMaxSegments]) {
  int n = 0, slot = 0;
#pragma unroll
  for (int k = 0; k < kMmaMaxSegments; ++k) { // unrolled: seg in registers
    seg[k] = {-1, 0, 0, 0};
    int valid = 0;
    while (slot < kMmaTokens && e < w.last) {
      const int block = w.dense ? e : p.blocks[w.base + e];
      valid = min(p.pageSize, w.len - block * p.pageSize);
      if (valid > o)
        break;
      ++e;
      o = 0;
    }
    if (slot >= kMmaTokens || e >= w.last)
      continue;
    const int page = checkedIndex("latent attention: pages entry",
                                  p.pages[w.base + e], p.numPages);
    const int count = min(valid - o, kMmaTokens - slot);
    seg[k] = {e, slot, count, (long long)page * p.pageSize + o};
    slot += count;
    o += count;
    n = k + 1;
  }
  return n;
}

/// Starts copying the tile `seg` into buffer `buf` (slots without a token
/// zero-filled) and records each slot's entry.
__device__ __forceinline__ void
loadMmaTile(const LatentParams &p, const MmaSmem &sm, int buf,
            const Segment (&seg)[kMmaMaxSegments], int n) {
  const int pieces = p.dk / 8;
  for (int i = threadIdx.x; i < kMmaTokens * pieces; i += kMmaThreads) {
    const int slot = i / pieces, c = i - slot * pieces;
    const __nv_bfloat16 *src = p.pool;
    uint32_t bytes = 0;
#pragma unroll
    for (int k = 0; k < kMmaMaxSegments; ++k)
      if (k < n && slot >= seg[k].slot && slot < seg[k].slot + seg[k].count) {
        src = p.pool + (seg[k].row + slot - seg[k].slot) * p.dk + c * 8;
        bytes = 16;
      }
    cpAsync16(smemAddress(sm.k(buf) + slot * sm.ld + c * 8), src, bytes);
  }
  if (threadIdx.x < kMmaTokens) {
    int entry = -1;
#pragma unroll
    for (int k = 0; k < kMmaMaxSegments; ++k)
      if (k < n && int(threadIdx.x) >= seg[k].slot &&
          int(threadIdx.x) < seg[k].slot + seg[k].count)
        entry = seg[k].entry;
    sm.slotEntry(buf)[threadIdx.x] = entry;
  }
  if (threadIdx.x < kMmaMaxSegments) { // the mass epilogue's segments
    int *out = sm.segments(buf) + 3 * threadIdx.x;
    out[0] = out[1] = 0;
    out[2] = -1;
#pragma unroll
    for (int k = 0; k < kMmaMaxSegments; ++k)
      if (k == int(threadIdx.x) && k < n) {
        out[0] = seg[k].slot;
        out[1] = seg[k].count;
        out[2] = seg[k].entry;
      }
  }
}

/// The CTA's queries (heads past the model's zeros) and the tiles' padding
/// columns (zeros, never copied over).
__device__ __forceinline__ void
initMmaSmem(const LatentParams &p, const MmaSmem &sm, int row, int h0) {
  const int pairs = sm.ld / 2;
  for (int i = threadIdx.x; i < kHeads * pairs; i += kMmaThreads) {
    const int qh = i / pairs, c = i - qh * pairs;
    __nv_bfloat162 v = __floats2bfloat162_rn(0.0f, 0.0f);
    if (h0 + qh < p.heads && 2 * c < p.dk)
      v = reinterpret_cast<const __nv_bfloat162 *>(
          p.q + (size_t(row) * p.heads + h0 + qh) * p.dk)[c];
    reinterpret_cast<__nv_bfloat162 *>(sm.q + qh * sm.ld)[c] = v;
  }
  const int pad = sm.ld - p.dk;
  for (int i = threadIdx.x; i < 2 * kMmaTokens * pad; i += kMmaThreads) {
    const int r = i / pad, c = p.dk + i % pad;
    sm.k(r / kMmaTokens)[(r % kMmaTokens) * sm.ld + c] =
        __float2bfloat16_rn(0.0f);
  }
}

/// Warp `warp`'s part of S = Q K^T, [16 heads x 32 slots], over its
/// quarter of the row's k-steps (4 independent accumulators; operands by
/// ldmatrix), into its partial of S in shared memory.
__device__ __forceinline__ void mmaLogits(const LatentParams &p,
                                          const MmaSmem &sm, int buf, int warp,
                                          int lane) {
  const int steps = (p.dk + 15) / 16;
  const int per = (steps + kMmaWarps - 1) / kMmaWarps;
  const int first = warp * per, last = min(steps, first + per);
  // Q: matrices (heads 0-7 | 8-15) x (k 0-7 | 8-15); a tile's 16 tokens:
  // (tokens 0-7 | 8-15) x (k 0-7 | 8-15), the second 16 tokens below.
  const int mi = lane / 8;
  const uint32_t qAt =
      smemAddress(sm.q + (lane % 16) * sm.ld + (lane / 16) * 8);
  const uint32_t kAt = smemAddress(
      sm.k(buf) + ((mi >> 1) * 8 + lane % 8) * sm.ld + (mi & 1) * 8);
  const uint32_t second = 16 * sm.ld * 2; // bytes to tokens 16..31
  float acc[4][4] = {};
  for (int ks = first; ks < last; ++ks) {
    uint32_t a[4], lo[4], hi[4];
    ldmatrix4(a, qAt + ks * 32); // 16 bf16 a k-step
    ldmatrix4(lo, kAt + ks * 32);
    ldmatrix4(hi, kAt + second + ks * 32);
    const uint32_t b0[2] = {lo[0], lo[1]}, b1[2] = {lo[2], lo[3]},
                   b2[2] = {hi[0], hi[1]}, b3[2] = {hi[2], hi[3]};
    mma16816<false>(acc[0], a, b0);
    mma16816<false>(acc[1], a, b1);
    mma16816<false>(acc[2], a, b2);
    mma16816<false>(acc[3], a, b3);
  }
  const int g = lane / 4, t = lane % 4;
  float *s = sm.s + warp * kHeads * kSStride + g * kSStride + 2 * t;
#pragma unroll
  for (int nt = 0; nt < 4; ++nt) {
    s[nt * 8] = acc[nt][0];
    s[nt * 8 + 1] = acc[nt][1];
    s[8 * kSStride + nt * 8] = acc[nt][2];
    s[8 * kSStride + nt * 8 + 1] = acc[nt][3];
  }
}

/// A head's open entry in the mass epilogue: its index (-1: none) and the
/// running max and sum of its logits.
struct OpenEntry {
  int e = -1;
  float m = -INFINITY, s = 0.0f;
};

/// Writes the open entry's log2-sum-exp for head h.
__device__ void closeEntry(const LatentParams &p, const Work &w, int h,
                           OpenEntry &o) {
  if (o.e < 0)
    return;
  const int block = w.dense ? o.e : p.blocks[w.base + o.e];
  p.mass[(size_t(w.b) * p.massStride + block) * p.heads + h] =
      o.s > 0.0f ? o.m + __log2f(o.s) : -INFINITY;
  o = OpenEntry();
}

/// The tile's logits of head hl into its entries' log2-sum-exps: each of
/// the tile's segments (one entry's tokens) reduced by the head's 8
/// threads, merged by its first (`leader`) into the open entry, which may
/// go on in the next tile. Every thread of the CTA calls it (the shuffles).
__device__ __forceinline__ void massOfTile(const LatentParams &p,
                                           const MmaSmem &sm, int buf,
                                           const Work &w, int hl, int h,
                                           bool leader, OpenEntry &o) {
  const int part = threadIdx.x % kMmaParts;
  for (int k = 0; k < kMmaMaxSegments; ++k) {
    const int *seg = sm.segments(buf) + 3 * k;
    const int first = seg[0], count = seg[1], entry = seg[2];
    if (count == 0)
      break; // the same for the whole CTA
    float x[kMmaSlotsPerPart], top = -INFINITY;
#pragma unroll
    for (int j = 0; j < kMmaSlotsPerPart; ++j) {
      const int slot = part * kMmaSlotsPerPart + j;
      x[j] = slot >= first && slot < first + count ? sm.s[hl * kSStride + slot]
                                                   : -INFINITY;
      top = fmaxf(top, x[j]);
    }
#pragma unroll
    for (int d = kMmaParts / 2; d > 0; d /= 2)
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, d));
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kMmaSlotsPerPart; ++j)
      sum += x[j] == -INFINITY ? 0.0f : ex2(x[j] - top);
#pragma unroll
    for (int d = kMmaParts / 2; d > 0; d /= 2)
      sum += __shfl_xor_sync(0xffffffffu, sum, d);
    if (!leader)
      continue;
    if (entry != o.e) {
      closeEntry(p, w, h, o);
      o.e = entry;
    }
    if (top == -INFINITY)
      continue;
    const float m = fmaxf(o.m, top);
    o.s = o.s * (o.m == -INFINITY ? 0.0f : ex2(o.m - m)) + sum * ex2(top - m);
    o.m = m;
  }
}

/// The online softmax of head tid / 8 over the tile (each of its 8 threads
/// 4 slots; the logits summed over the warps' partials, left in the first
/// partial): P (bf16) and the accumulators' correction in shared memory; m
/// and l stay in the head's threads.
__device__ __forceinline__ void mmaSoftmax(const LatentParams &p,
                                           const MmaSmem &sm, int buf, float &m,
                                           float &l) {
  const int hl = threadIdx.x / kMmaParts, part = threadIdx.x % kMmaParts;
  float x[kMmaSlotsPerPart];
  float top = -INFINITY;
#pragma unroll
  for (int j = 0; j < kMmaSlotsPerPart; ++j) {
    const int slot = part * kMmaSlotsPerPart + j;
    float *at = sm.s + hl * kSStride + slot;
    float dot = 0.0f;
#pragma unroll
    for (int w = 0; w < kMmaWarps; ++w)
      dot += at[w * kHeads * kSStride];
    x[j] = sm.slotEntry(buf)[slot] >= 0 ? dot * p.scaleLog2 : -INFINITY;
    *at = x[j]; // the logit, for the mass epilogue
    top = fmaxf(top, x[j]);
  }
#pragma unroll
  for (int o = kMmaParts / 2; o > 0; o /= 2)
    top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
  const float newM = fmaxf(m, top);
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < kMmaSlotsPerPart; ++j) {
    const __nv_bfloat16 pr =
        __float2bfloat16_rn(x[j] == -INFINITY ? 0.0f : ex2(x[j] - newM));
    sm.p[hl * kPStride + part * kMmaSlotsPerPart + j] = pr;
    sum += __bfloat162float(pr); // what P V multiplies
  }
#pragma unroll
  for (int o = kMmaParts / 2; o > 0; o /= 2)
    sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float corr = m == -INFINITY ? 0.0f : ex2(m - newM);
  l = l * corr + sum;
  m = newM;
  if (part == 0)
    sm.corr[hl] = corr;
}

/// O = O * corr + P V for warp `warp`'s column groups (16 columns each,
/// groups warp, warp + 4, ...).
template <int Groups>
__device__ __forceinline__ void
mmaValues(const LatentParams &p, const MmaSmem &sm, int buf, int warp, int lane,
          float (&acc)[Groups][2][4]) {
  const int g = lane / 4, t = lane % 4;
  const float c0 = sm.corr[g], c1 = sm.corr[g + 8];
#pragma unroll
  for (int j = 0; j < Groups; ++j)
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      acc[j][n][0] *= c0;
      acc[j][n][1] *= c0;
      acc[j][n][2] *= c1;
      acc[j][n][3] *= c1;
    }
  const int mi = lane / 8, r = lane % 8;
#pragma unroll
  for (int ks = 0; ks < kMmaTokens / 16; ++ks) {
    const __nv_bfloat16 *p0 = sm.p + g * kPStride + ks * 16 + 2 * t;
    const uint32_t a[4] = {
        *reinterpret_cast<const uint32_t *>(p0),
        *reinterpret_cast<const uint32_t *>(p0 + 8 * kPStride),
        *reinterpret_cast<const uint32_t *>(p0 + 8),
        *reinterpret_cast<const uint32_t *>(p0 + 8 * kPStride + 8)};
    const __nv_bfloat16 *v =
        sm.k(buf) + (ks * 16 + (mi & 1) * 8 + r) * sm.ld + (mi >> 1) * 8;
#pragma unroll
    for (int j = 0; j < Groups; ++j) {
      const int col = (warp + kMmaWarps * j) * 16;
      if (col < p.dv) {
        uint32_t b[4];
        ldmatrix4Trans(b, smemAddress(v + col));
        const uint32_t lo[2] = {b[0], b[1]}, hi[2] = {b[2], b[3]};
        mma16816<false>(acc[j][0], a, lo);
        mma16816<false>(acc[j][1], a, hi);
      }
    }
  }
}

/// Head rows g and g + 8's results of warp `warp`'s column groups: the
/// split's partials, or the output (m, l: the heads' softmax, in smem).
template <int Groups>
__device__ __forceinline__ void
mmaFinish(const LatentParams &p, const MmaSmem &sm, int row, int split, int h0,
          int warp, int lane, const float (&acc)[Groups][2][4]) {
  const int g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int hl = g + 8 * half, h = h0 + hl;
    if (h >= p.heads)
      continue;
    const float l = sm.l[hl], inv = l > 0.0f ? 1.0f / l : 0.0f;
    const size_t at = (size_t(split) * gridDim.y + row) * p.heads + h;
#pragma unroll
    for (int j = 0; j < Groups; ++j)
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const int d = (warp + kMmaWarps * j) * 16 + n * 8 + 2 * t;
        if (d >= p.dv)
          continue;
        const float x = acc[j][n][2 * half], y = acc[j][n][2 * half + 1];
        if (p.numSplits > 1)
          *reinterpret_cast<float2 *>(p.partAcc + at * p.dv + d) =
              make_float2(x, y);
        else
          *reinterpret_cast<__nv_bfloat162 *>(
              p.out + (size_t(row) * p.heads + h) * p.dv + d) =
              __floats2bfloat162_rn(x * inv, y * inv);
      }
    if (p.numSplits > 1 && warp == 0 && t == 0)
      reinterpret_cast<float2 *>(p.partML)[at] = make_float2(sm.m[hl], l);
  }
}

/// latentKernel on tensor cores: grid and results the same; Groups 16-column
/// groups of the values a warp (values up to 64 Groups wide).
template <int Groups>
__global__ void __launch_bounds__(kMmaThreads)
    latentMmaKernel(const LatentParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  const MmaSmem sm = mmaSmem(smem, p.dk);
  const bool prefill = p.qIndptr != nullptr;
  const int row = prefill ? blockIdx.x : blockIdx.y;
  const int split = prefill ? 0 : blockIdx.x, h0 = blockIdx.z * kHeads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hl = threadIdx.x / kMmaParts, h = h0 + hl;
  const bool leader = threadIdx.x % kMmaParts == 0 && h < p.heads;
  const Work w = workOf(p, row, split);
  initMmaSmem(p, sm, row, h0);
  float acc[Groups][2][4] = {};
  float m = -INFINITY, l = 0.0f;
  OpenEntry open;
  int e = w.first, o = 0;
  Segment seg[kMmaMaxSegments];
  int n = nextTile(p, w, e, o, seg);
  if (n > 0)
    loadMmaTile(p, sm, 0, seg, n);
  cpAsyncCommit();
  for (int buf = 0; n > 0; buf ^= 1) {
    cpAsyncWait<0>();
    // This tile is in; the other buffer's last reader (the previous tile's
    // P V) is done, so the next tile's copies go there while this one runs.
    __syncthreads();
    n = nextTile(p, w, e, o, seg);
    if (n > 0)
      loadMmaTile(p, sm, buf ^ 1, seg, n);
    cpAsyncCommit();
    mmaLogits(p, sm, buf, warp, lane);
    __syncthreads();
    mmaSoftmax(p, sm, buf, m, l);
    __syncwarp(); // a head's 8 threads share a warp: its logits are in
    if (p.mass)
      massOfTile(p, sm, buf, w, hl, h, leader, open);
    __syncthreads();
    mmaValues(p, sm, buf, warp, lane, acc);
  }
  if (threadIdx.x % kMmaParts == 0) {
    sm.m[hl] = m;
    sm.l[hl] = l;
  }
  if (p.mass && leader) {
    closeEntry(p, w, h, open);
    if (p.numSplits == 1)
      massShares(p, w, h, m, l);
  }
  __syncthreads();
  mmaFinish(p, sm, row, split, h0, warp, lane, acc);
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

/// Sets a kernel's dynamic shared memory past the default when it needs
/// more, then launches it.
template <class Kernel>
void launchKernel(Kernel kernel, const LatentParams &p, dim3 grid, int threads,
                  size_t bytes, cudaStream_t stream, const char *op) {
  if (bytes > 48 * 1024)
    checkCuda(cudaFuncSetAttribute(kernel,
                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   int(bytes)),
              op);
  kernel<<<grid, threads, bytes, stream>>>(p);
  checkCuda(cudaGetLastError(), op);
}

void launchLatent(const LatentParams &p, dim3 grid, cudaStream_t stream,
                  const char *op) {
  // Tensor cores where rows copy in 16-byte pieces; values up to 512 wide
  // (DeepSeek's c_kv) keep half the accumulators.
  if (p.dk % 8 == 0) {
    const size_t bytes = mmaSharedBytes(p.dk);
    if (p.dv <= 512)
      launchKernel(latentMmaKernel<8>, p, grid, kMmaThreads, bytes, stream, op);
    else
      launchKernel(latentMmaKernel<16>, p, grid, kMmaThreads, bytes, stream,
                   op);
    return;
  }
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
