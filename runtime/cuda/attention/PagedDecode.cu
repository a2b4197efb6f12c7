//===- PagedDecode.cu - Split-KV paged decode attention ---------*- C++ -*-===//
//
// One decode step of attention over block lists of a paged KV cache.
//
// Grid: (B * Hkv rows, numSplits). The CTA of (row, split) attends entries
// [split * per, +per) of its row's list, per = ceil(count / numSplits) and
// at least kMinEntriesPerCTA (the row's own count, at most numSplits *
// entriesPerSplit; splitShare), for all G query heads of the kv head, so
// each page is read once. Its 4 warps take
// the entries round-robin; each warp streams 16-token chunks of K and V
// through its own cp.async ring of shared-memory stages (zero-filled past the
// valid tokens) and keeps its own online softmax. Per chunk, tensor cores
// compute S^T = K Q^T (m16n8k16: tokens x heads) and O^T += V^T P^T (head dim
// x heads); P^T goes from the score accumulators to the operand layout with
// movmatrix. 8-bit K/V become f16 in registers (fp8 as value / 256, int8 as
// the code; the 256 and the per-head scale are folded into the score and
// output factors). Token scales (one per stored row) ride in each stage
// beside the chunk: a score is multiplied by its token's K scale, and a
// probability by its token's V scale over the chunk's largest V scale before
// the P V product (so it stays in [0, 1] in f16), the accumulator carried
// over in units of that largest scale. The warps
// merge through shared memory; with one split the CTA writes the output,
// otherwise (max, sum, unnormalized output) partials that mergeKernel
// (launched as a programmatic dependent, so it is set up while the attention
// grid runs) combines with log-sum-exp weights.
//
// numSplits (pagedDecodeSplits) comes from a model of the grid running in
// waves of resident CTAs (the occupancy API's count per multiprocessor): the
// least modelled time, at most 256 entries per CTA.
//
// Mass: each attended entry first stores its log2-domain log-sum-exp; the
// last kernel (the CTA itself with one split, else mergeKernel) turns it into
// the share exp2(lse - LSE_final).
//
//===----------------------------------------------------------------------===//

#include "../Launch.h"
#include "AttentionCommon.h"
#include "DecodeChunk.cuh"
#include "DeviceHelpers.cuh"
#include "LatentAttention.h"
#include "vflow/Runtime/cuda/IndexCheck.cuh"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <string>

