//===- SessionKernels.cu - The GPU session's own small kernels ------------===//
//
// Flow-independent kernels of the GPU session: writing prefill tokens
// into the KV pools (with the storage encodings of FlowDevice.cuh, so the
// pools hold what the generated append kernel would write) and carrying the
// attention mass of a step's rows to their sequences' slots.
//
//===----------------------------------------------------------------------===//

#include "../Launch.h"
#include "vflow/Runtime/cuda/SessionKernels.h"

#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/cuda/FlowDevice.cuh"
#include "vflow/Runtime/cuda/IndexCheck.cuh"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

namespace {

using vflow::rt::cuda::checkedIndex;
using vflow::rt::cuda::KVType;
using vflow::rt::cuda::kvTypeBytes;

/// k, v: bf16 [n, numLayers, numKVHeads, D]; token t of `layer` goes to
/// slot positions[t] of page pages[t]. A warp a (token, KV head) row.
template <class KV>
__global__ void writeTokensKernel(vflow::rt::cuda::WriteTokensArgs a) {
  const int lane = threadIdx.x & 31;
  const long long rows = (long long)a.n * a.numKVHeads;
  const long long warps = (long long)gridDim.x * (blockDim.x / 32);
  for (long long r =
           blockIdx.x * (long long)(blockDim.x / 32) + threadIdx.x / 32;
       r < rows; r += warps) {
    const int h = int(r % a.numKVHeads);
    const int t = int(r / a.numKVHeads);
    const int page =
        checkedIndex("write_kv: slot_pages entry", a.pages[t], a.numPages);
    const int position = checkedIndex("write_kv: slot_positions entry",
                                      a.positions[t], a.pageSize);
    const long long dst =
        (((long long)page * a.numKVHeads + h) * a.pageSize + position) *
        a.headDim;
    const long long src =
        ((long long)t * a.numLayers + a.layer) * a.numKVHeads * a.headDim +
        (long long)h * a.headDim;
    vd::storeKVRow<KV>(a.kPool, a.kTokenScale, dst, a.k + src, a.headDim, lane);
    vd::storeKVRow<KV>(a.vPool, a.vTokenScale, dst, a.v + src, a.headDim, lane);
  }
}

constexpr int kCarryThreads = 256;

/// Moves each row's mass to its sequence's slot and leaves the row zero for
/// the next step. Grid: (rows, parts of a row). The attention wrote only
/// the attended blocks' shares, so only non-zero words are cleared.
__global__ void carryMassKernel(float *rows, float *slots, const int *slotOf,
                                const int *seqLen, int numKVHeads,
                                int maxBlocks, int group, int pageSize) {
  const int r = blockIdx.x, b = r / numKVHeads, h = r % numKVHeads;
  const long long n = (seqLen[b] + pageSize - 1) / pageSize * (long long)group;
  float *src = rows + (long long)r * maxBlocks * group;
  float *dst =
      slots + ((long long)slotOf[b] * numKVHeads + h) * maxBlocks * group;
  vd::awaitEarlierGrids(); // the attention's mass rows
  const long long round = (long long)vd::kInFlight * blockDim.x;
  vd::copyInFlight(src, n, blockIdx.y * round, gridDim.y * round,
                   [&](long long e, float v) {
                     dst[e] = v;
                     if (__float_as_uint(v) != 0u)
                       src[e] = 0.0f;
                   });
}

/// Folds the retain block's scores of one flow layer ([rows * kvHeads,
/// maxBlocks * unit], `unit` scores a block) into each row's ([rows,
/// maxBlocks * unit]) over the row's complete blocks: KV heads in order,
/// from retainInit at the step's first flow layer (NumericRules.h: the CPU
/// session's fold, step for step).
__global__ void foldRetainKernel(const float *scores, float *folded,
                                 const int *seqLen, int numKVHeads,
                                 int maxBlocks, int pageSize, int unit,
                                 bool max, bool first) {
  const int b = blockIdx.x;
  vd::awaitEarlierGrids(); // the retain kernel's scores
  const int n = seqLen[b] / pageSize * unit;
  const long long stride = (long long)maxBlocks * unit;
  for (int i = blockIdx.y * blockDim.x + threadIdx.x; i < n;
       i += gridDim.y * blockDim.x) {
    float *acc = folded + b * stride + i;
    float v = first ? vflow::rules::retainInit(max) : *acc;
    for (int h = 0; h < numKVHeads; ++h)
      v = vflow::rules::retainFold(
          max, v, scores[((long long)b * numKVHeads + h) * stride + i]);
    *acc = v;
  }
}

/// Moves each array's block rows down over the evicted ones (compactRows).
/// One CTA per (array, KV head) walks its rows in order, a chunk at a time:
/// every thread reads its elements of the chunk, then all write, so a
/// source (at or after its destination, not yet written) is read before
/// anything overwrites it.
__global__ void compactRowsKernel(const vflow::rt::cuda::RowArray *arrays,
                                  const int *from, int rows) {
  const vflow::rt::cuda::RowArray arr = arrays[blockIdx.x];
  float *base = arr.base + (long long)blockIdx.y * arr.headStride;
  const long long total = (long long)rows * arr.rowElements;
  constexpr int kPerThread = 4;
  const long long chunk = (long long)kPerThread * blockDim.x;
  for (long long start = 0; start < total; start += chunk) {
    float v[kPerThread];
    for (int i = 0; i < kPerThread; ++i) {
      const long long e = start + (long long)i * blockDim.x + threadIdx.x;
      if (e >= total)
        break;
      const int src = from[e / arr.rowElements];
      v[i] = src < 0
                 ? arr.fill
                 : base[(long long)src * arr.rowElements + e % arr.rowElements];
    }
    __syncthreads();
    for (int i = 0; i < kPerThread; ++i) {
      const long long e = start + (long long)i * blockDim.x + threadIdx.x;
      if (e >= total)
        break;
      base[e] = v[i];
    }
    __syncthreads();
  }
}

__global__ void addCountsKernel(const int *counts, int n,
                                unsigned long long *total) {
  unsigned long long sum = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    sum += (unsigned long long)counts[i];
  for (int offset = 16; offset > 0; offset /= 2)
    sum += __shfl_down_sync(0xffffffffu, sum, offset);
  if ((threadIdx.x & 31) == 0 && sum)
    atomicAdd(total, sum);
}

__global__ void addSlotCountsKernel(const int *counts, int rows, int numKVHeads,
                                    const int *slotOf,
                                    unsigned long long *perSlot) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows)
    return;
  unsigned long long sum = 0;
  for (int h = 0; h < numKVHeads; ++h)
    sum += (unsigned long long)counts[r * numKVHeads + h];
  if (sum)
    atomicAdd(perSlot + slotOf[r], sum);
}

