//===- CudaSampling.cu - The sampling rule on the GPU ---------------------===//

#include "CudaSampling.h"

#include <cmath>

namespace {

/// A float's order as an unsigned key (NaN as -infinity's key).
__device__ unsigned orderKey(float f) {
  if (isnan(f))
    f = -INFINITY;
  unsigned b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}

template <class T> __device__ T blockReduceSum(T v, T *scratch) {
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0)
    scratch[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T total = 0;
    for (int w = 0; w < int(blockDim.x + 31) / 32; ++w)
      total += scratch[w];
    scratch[32] = total;
  }
  __syncthreads();
  return scratch[32];
}

/// The row's largest logit `top` and its id (the lowest among equals),
/// reduced over the CTA through `bestOf`/`idOf` ([32] each); returns
/// whether any logit is NaN or an infinity (then nothing else is valid).
__device__ __forceinline__ bool rowMax(const float *l, int V, float *bestOf,
                                       int *idOf, float &top, int &argmax) {
  float best = -INFINITY;
  int bestId = V;
  bool nonFinite = false;
  auto consider = [&](float f, int i) {
    nonFinite = nonFinite || !isfinite(f);
    if (f > best || (f == best && i < bestId)) {
      best = f;
      bestId = i;
    }
  };
  if (V % 4 == 0) { // rows 16-byte aligned: 4 logits per load
    const float4 *l4 = reinterpret_cast<const float4 *>(l);
    for (int i = threadIdx.x; i < V / 4; i += blockDim.x) {
      const float4 f = l4[i];
      consider(f.x, 4 * i);
      consider(f.y, 4 * i + 1);
      consider(f.z, 4 * i + 2);
      consider(f.w, 4 * i + 3);
    }
  } else {
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      consider(l[i], i);
  }
  for (int o = 16; o > 0; o /= 2) {
    float ob = __shfl_down_sync(0xffffffffu, best, o);
    int oi = __shfl_down_sync(0xffffffffu, bestId, o);
    if (ob > best || (ob == best && oi < bestId)) {
      best = ob;
      bestId = oi;
    }
  }
  if (threadIdx.x % 32 == 0) {
    bestOf[threadIdx.x / 32] = best;
    idOf[threadIdx.x / 32] = bestId;
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < int(blockDim.x + 31) / 32; ++w)
      if (bestOf[w] > bestOf[0] ||
          (bestOf[w] == bestOf[0] && idOf[w] < idOf[0])) {
        bestOf[0] = bestOf[w];
        idOf[0] = idOf[w];
      }
  __syncthreads();
  top = bestOf[0];
  argmax = idOf[0] < V ? idOf[0] : 0;
  return __syncthreads_or(nonFinite);
}

/// exp((x - top) / temperature): a kept token's unnormalized probability.
__device__ __forceinline__ double tokenWeight(float x, float top,
                                              float temperature) {
  return (double)expf((x - top) / temperature);
}

/// The order key of the least logit kept (top-k, then top-p, by bisection
/// on the keys), and in `kept` the mass of the kept tokens.
__device__ __forceinline__ unsigned
keptThreshold(const float *l, int V, const vflow::model::RowSampling &d,
              float top, unsigned long long *cscratch, double *dscratch,
              double &kept) {
  // Top-k: the largest key t with count(key >= t) >= k.
  unsigned lo = 0;
  if (d.topK > 0 && d.topK < V) {
    unsigned hi = 0xffffffffu;
    while (lo < hi) {
      const unsigned mid = lo + (hi - lo) / 2 + 1;
      unsigned long long c = 0;
      for (int i = threadIdx.x; i < V; i += blockDim.x)
        c += orderKey(l[i]) >= mid;
      if (blockReduceSum(c, cscratch) >= (unsigned long long)d.topK)
        lo = mid;
      else
        hi = mid - 1;
    }
  }
  auto massAbove = [&](unsigned t) {
    double m = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
      if (orderKey(l[i]) >= t)
        m += tokenWeight(l[i], top, d.temperature);
    return blockReduceSum(m, dscratch);
  };
  kept = massAbove(lo);
  // Top-p: the largest key t >= lo whose tokens hold top_p of the mass.
  if (d.topP < 1) {
    const double want = double(d.topP) * kept;
    unsigned a = lo, b = orderKey(top);
    while (a < b) {
      const unsigned mid = a + (b - a) / 2 + 1;
      if (massAbove(mid) >= want)
        a = mid;
      else
        b = mid - 1;
    }
    lo = a;
    kept = massAbove(lo);
  }
  return lo;
}