namespace vflow::rt::cuda::detail {
namespace {

/// The CTA's result from its warps' (max, sum, unnormalized output): the
/// output row (one split) or the split's partials for the merge kernel, and
/// with one split each entry's mass share.
template <int D, KVType T, int NT>
__device__ __forceinline__ void
mergeWarps(const DecodeParams &p, uint8_t *smem, int row, int split, int n,
           int groupSize, const int *metaValid, const int *metaBlock,
           float vFactor, float accScale, float (&runMax)[NT][2],
           float (&runSum)[NT][2],
           float (&acc)[Geometry<D, T, NT>::kSteps][NT][4]) {
  using G = Geometry<D, T, NT>;
  constexpr int Cols = G::cols;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int fragRow = lane >> 2;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      runSum[nt][j] += __shfl_xor_sync(0xffffffffu, runSum[nt][j], 4);
      runSum[nt][j] += __shfl_xor_sync(0xffffffffu, runSum[nt][j], 8);
      runSum[nt][j] += __shfl_xor_sync(0xffffffffu, runSum[nt][j], 16);
    }
  __syncthreads(); // every warp is done with its ring
  float *warpOut = reinterpret_cast<float *>(smem); // [kWarps][Cols][D]
  float *warpMax = warpOut + kWarps * Cols * D;     // [kWarps][Cols]
  float *warpSum = warpMax + kWarps * Cols;
  float *warpWeight = warpSum + kWarps * Cols;
  float *finalMax = warpWeight + kWarps * Cols; // [Cols]
  float *finalSum = finalMax + Cols;
  if (lane < 4)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int col = nt * 8 + 2 * lane + j;
        warpMax[warp * Cols + col] = runMax[nt][j];
        warpSum[warp * Cols + col] = runSum[nt][j];
      }
#pragma unroll
  for (int i = 0; i < G::kSteps; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int col = nt * 8 + 2 * (lane & 3) + (k & 1);
        const int d = tileDim<T>(i, fragRow + 8 * (k >> 1));
        warpOut[(warp * Cols + col) * D + d] = acc[i][nt][k] * accScale;
      }
  __syncthreads();
  if (tid < Cols) {
    float top = -INFINITY;
    for (int w = 0; w < kWarps; ++w)
      top = fmaxf(top, warpMax[w * Cols + tid]);
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float m = warpMax[w * Cols + tid];
      const float weight = m == -INFINITY ? 0.0f : ex2(m - top);
      warpWeight[w * Cols + tid] = weight;
      sum += weight * warpSum[w * Cols + tid];
    }
    finalMax[tid] = top;
    finalSum[tid] = sum;
  }
  __syncthreads();

  const bool direct = p.numSplits == 1;
  const size_t partRow = static_cast<size_t>(split) * gridDim.x + row;
  for (int idx = tid; idx < groupSize * D; idx += kThreads) {
    const int g = idx / D;
    const int d = idx - g * D;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      o += warpWeight[w * Cols + g] * warpOut[(w * Cols + g) * D + d];
    o *= vFactor;
    if (direct) {
      const float sum = finalSum[g];
      p.out[static_cast<size_t>(row) * groupSize * D + idx] =
          __bfloat16_as_ushort(__float2bfloat16_rn(sum > 0 ? o / sum : 0.0f));
    } else {
      p.partAcc[partRow * groupSize * D + idx] = o;
    }
  }
  if (!direct && tid < groupSize) {
    p.partML[(partRow * groupSize + tid) * 2] = finalMax[tid];
    p.partML[(partRow * groupSize + tid) * 2 + 1] = finalSum[tid];
  }
  if (direct && p.mass) {
    __syncthreads(); // the entries' log-sum-exps are visible
    for (int idx = tid; idx < n * groupSize; idx += kThreads) {
      const int j = idx / groupSize;
      const int g = idx - j * groupSize;
      if (metaValid[j] <= 0)
        continue;
      float *share =
          p.mass +
          (static_cast<size_t>(row) * p.massStride + metaBlock[j]) * groupSize +
          g;
      const float sum = finalSum[g];
      *share = sum > 0 ? ex2(*share - finalMax[g] - __log2f(sum)) : 0.0f;
    }
  }
}

/// The CTA's entries of its list (from `at`, `n` of them) into shared
/// memory: page (checked, IndexCheck.cuh), logical block and valid tokens.
__device__ __forceinline__ void stageEntries(const DecodeParams &p, int at,
                                             int n, int len, int *metaPage,
                                             int *metaBlock, int *metaValid) {
  for (int j = threadIdx.x; j < n; j += kThreads) {
    const int e = at + j;
    const int block = p.blocks[e];
    metaPage[j] = vflow::rt::cuda::checkedIndex("paged_decode: pages entry",
                                                p.pages[e], p.numPages);
    metaBlock[j] = block;
    // A block wholly before a sliding window has nothing to attend.
    const bool before =
        p.window > 0 && (block + 1) * p.pageSize <= len - p.window;
    metaValid[j] =
        before ? 0 : max(0, min(p.pageSize, len - block * p.pageSize));
  }
}

/// The first token of chunk `chunk` of logical block `block` inside a
/// sliding window (<= 0: every token of the chunk is).
__device__ __forceinline__ int windowFirst(const DecodeParams &p, int len,
                                           int block, int chunk) {
  return p.window > 0 ? len - p.window - block * p.pageSize - 16 * chunk : 0;
}