/// One CTA per list (row b, KV head h); a thread per query head of the
/// group sums the dense mass of the list's blocks.
__global__ void massRecallKernel(const float *mass, const int *indptr,
                                 const int *count, const int *blocks,
                                 const int *seqLen, int numKVHeads, int group,
                                 int maxBlocks, double *sum,
                                 unsigned long long *samples) {
  const int row = blockIdx.x, b = row / numKVHeads, h = row % numKVHeads;
  if (seqLen[b] <= 0) // a padded row
    return;
  for (int j = threadIdx.x; j < group; j += blockDim.x) {
    double share = 0;
    for (int i = indptr[row]; i < indptr[row] + count[row]; ++i)
      share += mass[((long long)row * maxBlocks + blocks[i]) * group + j];
    atomicAdd(&sum[h * group + j], share);
  }
  if (h == 0 && threadIdx.x == 0)
    atomicAdd(samples, 1ull);
}

/// dst[h][e] (+)= scale * sum over r of rows[r * numKVHeads + h][e], e over
/// `elements` (maxBlocks * group).
__global__ void sumMassRowsKernel(const float *rows, int numRows,
                                  int numKVHeads, long long elements,
                                  float *dst, float scale, bool accumulate) {
  const int h = blockIdx.y;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
       e < elements; e += (long long)gridDim.x * blockDim.x) {
    float sum = 0;
    for (int r = 0; r < numRows; ++r)
      sum += rows[((long long)r * numKVHeads + h) * elements + e];
    float *out = dst + (long long)h * elements + e;
    *out = (accumulate ? *out : 0.0f) + scale * sum;
  }
}