/// The draw: u = uniform(seed, counter) times the kept mass, then the kept
/// tokens in id order (each thread a contiguous chunk, chunks in order)
/// until their running mass passes u. Thread 0's result.
__device__ __forceinline__ int
drawToken(const float *l, int V, const vflow::model::RowSampling &d, float top,
          unsigned lo, double kept, int argmax, double *prefix, int *lastOf) {
  const int chunk = (V + int(blockDim.x) - 1) / int(blockDim.x);
  const int begin = threadIdx.x * chunk, end = min(V, begin + chunk);
  double mine = 0;
  int lastKept = -1;
  for (int i = begin; i < end; ++i)
    if (orderKey(l[i]) >= lo) {
      mine += tokenWeight(l[i], top, d.temperature);
      lastKept = i;
    }
  prefix[threadIdx.x] = mine;
  lastOf[threadIdx.x] = lastKept;
  __syncthreads();
  if (threadIdx.x != 0)
    return argmax;
  double u = vflow::model::uniformDraw(d.seed, d.counter) * kept;
  int pick = argmax, t = 0;
  for (; t < int(blockDim.x); ++t) {
    if (lastOf[t] >= 0)
      pick = lastOf[t];
    if (u < prefix[t])
      break;
    u -= prefix[t];
  }
  if (t < int(blockDim.x)) {
    const int b0 = t * chunk, e0 = min(V, b0 + chunk);
    for (int i = b0; i < e0; ++i)
      if (orderKey(l[i]) >= lo) {
        pick = i;
        u -= tokenWeight(l[i], top, d.temperature);
        if (u < 0)
          break;
      }
  }
  return pick;
}

/// One CTA (1024 threads) per row: the sampling rule of Sampling.h.
/// Thresholds are found exactly by bisection on the logits' order keys;
/// the draw walks the tokens in id order.
__global__ void __launch_bounds__(1024)
    sampleKernel(const float *logits, int V,
                 const vflow::model::RowSampling *draws, int *out) {
  __shared__ double dscratch[33];
  __shared__ unsigned long long cscratch[33];
  __shared__ float bestOf[32];
  __shared__ int idOf[32];
  __shared__ double prefix[1024];
  __shared__ int lastOf[1024];
  const int r = blockIdx.x;
  const float *l = logits + (long long)r * V;
  const vflow::model::RowSampling d = draws[r];
  float top;
  int argmax;
  if (rowMax(l, V, bestOf, idOf, top, argmax)) {
    if (threadIdx.x == 0)
      out[r] = vflow::model::kNonFiniteLogits;
    return;
  }
  if (d.temperature <= 0) {
    if (threadIdx.x == 0)
      out[r] = argmax;
    return;
  }
  double kept = 0;
  const unsigned lo = keptThreshold(l, V, d, top, cscratch, dscratch, kept);
  const int pick = drawToken(l, V, d, top, lo, kept, argmax, prefix, lastOf);
  if (threadIdx.x == 0)
    out[r] = pick;
}

} // namespace

void vflow::model::sampleRows(const float *logits, int rows, int V,
                              const RowSampling *draws, int *tokens,
                              cudaStream_t stream) {
  if (rows > 0)
    sampleKernel<<<rows, 1024, 0, stream>>>(logits, V, draws, tokens);
}