/// Copies chunk `it` (its K and V rows, 16 bytes a lane, and with token
/// scales the chunk's 16 K and 16 V scales) into `stage` of the warp's
/// ring, zero-filling the rows and scales past the entry's valid tokens.
template <int D, KVType T, int NT>
__device__ __forceinline__ void
issueChunk(const DecodeParams &p, const ChunkIt &it, int stage, uint8_t *ring,
           const int *metaValid, const int *metaPage, int kvh, size_t headBytes,
           int lane) {
  using G = Geometry<D, T, NT>;
  constexpr int U = G::units;
  const int valid = min(16, metaValid[it.entry] - 16 * it.chunk);
  const size_t row =
      static_cast<size_t>(metaPage[it.entry]) * p.numKVHeads + kvh;
  const size_t offset =
      row * headBytes + static_cast<size_t>(it.chunk) * G::chunkBytes;
  const uint32_t kDst = smemAddress(ring + stage * G::stageBytes);
  const uint32_t vDst = kDst + G::chunkBytes;
#pragma unroll
  for (int i = 0; i < U / 2; ++i) {
    const int u = lane + 32 * i;
    const uint32_t srcBytes = u / U < valid ? 16 : 0;
    const uint32_t at = swizzle<U>(u) * 16;
    cpAsync16(kDst + at, p.kPool + offset + u * 16, srcBytes);
    cpAsync16(vDst + at, p.vPool + offset + u * 16, srcBytes);
  }
  if constexpr (KVTraits<T>::byte) {
    // Lanes 0-3: K scales of tokens 4 lane .. + 3; lanes 4-7: V's.
    if (p.kTokenScale && lane < 8) {
      const int first = 4 * (lane & 3);
      const float *src = (lane < 4 ? p.kTokenScale : p.vTokenScale) +
                         row * p.pageSize + 16 * it.chunk + first;
      cpAsync16(vDst + G::chunkBytes + 16 * lane, src,
                4u * static_cast<uint32_t>(max(0, min(4, valid - first))));
    }
  }
}

/// The accumulators at their start: O zero, running max -infinity, sums 0.
template <int D, KVType T, int NT>
__device__ __forceinline__ void
clearAccumulators(float (&acc)[Geometry<D, T, NT>::kSteps][NT][4],
                  float (&runMax)[NT][2], float (&runSum)[NT][2],
                  float (&entrySum)[NT][2]) {
  using G = Geometry<D, T, NT>;
#pragma unroll
  for (int i = 0; i < G::kSteps; ++i)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int k = 0; k < 4; ++k)
        acc[i][nt][k] = 0.0f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      runMax[nt][j] = -INFINITY;
      runSum[nt][j] = 0.0f;
      entrySum[nt][j] = 0.0f;
    }
}