/// One CTA of two warps per (row, KV head): the row's token at position
/// seqLen[b] - 1, K by warp 0 and V by warp 1.
template <class KV>
__global__ void appendRowsKernel(vflow::rt::cuda::AppendRowsArgs a) {
  const int b = blockIdx.x, h = blockIdx.y;
  const int position = a.seqLen[b] - 1;
  if (position < 0)
    return;
  const int page = a.blockTable[b * a.maxBlocks + position / a.pageSize];
  const long long dst = (((long long)page * a.numKVHeads + h) * a.pageSize +
                         position % a.pageSize) *
                        a.headDim;
  const long long src = ((long long)b * a.numKVHeads + h) * a.headDim;
  const bool isK = threadIdx.x < 32;
  vd::storeKVRow<KV>(isK ? a.kPool : a.vPool,
                     isK ? a.kTokenScale : a.vTokenScale, dst,
                     (isK ? a.k : a.v) + src, a.headDim, threadIdx.x & 31);
}

__global__ void writeEveryBlockKernel(vflow::rt::cuda::EveryBlockArgs a) {
  vd::awaitEarlierGrids(); // the lists the previous layer's attention read
  const int r = blockIdx.x, b = r / a.numKVHeads;
  const int n = (a.seqLen[b] + a.pageSize - 1) / a.pageSize;
  const int begin = a.indptr[r], capacity = a.indptr[r + 1] - begin;
  const int *table = a.blockTable + (long long)b * a.maxBlocks;
  const int written = n < capacity ? n : capacity;
  for (int j = threadIdx.x; j < written; j += blockDim.x) {
    a.pages[begin + j] = table[j];
    a.blocks[begin + j] = j;
  }
  if (threadIdx.x == 0)
    a.count[r] = written;
}

struct PointerPack {
  void *p[vflow::rt::cuda::kMaxStoredPointers];
};

__global__ void storePointersKernel(void **dst, PointerPack pack, int n) {
  if (int(threadIdx.x) < n)
    dst[threadIdx.x] = pack.p[threadIdx.x];
}

void check(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw vflow::rt::Error(std::string(what) + ": " +
                           cudaGetErrorString(status));
}

} // namespace

namespace {

/// kernel<T> for the pools' KV type.
template <template <class> class Kernel> struct ByKVType {
  template <class Args>
  static void launch(KVType type, dim3 grid, dim3 block, cudaStream_t s,
                     const Args &a) {
    switch (type) {
    case KVType::BF16:
      return Kernel<vd::BF16>::launch(grid, block, s, a);
    case KVType::F16:
      return Kernel<vd::F16>::launch(grid, block, s, a);
    case KVType::FP8E4M3:
      return Kernel<vd::FP8E4M3>::launch(grid, block, s, a);
    case KVType::INT8:
      return Kernel<vd::INT8>::launch(grid, block, s, a);
    }
  }
};

template <class KV> struct WriteTokens {
  static void launch(dim3 grid, dim3 block, cudaStream_t s,
                     const vflow::rt::cuda::WriteTokensArgs &a) {
    writeTokensKernel<KV><<<grid, block, 0, s>>>(a);
  }
};
template <class KV> struct AppendRows {
  static void launch(dim3 grid, dim3 block, cudaStream_t s,
                     const vflow::rt::cuda::AppendRowsArgs &a) {
    appendRowsKernel<KV><<<grid, block, 0, s>>>(a);
  }
};

} // namespace

void vflow::rt::cuda::writeTokens(const WriteTokensArgs &a, void *stream) {
  if (a.n == 0)
    return;
  if (a.numPages < 1 || a.pageSize < 1)
    throw vflow::rt::Error(
        "writing tokens: numPages and pageSize must be positive");
  if (kvTypeBytes(a.kvType) == 1 && (!a.kTokenScale || !a.vTokenScale))
    throw vflow::rt::Error("writing tokens: 8-bit pools need token scales");
  // 8 rows (warps) a CTA.
  const long long rows = (long long)a.n * a.numKVHeads;
  const unsigned blocks = unsigned(std::min<long long>((rows + 7) / 8, 4096));
  ByKVType<WriteTokens>::launch(a.kvType, dim3(blocks), dim3(256),
                                static_cast<cudaStream_t>(stream), a);
  check(cudaGetLastError(), "writing prefill tokens into the KV pools");
}

void vflow::rt::cuda::carryMass(float *rows, float *slots, const int *slotOf,
                                const int *seqLen, int batch, int numKVHeads,
                                int maxBlocks, int group, int pageSize,
                                void *stream) {
  if (batch == 0)
    return;
  // Parts of a row: from the longest possible row, so that a captured step
  // fits any lengths.
  const long long chunk = (long long)kCarryThreads * vd::kInFlight;
  const unsigned parts = unsigned(std::min<long long>(
      64, ((long long)maxBlocks * group + chunk - 1) / chunk));
  launchAfterEarlierGrids(
      "carrying the attention mass to its slots", carryMassKernel,
      dim3(unsigned(batch * numKVHeads), std::max(1u, parts)),
      dim3(kCarryThreads), 0, static_cast<cudaStream_t>(stream), rows, slots,
      slotOf, seqLen, numKVHeads, maxBlocks, group, pageSize);
}

