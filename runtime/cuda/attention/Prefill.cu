//===- Prefill.cu - Causal attention of new tokens over pages ---*- C++ -*-===//
//
// Prefill (fill) attention: every new query row of a sequence attends the
// sequence's tokens up to its own position. Written for correctness, not
// speed: one warp per (query row, query head) walks the keys one at a time
// with an online softmax; lane l holds head dims [l * D / 32, +D / 32).
//
//===----------------------------------------------------------------------===//

#include "AttentionCommon.h"
#include "DeviceHelpers.cuh"

#include <climits>
#include <string>

namespace vflow {
namespace rt {
namespace cuda {
namespace detail {
namespace {

constexpr int kPrefillWarps = 4;

struct PrefillParams : KVParams {
  int batch;
  int totalTokens;
  const int32_t *qIndptr;
  const int32_t *seqLen;
  const int32_t *indptr;
  const int32_t *pages;
};

/// Element `i` of a row of stored type T, as a float (fp8 before scaling).
template <KVType T>
__device__ __forceinline__ float loadElement(const uint8_t *row, int i) {
  if constexpr (T == KVType::FP8E4M3)
    return fp8ToFloat(row[i]);
  else if constexpr (T == KVType::F16)
    return __half2float(reinterpret_cast<const __half *>(row)[i]);
  else
    return bf16BitsToFloat(reinterpret_cast<const uint16_t *>(row)[i]);
}

template <int D, KVType T>
__global__ void __launch_bounds__(kPrefillWarps * 32)
    prefillKernel(const PrefillParams p) {
  constexpr int E = D / 32;
  constexpr int bytes = T == KVType::FP8E4M3 ? 1 : 2;
  const int lane = threadIdx.x & 31;
  const int numHeads = p.numKVHeads * p.group;
  const int64_t item =
      static_cast<int64_t>(blockIdx.x) * kPrefillWarps + (threadIdx.x >> 5);
  if (item >= static_cast<int64_t>(p.totalTokens) * numHeads)
    return;
  const int token = static_cast<int>(item / numHeads);
  const int head =
      static_cast<int>(item - static_cast<int64_t>(token) * numHeads);
  const int kvh = head / p.group;
  int b = 0;
  while (b < p.batch && p.qIndptr[b + 1] <= token)
    ++b;
  uint16_t *out = p.out + item * D + lane * E;
  const int rows = b < p.batch ? p.qIndptr[b + 1] - p.qIndptr[b] : 0;
  const int len = b < p.batch ? p.seqLen[b] : 0;
  if (rows == 0 || rows > len) {
    for (int e = 0; e < E; ++e)
      out[e] = 0;
    return;
  }
  const int position = len - rows + (token - p.qIndptr[b]);

  const float kFactor = T == KVType::FP8E4M3 ? headScale(p.kScale, kvh) : 1.0f;
  const float vFactor = T == KVType::FP8E4M3 ? headScale(p.vScale, kvh) : 1.0f;
  float q[E], acc[E];
  const uint16_t *qRow = p.q + item * D + lane * E;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    q[e] = bf16BitsToFloat(qRow[e]) * p.scaleLog2 * kFactor;
    acc[e] = 0.0f;
  }
  const size_t rowBytes = static_cast<size_t>(D) * bytes;
  const int32_t *pages = p.pages + p.indptr[b];
  float runMax = -INFINITY, runSum = 0.0f;
  for (int key = 0; key <= position; ++key) {
    const size_t at =
        ((static_cast<size_t>(pages[key / p.pageSize]) * p.numKVHeads + kvh) *
             p.pageSize +
         key % p.pageSize) *
            rowBytes +
        lane * E * bytes;
    float dot = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e)
      dot += q[e] * loadElement<T>(p.kPool + at, e);
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      dot += __shfl_xor_sync(0xffffffffu, dot, offset);
    const float newMax = fmaxf(runMax, dot);
    const float alpha = ex2(runMax - newMax);
    const float weight = ex2(dot - newMax);
    runMax = newMax;
    runSum = runSum * alpha + weight;
#pragma unroll
    for (int e = 0; e < E; ++e)
      acc[e] = acc[e] * alpha + weight * loadElement<T>(p.vPool + at, e);
  }
#pragma unroll
  for (int e = 0; e < E; ++e)
    out[e] =
        __bfloat16_as_ushort(__float2bfloat16_rn(acc[e] * vFactor / runSum));
}

template <int D, KVType T>
void launchPrefill(const PrefillParams &params, int blocks,
                   cudaStream_t stream) {
  prefillKernel<D, T><<<blocks, kPrefillWarps * 32, 0, stream>>>(params);
  checkCuda(cudaGetLastError(), "prefillAttention: launch");
}

template <int D>
void dispatchPrefill(KVType type, const PrefillParams &params, int blocks,
                     cudaStream_t stream) {
  switch (type) {
  case KVType::BF16:
    return launchPrefill<D, KVType::BF16>(params, blocks, stream);
  case KVType::F16:
    return launchPrefill<D, KVType::F16>(params, blocks, stream);
  case KVType::FP8E4M3:
    return launchPrefill<D, KVType::FP8E4M3>(params, blocks, stream);
  }
}

} // namespace
} // namespace detail

using namespace detail;

void prefillAttention(const PrefillAttentionArgs &args, cudaStream_t stream) {
  const char *op = "prefillAttention";
  checkKVArgs(op, args);
  require(args.totalTokens >= 0, op,
          "totalTokens must not be negative, got " +
              std::to_string(args.totalTokens));
  require(args.qIndptr && args.seqLen && args.indptr && args.pages, op,
          "qIndptr, seqLen, indptr and pages must not be null");
  const int64_t items =
      static_cast<int64_t>(args.totalTokens) * args.numKVHeads * args.group;
  const int64_t blocks = (items + kPrefillWarps - 1) / kPrefillWarps;
  require(blocks <= INT_MAX, op, "too many query rows for one launch");
  if (blocks == 0)
    return;

  PrefillParams params{kvParams(args)};
  params.batch = args.batch;
  params.totalTokens = args.totalTokens;
  params.qIndptr = args.qIndptr;
  params.seqLen = args.seqLen;
  params.indptr = args.indptr;
  params.pages = args.pages;
  const int grid = static_cast<int>(blocks);
  switch (args.headDim) {
  case 64:
    dispatchPrefill<64>(args.kvType, params, grid, stream);
    break;
  case 128:
    dispatchPrefill<128>(args.kvType, params, grid, stream);
    break;
  default:
    dispatchPrefill<256>(args.kvType, params, grid, stream);
    break;
  }
}

} // namespace cuda
} // namespace rt
} // namespace vflow