template <int D, KVType T, int NT>
__global__ void __launch_bounds__(kThreads)
    pagedDecodeKernel(const DecodeParams p) {
  using G = Geometry<D, T, NT>;
  constexpr bool kByte = KVTraits<T>::byte;

  extern __shared__ __align__(16) uint8_t smem[];
  int *metaPage = reinterpret_cast<int *>(smem + G::scratchBytes);
  int *metaValid = metaPage + kMaxEntriesPerCTA;
  int *metaBlock = metaValid + kMaxEntriesPerCTA;
  uint2 *qFrag = reinterpret_cast<uint2 *>(smem + G::scratchBytes +
                                           G::metaBytes); // [kSteps][NT][32]

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int row = blockIdx.x; // b * Hkv + kvh
  const int split = blockIdx.y;
  const int numKVHeads = p.numKVHeads;
  const int groupSize = p.group;
  const int b = row / numKVHeads;
  const int kvh = row - b * numKVHeads;
  const int list = p.listsPerSequence ? b : row;
  // Launched as a programmatic dependent: the lists, the query and the
  // pages are the earlier grids' (GridDependency.cuh's contract). Its own
  // dependents (the merge) start after the main loop.
  vd::waitForEarlierGrids();
  const int base = p.indptr[list];
  // A list's entries (IndexCheck.cuh): its count, then each page id.
  const int count = vflow::rt::cuda::checkedIndex(
      "paged_decode: a list's entry count (count, or indptr's difference)",
      p.count ? p.count[list] : p.indptr[list + 1] - base, INT_MAX);
  const int2 share = splitShare(count, p.numSplits, p.entriesPerSplit,
                                kMinEntriesPerCTA, split);
  const int first = share.x, n = share.y - share.x, len = p.seqLen[b];

  stageEntries(p, base + first, n, len, metaPage, metaBlock, metaValid);
  stageQuery<D, T, NT>(p, row, groupSize, qFrag);
  __syncthreads();

  const float vFactor = byteFactor<T>(p.vScale, kvh);
  const float scoreFactor = p.scaleLog2 * byteFactor<T>(p.kScale, kvh);

  // This warp's ring of stages (Geometry::stageBytes).
  uint8_t *ring = smem + warp * G::stages * G::stageBytes;
  const size_t headBytes = static_cast<size_t>(p.pageSize) * D * G::bytes;

  auto issue = [&](const ChunkIt &it, int stage) {
    issueChunk<D, T, NT>(p, it, stage, ring, metaValid, metaPage, kvh,
                         headBytes, lane);
  };

  float acc[G::kSteps][NT][4];
  float runMax[NT][2], runSum[NT][2], entrySum[NT][2];
  clearAccumulators<D, T, NT>(acc, runMax, runSum, entrySum);

  ChunkIt load{warp, 0};
  skipEmpty(load, n, metaValid);
  ChunkIt cur = load;
#pragma unroll
  for (int s = 0; s < G::stages - 1; ++s) {
    if (load.entry < n) {
      issue(load, s);
      advance(load, n, metaValid);
    }
    cpAsyncCommit();
  }

  // Lane roles in the fragments: lanes (r, c) = (lane / 4, lane % 4); the
  // ldmatrix address of lane l is row (l & 7) of matrix l / 8.
  const int fragRow = lane >> 2;
  const int mat = lane >> 3;
  const int kAddrRow = (lane & 7) + (mat & 1) * 8;
  const int vAddrRow = kByte ? kAddrRow : (lane & 7) + (mat >> 1) * 8;
  // With token scales: the V scale the accumulator is in units of (the
  // largest of the last chunk's).
  float vUnit = 1.0f;

  for (int iter = 0; cur.entry < n; ++iter) {
    const int stage = iter % G::stages;
    if (load.entry < n) {
      issue(load, (iter + G::stages - 1) % G::stages);
      advance(load, n, metaValid);
    }
    cpAsyncCommit();
    cpAsyncWait<G::stages - 1>();
    __syncwarp();

    const uint8_t *kChunk = ring + stage * G::stageBytes;
    const uint32_t kBase = smemAddress(kChunk);
    const uint32_t vBase = kBase + G::chunkBytes;
    const int valid = min(16, metaValid[cur.entry] - 16 * cur.chunk);
    const int first = windowFirst(p, len, metaBlock[cur.entry], cur.chunk);

    // Token scales of this lane's tokens fragRow and fragRow + 8.
    float tokenK[2] = {1.0f, 1.0f}, tokenV[2] = {1.0f, 1.0f};
    const float accFactor = kByte && p.kTokenScale
                                ? chunkScales(kChunk + 2 * G::chunkBytes,
                                              fragRow, vUnit, tokenK, tokenV)
                                : 1.0f;

    float score[NT][4];
    chunkScores<D, T, NT>(kBase, qFrag, lane, kAddrRow, mat, score);

    float alpha[NT][2];
    softmaxStep<D, T, NT>(score, first, valid, fragRow, scoreFactor, tokenK,
                          accFactor, runMax, runSum, acc, alpha);
    if (p.mass)
      chunkMass<NT>(p, cur, metaValid, metaBlock, row, lane, groupSize, score,
                    alpha, runMax, entrySum);
    accumulatePV<D, T, NT>(vBase, mat, vAddrRow, score, tokenV, acc);
    __syncwarp();
    advance(cur, n, metaValid);
  }
  cpAsyncWait<0>();
  // The merge kernel (launched as a programmatic dependent) may start its
  // CTAs now; it waits for this grid's completion before reading anything.
  vd::launchDependents();

  mergeWarps<D, T, NT>(p, smem, row, split, n, groupSize, metaValid, metaBlock,
                       vFactor, vUnit, runMax, runSum, acc);
}