void vflow::rt::cuda::writeEveryBlock(const EveryBlockArgs &a, void *stream) {
  if (a.batch == 0)
    return;
  launchAfterEarlierGrids("writing every block's list", writeEveryBlockKernel,
                          dim3(unsigned(a.batch * a.numKVHeads)), dim3(128), 0,
                          static_cast<cudaStream_t>(stream), a);
}

void vflow::rt::cuda::appendRows(const AppendRowsArgs &a, void *stream) {
  if (a.batch == 0)
    return;
  if (kvTypeBytes(a.kvType) == 1 && (!a.kTokenScale || !a.vTokenScale))
    throw vflow::rt::Error("appending a step's tokens: 8-bit pools need "
                           "token scales");
  ByKVType<AppendRows>::launch(a.kvType,
                               dim3(unsigned(a.batch), unsigned(a.numKVHeads)),
                               dim3(64), static_cast<cudaStream_t>(stream), a);
  check(cudaGetLastError(), "appending a step's tokens");
}

void vflow::rt::cuda::storePointers(void **dst, void *const *src, int n,
                                    void *stream) {
  if (n <= 0)
    return;
  if (n > kMaxStoredPointers)
    throw vflow::rt::Error("storing " + std::to_string(n) +
                           " device pointers: at most " +
                           std::to_string(kMaxStoredPointers));
  PointerPack pack{};
  for (int i = 0; i < n; ++i)
    pack.p[i] = src[i];
  storePointersKernel<<<1, kMaxStoredPointers, 0,
                        static_cast<cudaStream_t>(stream)>>>(dst, pack, n);
  check(cudaGetLastError(), "storing device pointers");
}

void vflow::rt::cuda::massRecall(const MassRecallArgs &a, void *stream) {
  if (a.batch == 0)
    return;
  massRecallKernel<<<a.batch * a.numKVHeads, 32, 0,
                     static_cast<cudaStream_t>(stream)>>>(
      a.mass, a.indptr, a.count, a.blocks, a.seqLen, a.numKVHeads, a.group,
      a.maxBlocks, a.sum, a.samples);
  check(cudaGetLastError(), "measuring the mass recall");
}

void vflow::rt::cuda::sumMassRows(const float *rows, int numRows,
                                  int numKVHeads, long long elements,
                                  float *dst, float scale, bool accumulate,
                                  void *stream) {
  const dim3 grid(
      unsigned((elements + 255) / 256 < 64 ? (elements + 255) / 256 : 64),
      unsigned(numKVHeads));
  sumMassRowsKernel<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      rows, numRows, numKVHeads, elements, dst, scale, accumulate);
  check(cudaGetLastError(), "summing the observation window");
}

void vflow::rt::cuda::addSlotCounts(const int *counts, int rows, int numKVHeads,
                                    const int *slotOf,
                                    unsigned long long *perSlot, void *stream) {
  if (rows == 0)
    return;
  addSlotCountsKernel<<<(rows + 127) / 128, 128, 0,
                        static_cast<cudaStream_t>(stream)>>>(
      counts, rows, numKVHeads, slotOf, perSlot);
  check(cudaGetLastError(), "counting each sequence's blocks attended");
}

void vflow::rt::cuda::addCounts(const int *counts, int n,
                                unsigned long long *total, void *stream) {
  if (n == 0)
    return;
  addCountsKernel<<<1, 256, 0, static_cast<cudaStream_t>(stream)>>>(counts, n,
                                                                    total);
  check(cudaGetLastError(), "counting the blocks attended");
}

void vflow::rt::cuda::foldRetain(const float *scores, float *folded,
                                 const int *seqLen, int batch, int numKVHeads,
                                 int maxBlocks, int pageSize, int unit,
                                 bool max, bool first, void *stream) {
  if (batch == 0)
    return;
  // Parts of a row: from the longest possible row, so that a captured step
  // fits any lengths.
  const unsigned parts = unsigned(
      std::min(16LL, std::max(1LL, ((long long)maxBlocks * unit + 255) / 256)));
  launchAfterEarlierGrids("folding the retain block's scores", foldRetainKernel,
                          dim3(unsigned(batch), parts), dim3(256), 0,
                          static_cast<cudaStream_t>(stream), scores, folded,
                          seqLen, numKVHeads, maxBlocks, pageSize, unit, max,
                          first);
}

