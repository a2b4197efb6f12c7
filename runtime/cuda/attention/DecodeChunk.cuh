//===- DecodeChunk.cuh - One chunk of the paged decode kernel ---*- C++ -*-===//
//
// What pagedDecodeKernel (PagedDecode.cu, the only includer) does with one
// 16-token chunk of a block list, and what it needs to do it: its
// parameters and compile-time geometry, the chunk iterator, the query's
// fragments, S^T = K Q^T and O^T += V^T P^T on tensor cores (16-bit and
// 8-bit layouts), the online softmax, the token scales of 8-bit pools and
// the mass epilogue's per-entry log-sum-exp. The CTA's merge, the merge
// kernel and the host planner stay in PagedDecode.cu.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_CUDA_ATTENTION_DECODECHUNK_CUH
#define VFLOW_RUNTIME_CUDA_ATTENTION_DECODECHUNK_CUH

#include "AttentionCommon.h"
#include "DeviceHelpers.cuh"

#include <cmath>
#include <cstdint>

namespace vflow::rt::cuda::detail {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
/// Entries of one CTA: its metadata is staged in shared memory.
constexpr int kMaxEntriesPerCTA = 256;
/// Fewer entries per CTA would leave each warp too little to stream.
constexpr int kMinEntriesPerCTA = 8;
constexpr int kMaxGroup = 16;

struct DecodeParams : KVParams {
  const int32_t *indptr;
  const int32_t *count;
  const int32_t *pages;
  const int32_t *blocks;
  const int32_t *seqLen;
  bool listsPerSequence;
  int entriesPerSplit;
  int numSplits;
  float *mass;
  int massStride;
  float *partAcc; ///< [numSplits, rows, group, headDim]; null with 1 split
  float *partML;  ///< [numSplits, rows, group, 2] (max, sum)
};

template <KVType T> struct KVTraits {
  static constexpr int bytes =
      T == KVType::FP8E4M3 || T == KVType::INT8 ? 1 : 2;
  /// 8-bit pools: fp8 or int8 (their fragments share one layout).
  static constexpr bool byte = bytes == 1;
  /// f16 mma for f16 and 8-bit pools (widened to f16), bf16 mma for bf16.
  static constexpr bool half = T != KVType::BF16;
};

/// The kernel's compile-time geometry.
template <int D, KVType T, int NT> struct Geometry {
  static constexpr int bytes = KVTraits<T>::bytes;
  static constexpr int units = D * bytes / 16;      ///< 16-byte units of a row
  static constexpr int kSteps = D / 16;             ///< QK k-steps = PV m-tiles
  static constexpr int chunkBytes = 16 * D * bytes; ///< one K or V chunk
  static constexpr int stages = 2 * chunkBytes <= 4096 ? 4 : 3;
  /// A stage: the K chunk, the V chunk, then (8-bit pools) the chunk's 16
  /// K token scales and 16 V token scales.
  static constexpr int scaleBytes = KVTraits<T>::byte ? 2 * 16 * 4 : 0;
  static constexpr int stageBytes = 2 * chunkBytes + scaleBytes;
  static constexpr int cols = 8 * NT; ///< query-head columns (padded)
  static constexpr int ringBytes = kWarps * stages * stageBytes;
  static constexpr int epilogueBytes =
      (kWarps * cols * D + 3 * kWarps * cols + 2 * cols) * 4;
  static constexpr int scratchBytes =
      ringBytes > epilogueBytes ? ringBytes : epilogueBytes;
  static constexpr int metaBytes = 3 * kMaxEntriesPerCTA * 4;
  static constexpr int qFragBytes = kSteps * NT * 32 * 8;
  static constexpr int smemBytes = scratchBytes + metaBytes + qFragBytes;
};

/// Shared-memory position (in 16-byte units) of unit `u` of a chunk whose
/// rows hold `Units` units: XOR-swizzled within each 128-byte line so that
/// the 8 row addresses of one ldmatrix phase hit 8 different bank groups.
template <int Units> __device__ __forceinline__ int swizzle(int u) {
  constexpr int line = Units >= 8 ? Units : 8;
  return u ^ ((u / line) & 7);
}

/// The head-dim index of row m (0..15) of PV m-tile i: plain for 16-bit
/// types; for 8-bit ones a tile covers one 16-byte unit, even dims in rows
/// 0..7 and odd dims in rows 8..15 (see the 8-bit V fragments below).
template <KVType T> __device__ __forceinline__ int tileDim(int i, int m) {
  if constexpr (KVTraits<T>::byte)
    return 16 * i + (m < 8 ? 2 * m : 2 * m - 15);
  else
    return 16 * i + m;
}

/// Moves `it` (entry index into the CTA's entries, chunk index) to the next
/// chunk of this warp: chunks of an entry in order, then the warp's next
/// entry (stride kWarps) that has valid tokens.
struct ChunkIt {
  int entry;
  int chunk;
};

__device__ __forceinline__ void skipEmpty(ChunkIt &it, int n,
                                          const int *valid) {
  while (it.entry < n && valid[it.entry] <= 0)
    it.entry += kWarps;
}

__device__ __forceinline__ void advance(ChunkIt &it, int n, const int *valid) {
  if (++it.chunk * 16 < valid[it.entry])
    return;
  it.chunk = 0;
  it.entry += kWarps;
  skipEmpty(it, n, valid);
}

/// Q as mma B fragments (k = head dim, n = query head) in `qFrag`
/// ([kSteps][NT][32]): for 16-bit types lane (g, c) holds dims 16s + 2c +
/// {0, 1} and + 8; for 8-bit types the k order is permuted to match the K
/// fragments: dims 16s + 4c + {0, 1} and {2, 3}.
template <int D, KVType T, int NT>
__device__ __forceinline__ void stageQuery(const DecodeParams &p, int row,
                                           int groupSize, uint2 *qFrag) {
  using G = Geometry<D, T, NT>;
  constexpr bool kHalf = KVTraits<T>::half;
  constexpr bool kByte = KVTraits<T>::byte;
  const uint16_t *qRows = p.q + static_cast<size_t>(row) * groupSize * D;
  for (int idx = threadIdx.x; idx < G::kSteps * NT * 32; idx += kThreads) {
    const int l = idx & 31;
    const int nt = (idx >> 5) % NT;
    const int s = (idx >> 5) / NT;
    const int g = nt * 8 + (l >> 2);
    const int c = l & 3;
    uint2 frag = make_uint2(0, 0);
    if (g < groupSize) {
      const uint16_t *qRow = qRows + static_cast<size_t>(g) * D;
      const int d0 = kByte ? 16 * s + 4 * c : 16 * s + 2 * c;
      const int d1 = kByte ? d0 + 2 : d0 + 8;
      frag.x = *reinterpret_cast<const uint32_t *>(qRow + d0);
      frag.y = *reinterpret_cast<const uint32_t *>(qRow + d1);
      if constexpr (kHalf) {
        frag.x = bf16x2ToF16x2(frag.x);
        frag.y = bf16x2ToF16x2(frag.y);
      }
    }
    qFrag[idx] = frag;
  }
}

/// S^T = K Q^T for one chunk: rows are its 16 tokens, columns query heads.
template <int D, KVType T, int NT>
__device__ __forceinline__ void chunkScores(uint32_t kBase, const uint2 *qFrag,
                                            int lane, int kAddrRow, int mat,
                                            float (&score)[NT][4]) {
  using G = Geometry<D, T, NT>;
  constexpr bool kHalf = KVTraits<T>::half;
  constexpr bool kByte = KVTraits<T>::byte;
  constexpr int U = G::units;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int k = 0; k < 4; ++k)
      score[nt][k] = 0.0f;
#pragma unroll
  for (int x = 0; x < U / 2; ++x) {
    // Matrices: tokens 0-7 / 8-15 of units 2x and 2x + 1.
    uint32_t r[4];
    ldmatrix4(r, kBase + swizzle<U>(kAddrRow * U + 2 * x + (mat >> 1)) * 16);
    if constexpr (kByte) {
      // Unit u holds dims 16u..16u+15: one k-step, lane c's bytes 4c..4c+3
      // split into k = 2c + {0,1} and 2c + 8 + {0,1}.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a[4] = {bytePairToF16x2<T>(r[2 * h], 0x1404u),
                               bytePairToF16x2<T>(r[2 * h + 1], 0x1404u),
                               bytePairToF16x2<T>(r[2 * h], 0x3424u),
                               bytePairToF16x2<T>(r[2 * h + 1], 0x3424u)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const uint2 q = qFrag[((2 * x + h) * NT + nt) * 32 + lane];
          const uint32_t bq[2] = {q.x, q.y};
          mma16816<true>(score[nt], a, bq);
        }
      }
    } else {
      const uint32_t a[4] = {r[0], r[1], r[2], r[3]};
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint2 q = qFrag[(x * NT + nt) * 32 + lane];
        const uint32_t bq[2] = {q.x, q.y};
        mma16816<kHalf>(score[nt], a, bq);
      }
    }
  }
}