/// Splits whose weights one merge pass stages in shared memory.
constexpr int kMergeTile = 128;

/// Combines the splits of row blockIdx.x for its output elements
/// [blockIdx.y * kThreads, +kThreads) (query head major), and finishes the
/// mass of the row's entries (shared out over blockIdx.y).
__global__ void __launch_bounds__(kThreads)
    mergeKernel(const DecodeParams p, int headDim) {
  __shared__ float finalMax[kMaxGroup], finalSum[kMaxGroup],
      finalLse[kMaxGroup];
  __shared__ float weight[kMergeTile][kMaxGroup];
  vd::awaitEarlierGrids(); // the attention grid's partials and mass
  const int row = blockIdx.x;
  const int rows = gridDim.x;
  const int groupSize = p.group;
  const int splits = p.numSplits;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const float2 *stats = reinterpret_cast<const float2 *>(p.partML);
  auto statsAt = [&](int s, int g) {
    return stats[(static_cast<size_t>(s) * rows + row) * groupSize + g];
  };

  // One warp per query head combines the splits' (max, sum): lane l takes
  // splits l, l + 32, ..., then the lanes merge.
  for (int g = tid >> 5; g < groupSize; g += kWarps) {
    float top = -INFINITY, sum = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float2 ml = statsAt(s, g);
      if (ml.x == -INFINITY)
        continue;
      const float newTop = fmaxf(top, ml.x);
      sum = sum * ex2(top - newTop) + ml.y * ex2(ml.x - newTop);
      top = newTop;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      const float otherTop = __shfl_xor_sync(0xffffffffu, top, offset);
      const float otherSum = __shfl_xor_sync(0xffffffffu, sum, offset);
      const float newTop = fmaxf(top, otherTop);
      if (newTop != -INFINITY)
        sum = sum * ex2(top - newTop) + otherSum * ex2(otherTop - newTop);
      top = newTop;
    }
    if (lane == 0) {
      finalMax[g] = top;
      finalSum[g] = sum;
      finalLse[g] = sum > 0 ? top + __log2f(sum) : 0.0f;
    }
  }
  __syncthreads();

  // Each thread sums one output element over the splits, weights staged
  // per tile of splits, several partial loads in flight.
  const size_t rowElems = static_cast<size_t>(groupSize) * headDim;
  const int idx = blockIdx.y * kThreads + tid;
  const bool active = idx < groupSize * headDim;
  const int g = active ? idx / headDim : 0;
  float o = 0.0f;
  for (int first = 0; first < splits; first += kMergeTile) {
    const int tile = min(kMergeTile, splits - first);
    for (int k = tid; k < tile * groupSize; k += kThreads) {
      const int s = k / groupSize;
      const int h = k - s * groupSize;
      const float m = statsAt(first + s, h).x;
      weight[s][h] = m == -INFINITY || finalSum[h] <= 0
                         ? 0.0f
                         : ex2(m - finalMax[h]) / finalSum[h];
    }
    __syncthreads();
    if (active) {
      const float *part = p.partAcc +
                          (static_cast<size_t>(first) * rows + row) * rowElems +
                          idx;
      const size_t stride = static_cast<size_t>(rows) * rowElems;
#pragma unroll 8
      for (int s = 0; s < tile; ++s)
        o += weight[s][g] * part[s * stride];
    }
    __syncthreads();
  }
  if (active)
    p.out[row * rowElems + idx] = __bfloat16_as_ushort(__float2bfloat16_rn(o));

  if (!p.mass)
    return;
  const int b = row / p.numKVHeads;
  const int list = p.listsPerSequence ? b : row;
  const int base = p.indptr[list];
  const int count = min(p.count ? p.count[list] : p.indptr[list + 1] - base,
                        splits * p.entriesPerSplit);
  const int len = p.seqLen[b];
  for (int k = blockIdx.y * kThreads + tid; k < count * groupSize;
       k += gridDim.y * kThreads) {
    const int j = k / groupSize;
    const int h = k - j * groupSize;
    const int block = p.blocks[base + j];
    if (block * p.pageSize >= len || finalSum[h] <= 0)
      continue;
    float *share =
        p.mass + (static_cast<size_t>(row) * p.massStride + block) * groupSize +
        h;
    *share = ex2(*share - finalLse[h]);
  }
}