namespace {

/// One K or V row of move `i` (of this chunk) at layer blockIdx.y, KV head
/// h: its place in the pools (`dst` false: the source) and in staging.
struct MovedRow {
  unsigned char *pool;
  float *scale;
  unsigned char *staged;
  float *stagedScale;
};

__device__ MovedRow movedRow(const vflow::rt::cuda::MoveTokensArgs &a,
                             int first, int i, int h, bool v, bool dst) {
  const int *m = a.moves + 4LL * (first + i);
  const int layer = blockIdx.y;
  const long long slot =
      ((long long)m[dst ? 2 : 0] * a.numKVHeads + h) * a.pageSize +
      m[dst ? 3 : 1];
  // Staging: [move][layer][head][K then V] rows, then the scales alike.
  const long long row =
      (((long long)i * a.numLayers + layer) * a.numKVHeads + h) * 2 + v;
  const long long rows = (long long)gridDim.x * a.numLayers * a.numKVHeads * 2;
  unsigned char *pool =
      static_cast<unsigned char *>(v ? a.vPools[layer] : a.kPools[layer]);
  float *const *scales = v ? a.vScales : a.kScales;
  return {pool + slot * a.rowBytes, scales ? scales[layer] + slot : nullptr,
          a.staging + row * a.rowBytes,
          reinterpret_cast<float *>(a.staging + rows * a.rowBytes) + row};
}

/// Gathers (toStaging) or scatters the moves [first, first + gridDim.x):
/// one CTA per (move, layer), its threads over the heads' rows in 16-byte
/// words.
__global__ void moveTokensKernel(const vflow::rt::cuda::MoveTokensArgs a,
                                 int first, bool toStaging) {
  const int words = a.rowBytes / 16;
  for (int e = threadIdx.x; e < a.numKVHeads * 2 * words; e += blockDim.x) {
    const int w = e % words, hv = e / words;
    const MovedRow r = movedRow(a, first, blockIdx.x, hv / 2, hv % 2,
                                /*dst=*/!toStaging);
    uint4 *from = reinterpret_cast<uint4 *>(toStaging ? r.pool : r.staged);
    uint4 *to = reinterpret_cast<uint4 *>(toStaging ? r.staged : r.pool);
    to[w] = from[w];
    if (w == 0 && r.scale) {
      if (toStaging)
        *r.stagedScale = *r.scale;
      else
        *r.scale = *r.stagedScale;
    }
  }
}

} // namespace

void vflow::rt::cuda::moveTokens(const MoveTokensArgs &a, void *stream) {
  if (a.n == 0)
    return;
  if (a.rowBytes % 16 != 0 || a.rowBytes <= 0)
    throw vflow::rt::Error("moving tokens: rows must be a multiple of 16 "
                           "bytes");
  const size_t perMove = size_t(a.numLayers) * a.numKVHeads * 2 *
                         (size_t(a.rowBytes) + sizeof(float));
  const int chunk = int(std::min<size_t>(a.stagingBytes / perMove, 65535));
  if (chunk < 1)
    throw vflow::rt::Error("moving tokens: the staging buffer holds no move");
  auto s = static_cast<cudaStream_t>(stream);
  for (int first = 0; first < a.n; first += chunk) {
    const dim3 grid(unsigned(std::min(chunk, a.n - first)),
                    unsigned(a.numLayers));
    moveTokensKernel<<<grid, 128, 0, s>>>(a, first, true);
    moveTokensKernel<<<grid, 128, 0, s>>>(a, first, false);
    check(cudaGetLastError(), "moving tokens (compaction)");
  }
}

void vflow::rt::cuda::compactRows(const RowArray *arrays, int numArrays,
                                  int numKVHeads, const int *from, int rows,
                                  void *stream) {
  if (numArrays == 0 || rows == 0)
    return;
  compactRowsKernel<<<dim3(unsigned(numArrays), unsigned(numKVHeads)), 256, 0,
                      static_cast<cudaStream_t>(stream)>>>(arrays, from, rows);
  check(cudaGetLastError(), "moving the kept blocks' rows");
}