/// The online softmax over one chunk, per column (query head):
/// score[nt][k] sits at token fragRow + 8 * (k >> 1), column 8 nt + 2 c +
/// (k & 1). Tokens before `first` (a sliding window's start: a chunk may
/// hold none of its tokens, its max stays -infinity and nothing moves) or
/// past `valid` are masked, the others scaled by
/// scoreFactor and their token's K scale (`tokenK`: tokens fragRow and
/// fragRow + 8); the scores become the chunk's probabilities
/// (unnormalized), the running max and sum move, and `acc` is rescaled by
/// `alpha` times `accFactor`.
template <int D, KVType T, int NT>
__device__ __forceinline__ void
softmaxStep(float (&score)[NT][4], int first, int valid, int fragRow,
            float scoreFactor, const float (&tokenK)[2], float accFactor,
            float (&runMax)[NT][2], float (&runSum)[NT][2],
            float (&acc)[Geometry<D, T, NT>::kSteps][NT][4],
            float (&alpha)[NT][2]) {
  using G = Geometry<D, T, NT>;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int k = 0; k < 4; ++k)
      score[nt][k] =
          fragRow + 8 * (k >> 1) < valid && fragRow + 8 * (k >> 1) >= first
              ? score[nt][k] * (scoreFactor * tokenK[k >> 1])
              : -INFINITY;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float top = fmaxf(score[nt][j], score[nt][j + 2]);
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 4));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 8));
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 16));
      const float newMax = fmaxf(runMax[nt][j], top);
      // Nothing attended yet (a window's masked chunk): no NaN from
      // -infinity minus -infinity.
      const float base = newMax == -INFINITY ? 0.0f : newMax;
      alpha[nt][j] = ex2(runMax[nt][j] - base);
      runMax[nt][j] = newMax;
      score[nt][j] = ex2(score[nt][j] - base);
      score[nt][j + 2] = ex2(score[nt][j + 2] - base);
      runSum[nt][j] =
          runSum[nt][j] * alpha[nt][j] + score[nt][j] + score[nt][j + 2];
    }