template <int D, KVType T, int NT> void allowSharedMemory() {
  checkCuda(cudaFuncSetAttribute(pagedDecodeKernel<D, T, NT>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 Geometry<D, T, NT>::smemBytes),
            "pagedDecodeAttention: setting the kernel's shared memory");
}

template <int D, KVType T, int NT>
void launchDecode(const DecodeParams &params, int rows, int splits,
                  cudaStream_t stream) {
  allowSharedMemory<D, T, NT>();
  launchAfterEarlierGrids("pagedDecodeAttention: launch",
                          pagedDecodeKernel<D, T, NT>, dim3(rows, splits),
                          dim3(kThreads), Geometry<D, T, NT>::smemBytes, stream,
                          params);
}

constexpr int kMaxCachedDevices = 16;

/// CTAs of pagedDecodeKernel<D, T, NT> one multiprocessor of the current
/// device holds (queried once per device).
template <int D, KVType T, int NT> int residentCTAs(int device) {
  static std::atomic<int> cache[kMaxCachedDevices];
  if (device < kMaxCachedDevices)
    if (const int known = cache[device].load(std::memory_order_relaxed))
      return known;
  allowSharedMemory<D, T, NT>();
  int blocks = 0;
  checkCuda(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &blocks, pagedDecodeKernel<D, T, NT>, kThreads,
                Geometry<D, T, NT>::smemBytes),
            "pagedDecodeAttention: occupancy query");
  blocks = std::max(blocks, 1);
  if (device < kMaxCachedDevices)
    cache[device].store(blocks, std::memory_order_relaxed);
  return blocks;
}

template <int D, KVType T> int residentCTAsFor(int group, int device) {
  return group <= 8 ? residentCTAs<D, T, 1>(device)
                    : residentCTAs<D, T, 2>(device);
}

template <int D> int residentCTAsFor(KVType type, int group, int device) {
  switch (type) {
  case KVType::BF16:
    return residentCTAsFor<D, KVType::BF16>(group, device);
  case KVType::F16:
    return residentCTAsFor<D, KVType::F16>(group, device);
  case KVType::FP8E4M3:
    return residentCTAsFor<D, KVType::FP8E4M3>(group, device);
  case KVType::INT8:
    return residentCTAsFor<D, KVType::INT8>(group, device);
  }
  return 1;
}

template <int D, KVType T>
void dispatchGroup(const DecodeParams &params, int rows, int splits,
                   cudaStream_t stream) {
  if (params.group <= 8)
    launchDecode<D, T, 1>(params, rows, splits, stream);
  else
    launchDecode<D, T, 2>(params, rows, splits, stream);
}

template <int D>
void dispatchType(KVType type, const DecodeParams &params, int rows, int splits,
                  cudaStream_t stream) {
  switch (type) {
  case KVType::BF16:
    return dispatchGroup<D, KVType::BF16>(params, rows, splits, stream);
  case KVType::F16:
    return dispatchGroup<D, KVType::F16>(params, rows, splits, stream);
  case KVType::FP8E4M3:
    return dispatchGroup<D, KVType::FP8E4M3>(params, rows, splits, stream);
  case KVType::INT8:
    return dispatchGroup<D, KVType::INT8>(params, rows, splits, stream);
  }
}

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int entriesPerSplit(int maxEntries, int splits) {
  return static_cast<int>(ceilDiv(std::max(maxEntries, 0), splits));
}

