//===- LatentMma.cu - Latent (MLA) attention on tensor cores ----*- CUDA
//-*-===//
//
// The same work as LatentAttention.cu's latentKernel (a CTA: 16 query heads of
// one row, one split of its entries), as two small GEMMs a tile: 4 warps take a
// tile of 32 tokens (packed from consecutive entries, cp.async
// double-buffered), S = Q K^T [16 x 32] (a warp's quarter of the row's dims for
// all 32 tokens, the partials summed by the softmax), the online softmax with
// each entry's log2-sum-exp (mass), then O += P V [16 x dv] (a warp's 16-column
// groups, V read from the same tile with ldmatrix.trans); three barriers a
// tile. Rows need dk % 8 == 0 (16-byte copies); latentKernel takes the rest.
//
//===----------------------------------------------------------------------===//

#include "LatentKernels.cuh"

#include "vflow/Runtime/cuda/IndexCheck.cuh"

#include <cmath>

namespace vflow::rt::cuda::detail::latent {
namespace {

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

} // namespace

void launchMma(const LatentParams &p, dim3 grid, cudaStream_t stream,
               const char *op) {
  // Values up to 512 wide (DeepSeek's c_kv) keep half the accumulators.
  const size_t bytes = mmaSharedBytes(p.dk);
  if (p.dv <= 512)
    launchKernel(latentMmaKernel<8>, p, grid, kMmaThreads, bytes, stream, op);
  else
    launchKernel(latentMmaKernel<16>, p, grid, kMmaThreads, bytes, stream, op);
}

} // namespace vflow::rt::cuda::detail::latent