#pragma unroll
    for (int i = 0; i < G::kSteps; ++i)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        acc[i][nt][k] *= alpha[nt][k & 1] * accFactor;
  }
}

/// The token scales of a chunk (`scales`: its 16 K scales, then 16 V
/// scales, zero past its valid tokens) for this lane's tokens fragRow and
/// fragRow + 8: K's as they are, V's relative to the chunk's largest, which
/// becomes `vUnit` (moveVUnit); returns the accumulator's factor.
__device__ __forceinline__ float chunkScales(const uint8_t *scaleBytes,
                                             int fragRow, float &vUnit,
                                             float (&tokenK)[2],
                                             float (&tokenV)[2]) {
  const float *scales = reinterpret_cast<const float *>(scaleBytes);
  tokenK[0] = scales[fragRow];
  tokenK[1] = scales[fragRow + 8];
  float top = fmaxf(scales[16 + fragRow], scales[24 + fragRow]);
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 4));
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 8));
  top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, 16));
  const float factor = moveVUnit(top, vUnit);
  const float inv = 1.0f / vUnit;
  tokenV[0] = scales[16 + fragRow] * inv;
  tokenV[1] = scales[24 + fragRow] * inv;
  return factor;
}

/// The attention mass of the chunk's entry (log2 of its share, relative to
/// the running max), written when its last chunk is done.
template <int NT>
__device__ __forceinline__ void
chunkMass(const DecodeParams &p, const ChunkIt &cur, const int *metaValid,
          const int *metaBlock, int row, int lane, int groupSize,
          const float (&score)[NT][4], const float (&alpha)[NT][2],
          const float (&runMax)[NT][2], float (&entrySum)[NT][2]) {
  const bool lastChunk = 16 * (cur.chunk + 1) >= metaValid[cur.entry];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float sum = score[nt][j] + score[nt][j + 2];
      sum += __shfl_xor_sync(0xffffffffu, sum, 4);
      sum += __shfl_xor_sync(0xffffffffu, sum, 8);
      sum += __shfl_xor_sync(0xffffffffu, sum, 16);
      entrySum[nt][j] =
          (cur.chunk == 0 ? 0.0f : entrySum[nt][j] * alpha[nt][j]) + sum;
      const int g = nt * 8 + 2 * lane + j;
      if (lastChunk && lane < 4 && g < groupSize)
        p.mass[(static_cast<size_t>(row) * p.massStride +
                metaBlock[cur.entry]) *
                   groupSize +
               g] = runMax[nt][j] + __log2f(entrySum[nt][j]);
    }
}