/// Byte offset of partML in the workspace (partAcc comes first).
size_t partMLOffset(int splits, int rows, int group, int headDim) {
  const size_t accBytes =
      static_cast<size_t>(splits) * rows * group * headDim * sizeof(float);
  return (accBytes + 15) / 16 * 16;
}

} // namespace
} // namespace vflow::rt::cuda::detail

namespace vflow::rt::cuda {

using namespace detail;

namespace {

/// The range of split counts the planner considers for these shapes: `lo`
/// and `hi` (both non-decreasing in maxEntries), and the device's CTA slots.
void splitRange(int batch, int numKVHeads, int group, int headDim,
                KVType kvType, int maxEntries, int64_t &lo, int64_t &hi,
                int64_t &slots) {
  int device = 0;
  checkCuda(cudaGetDevice(&device), "pagedDecodeAttention: cudaGetDevice");
  int resident = 1;
  const int clampedGroup = std::min(std::max(group, 1), kMaxGroup);
  switch (headDim) {
  case 64:
    resident = residentCTAsFor<64>(kvType, clampedGroup, device);
    break;
  case 128:
    resident = residentCTAsFor<128>(kvType, clampedGroup, device);
    break;
  case 256:
    resident = residentCTAsFor<256>(kvType, clampedGroup, device);
    break;
  default:
    break;
  }
  const int64_t rows = static_cast<int64_t>(batch) * numKVHeads;
  slots = static_cast<int64_t>(currentDeviceSMs()) * resident;
  lo = ceilDiv(maxEntries, kMaxEntriesPerCTA);
  hi = std::max(lo, std::min({ceilDiv(maxEntries, kMinEntriesPerCTA),
                              4 * ceilDiv(slots, rows), lo + 1024}));
}

} // namespace

int pagedDecodeSplits(int batch, int numKVHeads, int group, int headDim,
                      KVType kvType, int maxEntries) {
  if (maxEntries <= 0 || batch <= 0 || numKVHeads <= 0)
    return 1;
  // Model: the grid runs in waves of `slots` CTAs; a CTA costs a fixed
  // overhead (metadata, pipeline fill, epilogue: about 32 KB of streaming)
  // plus its entries. Pick the split count of least modelled time, with at
  // least kMinEntriesPerCTA entries per CTA (while there are) and at most
  // kMaxEntriesPerCTA.
  int64_t lo = 1, hi = 1, slots = 1;
  splitRange(batch, numKVHeads, group, headDim, kvType, maxEntries, lo, hi,
             slots);
  const int64_t rows = static_cast<int64_t>(batch) * numKVHeads;
  const int64_t overhead = kvTypeBytes(kvType) == 1 ? 8 : 4; // in entries
  int64_t best = lo, bestCost = INT64_MAX;
  for (int64_t splits = lo; splits <= hi; ++splits) {
    const int64_t perCTA = ceilDiv(maxEntries, splits);
    if (ceilDiv(maxEntries, perCTA) != splits)
      continue; // the same CTAs as a smaller split count
    const int64_t cost = ceilDiv(rows * splits, slots) * (overhead + perCTA);
    if (cost < bestCost) {
      best = splits;
      bestCost = cost;
    }
  }
  return static_cast<int>(best);
}

size_t pagedDecodeWorkspaceBytes(int batch, int numKVHeads, int group,
                                 int headDim, int maxEntries, int valueDim) {
  if (valueDim > 0)
    return latentDecodeWorkspaceBytes(batch, group, valueDim, maxEntries);
  // Enough for the plan of any step of at most maxEntries entries: the
  // planner's choice is not monotonic in the entries, its upper bound is.
  size_t bytes = 0;
  if (maxEntries <= 0 || batch <= 0 || numKVHeads <= 0)
    return 0;
  for (KVType type :
       {KVType::BF16, KVType::F16, KVType::FP8E4M3, KVType::INT8}) {
    int64_t lo = 1, hi = 1, slots = 1;
    splitRange(batch, numKVHeads, group, headDim, type, maxEntries, lo, hi,
               slots);
    const int splits = int(hi);
    if (splits == 1)
      continue;
    const int rows = batch * numKVHeads;
    bytes = std::max(bytes, partMLOffset(splits, rows, group, headDim) +
                                static_cast<size_t>(splits) * rows * group * 2 *
                                    sizeof(float));
  }
  return bytes;
}

void pagedDecodeAttention(const PagedAttentionArgs &args, cudaStream_t stream) {
  if (args.valueDim > 0)
    return latentDecodeAttention(args, stream);
  const char *op = "pagedDecodeAttention";
  checkKVArgs(op, args);
  require(args.pageSize % 16 == 0 && args.pageSize <= 256, op,
          "pageSize must be a multiple of 16 in [16, 256], got " +
              std::to_string(args.pageSize));
  require(args.group <= kMaxGroup, op,
          "group must be at most 16, got " + std::to_string(args.group));
  require(args.indptr && args.pages && args.blocks && args.seqLen, op,
          "indptr, pages, blocks and seqLen must not be null");
  require(args.maxEntries >= 0, op,
          "maxEntries must not be negative, got " +
              std::to_string(args.maxEntries));
  require(!args.mass || args.massStride > 0, op,
          "massStride must be positive when mass is given");
  require(!args.mass || aligned(args.mass, 4), op,
          "mass must be 4-byte aligned");
  const int64_t rows = static_cast<int64_t>(args.batch) * args.numKVHeads;
  require(rows <= INT_MAX, op, "batch * numKVHeads is too large");

  const int splits =
      pagedDecodeSplits(args.batch, args.numKVHeads, args.group, args.headDim,
                        args.kvType, args.maxEntries);
  require(splits <= 65535, op, "maxEntries is too large for one launch");
  DecodeParams params{kvParams(args)};
  params.indptr = args.indptr;
  params.count = args.count;
  params.pages = args.pages;
  params.blocks = args.blocks;
  params.seqLen = args.seqLen;
  params.listsPerSequence = args.listsPerSequence;
  params.entriesPerSplit = entriesPerSplit(args.maxEntries, splits);
  params.numSplits = splits;
  params.mass = args.mass;
  params.massStride = args.massStride;
  if (splits > 1) {
    const size_t need = pagedDecodeWorkspaceBytes(
        args.batch, args.numKVHeads, args.group, args.headDim, args.maxEntries);
    require(args.workspace && args.workspaceBytes >= need, op,
            "the workspace must hold " + std::to_string(need) +
                " bytes (pagedDecodeWorkspaceBytes), got " +
                std::to_string(args.workspace ? args.workspaceBytes : 0));
    require(aligned(args.workspace, 16), op,
            "the workspace must be 16-byte aligned");
    auto *bytes = static_cast<uint8_t *>(args.workspace);
    params.partAcc = reinterpret_cast<float *>(bytes);
    params.partML = reinterpret_cast<float *>(
        bytes +
        partMLOffset(splits, static_cast<int>(rows), args.group, args.headDim));
  }

  const int rowCount = static_cast<int>(rows);
  switch (args.headDim) {
  case 64:
    dispatchType<64>(args.kvType, params, rowCount, splits, stream);
    break;
  case 128:
    dispatchType<128>(args.kvType, params, rowCount, splits, stream);
    break;
  default:
    dispatchType<256>(args.kvType, params, rowCount, splits, stream);
    break;
  }
  if (splits > 1)
    // Set up while the attention grid runs (a programmatic dependent).
    launchAfterEarlierGrids(
        "pagedDecodeAttention: merge launch", mergeKernel,
        dim3(rowCount,
             static_cast<unsigned>(ceilDiv(
                 static_cast<int64_t>(args.group) * args.headDim, kThreads))),
        dim3(kThreads), 0, stream, params, args.headDim);
}

} // namespace vflow::rt::cuda