/// O^T += V^T P^T for one chunk: rows are head dims, columns query heads;
/// P^T is the B operand (k = token, n = query head): the score accumulators
/// of tokens 0-7 and 8-15 are 8x8 matrices (token, head), transposed into
/// the fragments. The probabilities of tokens fragRow and fragRow + 8 are
/// multiplied by `tokenV` on the way (their V scales, relative).
template <int D, KVType T, int NT>
__device__ __forceinline__ void
accumulatePV(uint32_t vBase, int mat, int vAddrRow, const float (&score)[NT][4],
             const float (&tokenV)[2],
             float (&acc)[Geometry<D, T, NT>::kSteps][NT][4]) {
  using G = Geometry<D, T, NT>;
  constexpr bool kHalf = KVTraits<T>::half;
  constexpr bool kByte = KVTraits<T>::byte;
  constexpr int U = G::units;
  uint32_t pFrag[NT][2];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    pFrag[nt][0] = movTrans(
        packPair<kHalf>(score[nt][0] * tokenV[0], score[nt][1] * tokenV[0]));
    pFrag[nt][1] = movTrans(
        packPair<kHalf>(score[nt][2] * tokenV[1], score[nt][3] * tokenV[1]));
  }
  if constexpr (kByte) {
#pragma unroll
    for (int x = 0; x < U / 2; ++x) {
      // Matrices: tokens 0-7 / 8-15 of units 2x and 2x + 1, transposed:
      // lane (r, c) gets tokens 2c, 2c + 1 of dims 16u + 2r + {0, 1}.
      uint32_t r[4];
      ldmatrix4Trans(r, vBase +
                            swizzle<U>(vAddrRow * U + 2 * x + (mat >> 1)) * 16);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t a[4] = {bytePairToF16x2<T>(r[2 * h], 0x2404u),
                               bytePairToF16x2<T>(r[2 * h], 0x3414u),
                               bytePairToF16x2<T>(r[2 * h + 1], 0x2404u),
                               bytePairToF16x2<T>(r[2 * h + 1], 0x3414u)};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          mma16816<true>(acc[2 * x + h][nt], a, pFrag[nt]);
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < G::kSteps; ++i) {
      // Matrices: dims 16i..+7 / 16i+8..+15 of tokens 0-7, then 8-15.
      uint32_t r[4];
      ldmatrix4Trans(r,
                     vBase + swizzle<U>(vAddrRow * U + 2 * i + (mat & 1)) * 16);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        mma16816<kHalf>(acc[i][nt], r, pFrag[nt]);
    }
  }
}

} // namespace vflow::rt::cuda::detail

#endif // VFLOW_RUNTIME_CUDA_ATTENTION_DECODECHUNK_CUH
