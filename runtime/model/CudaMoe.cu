//===- CudaMoe.cu - A mixture of experts on the GPU -----------------------===//

#include "CudaActivation.cuh"
#include "CudaBlas.h"
#include "CudaMoe.h"

#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

using namespace vflow;
using namespace vflow::model;

namespace {

typedef __nv_bfloat16 bf16;
typedef __nv_bfloat162 bf162;

/// Rows of experts or outputs one CTA computes (a warp each).
constexpr int WARPS = 8;
/// The most experts a router may have (its scores live in shared memory).
constexpr int MAX_EXPERTS = 4096;

size_t align16(size_t n) { return (n + 15) / 16 * 16; }

/// The workspace's parts, carved in this order: per expert its count of
/// entries (then the count of experts with any, one memset clears both),
/// the experts with entries in the order they got their first, each
/// expert's entries, each row's choices and weights, the hidden vectors
/// and the partial outputs.
struct Parts {
  int *counts, *numActive, *active, *entries, *chosen;
  float *weight, *hidden, *partial;
};

Parts carve(void *w, int T, int E, int I, int X, int K) {
  char *p = static_cast<char *>(w);
  Parts s;
  s.counts = reinterpret_cast<int *>(p);
  s.numActive = s.counts + X;
  p += align16(size_t(X + 1) * sizeof(int));
  s.active = reinterpret_cast<int *>(p);
  p += align16(size_t(X) * sizeof(int));
  s.entries = reinterpret_cast<int *>(p);
  p += align16(size_t(X) * T * sizeof(int));
  s.chosen = reinterpret_cast<int *>(p);
  p += align16(size_t(T) * K * sizeof(int));
  s.weight = reinterpret_cast<float *>(p);
  p += align16(size_t(T) * K * sizeof(float));
  s.hidden = reinterpret_cast<float *>(p);
  p += align16(size_t(T) * K * I * sizeof(float));
  s.partial = reinterpret_cast<float *>(p);
  return s;
}

/// The warp's best (value, index): the larger value, ties to the lower
/// index (Runner.cpp's route() order).
__device__ void warpBest(float &v, int &i) {
  for (int o = 16; o > 0; o /= 2) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (ov > v || (ov == v && oi < i)) {
      v = ov;
      i = oi;
    }
  }
}

/// The best of v[0..n) (value desc, index asc) over the warp; -1 when every
/// value is -infinity.
__device__ int bestOf(const float *v, int n) {
  float bv = -INFINITY;
  int bi = 0x7fffffff;
  for (int e = threadIdx.x; e < n; e += 32)
    if (v[e] > bv) {
      bv = v[e];
      bi = e;
    }
  warpBest(bv, bi);
  return bv == -INFINITY ? -1 : bi;
}

__device__ float warpSum(float v) {
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// One warp a row: its scores, the groups it may choose from, its K
/// experts and weights; each (row, slot) listed under its expert.
__global__ void routeKernel(MoeArgs a, Parts s) {
  extern __shared__ float sm[];
  const int X = a.experts, K = a.perToken, G = a.groups, r = blockIdx.x;
  float *p = sm, *choice = sm + X, *group = sm + 2 * X;
  int *keep = reinterpret_cast<int *>(group + G);
  const float *z = a.logits + size_t(r) * X;
  if (a.sigmoid) {
    for (int e = threadIdx.x; e < X; e += 32)
      p[e] = 1.0f / (1.0f + expf(-z[e]));
  } else {
    float top = -INFINITY;
    for (int e = threadIdx.x; e < X; e += 32)
      top = fmaxf(top, z[e]);
    for (int o = 16; o > 0; o /= 2)
      top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
    float sum = 0;
    for (int e = threadIdx.x; e < X; e += 32)
      sum += p[e] = expf(z[e] - top);
    sum = warpSum(sum);
    for (int e = threadIdx.x; e < X; e += 32)
      p[e] /= sum;
  }
  for (int e = threadIdx.x; e < X; e += 32)
    choice[e] = p[e] + (a.bias ? a.bias[e] : 0.0f);
  __syncwarp();
  if (G > 0) {
    // Rank the groups (by their best, or a sigmoid router's two best); the
    // experts of the groups not kept are out.
    const int per = X / G;
    for (int g = threadIdx.x; g < G; g += 32) {
      float b1 = -INFINITY, b2 = -INFINITY;
      for (int e = g * per; e < (g + 1) * per; ++e) {
        const float x = choice[e];
        if (x > b1) {
          b2 = b1;
          b1 = x;
        } else if (x > b2) {
          b2 = x;
        }
      }
      group[g] = a.sigmoid && per >= 2 ? b1 + b2 : b1;
      keep[g] = 0;
    }
    __syncwarp();
    for (int k = 0; k < a.keptGroups; ++k) {
      const int g = bestOf(group, G);
      __syncwarp();
      if (threadIdx.x == 0 && g >= 0) {
        keep[g] = 1;
        group[g] = -INFINITY; // out of the next ranking
      }
      __syncwarp();
    }
    for (int g = threadIdx.x; g < G; g += 32)
      if (!keep[g])
        for (int e = g * per; e < (g + 1) * per; ++e)
          choice[e] = -INFINITY;
    __syncwarp();
  }
  // A NaN score (broken logits) ranks lowest, as -infinity.
  for (int e = threadIdx.x; e < X; e += 32)
    if (isnan(choice[e]))
      choice[e] = -INFINITY;
  __syncwarp();
  float kept = 0;
  for (int j = 0; j < K; ++j) {
    int e = bestOf(choice, X);
    __syncwarp();
    if (threadIdx.x == 0) {
      // Every candidate left is -infinity: the lowest expert not chosen
      // yet, so a row's K experts stay distinct (each expert's list holds
      // at most one entry a row).
      for (int i = 0; e < 0 && i < X; ++i) {
        bool taken = false;
        for (int m = 0; m < j; ++m)
          taken = taken || s.chosen[r * K + m] == i;
        if (!taken)
          e = i;
      }
      s.chosen[r * K + j] = e;
      kept += p[e];
      choice[e] = -INFINITY;
    }
    __syncwarp();
  }
  if (threadIdx.x == 0) {
    if (a.sigmoid)
      kept += 1e-20f;
    for (int j = 0; j < K; ++j) {
      const int e = s.chosen[r * K + j];
      s.weight[r * K + j] = p[e] / (a.normalize ? kept : 1.0f) * a.scaling;
      const int pos = atomicAdd(&s.counts[e], 1);
      if (pos == 0) // the expert's first entry: it is active this step
        s.active[atomicAdd(s.numActive, 1)] = e;
      s.entries[size_t(e) * a.rows + pos] = r * K + j;
    }
  }
}

/// dot(x[0..n), w[0..n)) over the warp, both bf16, n even; 16-byte loads
/// when n is a multiple of 8 (rows then stay 16-byte aligned).
__device__ float dotBF16(const bf16 *x, const bf16 *w, int n) {
  float acc = 0;
  if (n % 8 == 0) {
    for (int j = 8 * (threadIdx.x % 32); j < n; j += 256) {
      const uint4 xa = *reinterpret_cast<const uint4 *>(x + j);
      const uint4 wa = *reinterpret_cast<const uint4 *>(w + j);
      const bf162 *xp = reinterpret_cast<const bf162 *>(&xa);
      const bf162 *wp = reinterpret_cast<const bf162 *>(&wa);
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const float2 a = __bfloat1622float2(xp[q]),
                     b = __bfloat1622float2(wp[q]);
        acc += a.x * b.x + a.y * b.y;
      }
    }
    return warpSum(acc);
  }
  for (int j = 2 * (threadIdx.x % 32); j < n; j += 64) {
    const float2 a =
        __bfloat1622float2(*reinterpret_cast<const bf162 *>(x + j));
    const float2 b =
        __bfloat1622float2(*reinterpret_cast<const bf162 *>(w + j));
    acc += a.x * b.x + a.y * b.y;
  }
  return warpSum(acc);
}

/// hidden[entry, i] = silu(x_r . gate_e[i]) * (x_r . up_e[i]) for every
/// listed entry of active expert blockIdx.x; a warp per i.
__global__ void __launch_bounds__(WARPS * 32) gateUpKernel(MoeArgs a, Parts s) {
  if (int(blockIdx.x) >= *s.numActive)
    return;
  const int e = s.active[blockIdx.x], n = s.counts[e];
  const int i = blockIdx.y * WARPS + threadIdx.x / 32;
  if (i >= a.inner)
    return;
  const int E = a.hidden, I = a.inner;
  const bf16 *g = a.gateUp + (size_t(e) * 2 * I + i) * E;
  const bf16 *u = g + size_t(I) * E;
  for (int t = 0; t < n; ++t) {
    const int ent = s.entries[size_t(e) * a.rows + t];
    const bf16 *x = a.x + size_t(ent / a.perToken) * E;
    const float gv = dotBF16(x, g, E), uv = dotBF16(x, u, E);
    if (threadIdx.x % 32 == 0)
      s.hidden[size_t(ent) * I + i] = detail::gatedActivation(gv, uv, false);
  }
}

/// partial[entry, c] = weight[entry] * (hidden[entry] . down_e[c]) for
/// active expert blockIdx.x; a warp per output c.
__global__ void __launch_bounds__(WARPS * 32) downKernel(MoeArgs a, Parts s) {
  if (int(blockIdx.x) >= *s.numActive)
    return;
  const int e = s.active[blockIdx.x], n = s.counts[e];
  const int c = blockIdx.y * WARPS + threadIdx.x / 32;
  if (c >= a.hidden)
    return;
  const int E = a.hidden, I = a.inner;
  const bf16 *w = a.down + (size_t(e) * E + c) * I;
  for (int t = 0; t < n; ++t) {
    const int ent = s.entries[size_t(e) * a.rows + t];
    const float *h = s.hidden + size_t(ent) * I;
    float acc = 0;
    for (int j = 2 * (threadIdx.x % 32); j < I; j += 64) {
      const float2 b =
          __bfloat1622float2(*reinterpret_cast<const bf162 *>(w + j));
      acc += h[j] * b.x + h[j + 1] * b.y;
    }
    acc = warpSum(acc);
    if (threadIdx.x % 32 == 0)
      s.partial[size_t(ent) * E + c] = s.weight[ent] * acc;
  }
}

/// out[r, c] = the sum of row r's K partials, in slot order.
__global__ void combineKernel(MoeArgs a, Parts s) {
  const long long n = (long long)a.rows * a.hidden;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / a.hidden, c = i - r * a.hidden;
    float sum = 0;
    for (int j = 0; j < a.perToken; ++j)
      sum += s.partial[(r * a.perToken + j) * a.hidden + c];
    a.out[i] = __float2bfloat16(sum);
  }
}

/// The grouped path: slot q of the gathered rows (experts in order, each
/// expert's rows in its list's order) takes its row of x; posOf[entry] =
/// q. Expert e's slots start at first[e].
__global__ void gatherKernel(MoeArgs a, Parts s, const int *first, int *posOf) {
  const int q = blockIdx.x, X = a.experts;
  int lo = 0, hi = X; // the last e with first[e] <= q (it has rows)
  while (lo + 1 < hi) {
    const int mid = (lo + hi) / 2;
    if (first[mid] <= q)
      lo = mid;
    else
      hi = mid;
  }
  const int ent = s.entries[size_t(lo) * a.rows + (q - first[lo])];
  if (threadIdx.x == 0)
    posOf[ent] = q;
  const bf16 *x = a.x + size_t(ent / a.perToken) * a.hidden;
  bf16 *xg = reinterpret_cast<bf16 *>(s.partial) + size_t(q) * a.hidden;
  for (int c = threadIdx.x; c < a.hidden; c += blockDim.x)
    xg[c] = x[c];
}

/// out[r, c] = the sum over row r's K choices of weight * y[posOf[...], c].
__global__ void scatterKernel(MoeArgs a, Parts s, const bf16 *y,
                              const int *posOf) {
  const long long n = (long long)a.rows * a.hidden;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long r = i / a.hidden, c = i - r * a.hidden;
    float sum = 0;
    for (int j = 0; j < a.perToken; ++j) {
      const int ent = int(r) * a.perToken + j;
      sum += s.weight[ent] *
             __bfloat162float(y[size_t(posOf[ent]) * a.hidden + c]);
    }
    a.out[i] = __float2bfloat16(sum);
  }
}

void launched(const char *what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw rt::Error(std::string("model runner (CUDA): ") + what + ": " +
                    cudaGetErrorString(e));
}

} // namespace

size_t vflow::model::moeWorkspaceBytes(int rows, int hidden, int inner,
                                       int experts, int perToken) {
  const size_t T = size_t(rows), E = size_t(hidden), I = size_t(inner),
               X = size_t(experts), K = size_t(perToken);
  return align16((X + 1) * sizeof(int)) + align16(X * sizeof(int)) +
         align16(X * T * sizeof(int)) + align16(T * K * sizeof(int)) +
         align16(T * K * sizeof(float)) + align16(T * K * I * sizeof(float)) +
         align16(T * K * E * sizeof(float));
}

namespace {

int gridOf(long long n) {
  return int(std::min<long long>((n + 255) / 256, 65535));
}

/// The experts as GEMMs after routing (moeForward's prefill path): each
/// expert's rows gathered (bf16, in `partial`'s bytes: the gathered rows,
/// then their outputs), gate/up and down through cuBLAS per expert with
/// rows, SwiGLU in between (in `hidden`'s bytes), each row's K outputs
/// weighted and summed. One sync: the experts' row counts.
void grouped(const MoeArgs &a, const Parts &s, cudaStream_t stream) {
  using vflow::model::detail::Blas;
  using vflow::model::detail::checkBlas;
  const int X = a.experts, E = a.hidden, I = a.inner;
  const long long slots = (long long)a.rows * a.perToken;
  std::vector<int> counts(static_cast<size_t>(X)),
      first(static_cast<size_t>(X));
  if (cudaMemcpyAsync(counts.data(), s.counts, X * sizeof(int),
                      cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess)
    launched("reading the experts' row counts");
  int at = 0;
  for (int e = 0; e < X; ++e) {
    first[size_t(e)] = at;
    at += counts[size_t(e)];
  }
  // The experts' first slots over the active list (routing is done with
  // it); each row's slots over its choices.
  int *firstDev = s.active, *posOf = s.chosen;
  if (cudaMemcpyAsync(firstDev, first.data(), X * sizeof(int),
                      cudaMemcpyHostToDevice, stream) != cudaSuccess)
    launched("uploading the experts' first rows");
  gatherKernel<<<unsigned(slots), 256, 0, stream>>>(a, s, firstDev, posOf);
  launched("gathering the experts' rows");
  bf16 *xg = reinterpret_cast<bf16 *>(s.partial);
  bf16 *y = xg + size_t(slots) * E;
  bf16 *gu = reinterpret_cast<bf16 *>(s.hidden);
  const float one = 1.0f, zero = 0.0f;
  const Blas &blas = Blas::get();
  checkBlas(blas.setStream(a.blas, stream), "setting the stream");
  for (int e = 0; e < X; ++e) {
    const int n = counts[size_t(e)];
    if (n == 0)
      continue;
    const size_t f = size_t(first[size_t(e)]);
    // gu[f.., 2I] = xg[f.., E] gateUp_e^T; y[f.., E] = act[f.., I] down_e^T.
    checkBlas(blas.gemmEx(a.blas, CUBLAS_OP_T, CUBLAS_OP_N, 2 * I, n, E, &one,
                          a.gateUp + size_t(e) * 2 * I * E, CUDA_R_16BF, E,
                          xg + f * E, CUDA_R_16BF, E, &zero, gu + f * 2 * I,
                          CUDA_R_16BF, 2 * I, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT),
              "an expert's gate and up GEMM");
  }
  detail::gatedKernel<<<gridOf(slots * I), 256, 0, stream>>>(gu, I, slots * I,
                                                             false);
  launched("the experts' SwiGLU");
  for (int e = 0; e < X; ++e) {
    const int n = counts[size_t(e)];
    if (n == 0)
      continue;
    const size_t f = size_t(first[size_t(e)]);
    checkBlas(blas.gemmEx(a.blas, CUBLAS_OP_T, CUBLAS_OP_N, E, n, I, &one,
                          a.down + size_t(e) * E * I, CUDA_R_16BF, I,
                          gu + f * 2 * I, CUDA_R_16BF, 2 * I, &zero, y + f * E,
                          CUDA_R_16BF, E, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT),
              "an expert's down GEMM");
  }
  scatterKernel<<<gridOf((long long)a.rows * E), 256, 0, stream>>>(a, s, y,
                                                                   posOf);
  launched("combining the experts' rows");
}

} // namespace

void vflow::model::moeForward(const MoeArgs &a, cudaStream_t stream) {
  if (a.rows == 0)
    return;
  if (a.experts > MAX_EXPERTS || a.hidden % 2 || a.inner % 2 ||
      a.perToken > a.experts)
    throw rt::Error("model runner (CUDA): a mixture of " +
                    std::to_string(a.experts) + " experts of " +
                    std::to_string(a.inner) + " over hidden " +
                    std::to_string(a.hidden) +
                    " is outside the GPU kernels' range (at most " +
                    std::to_string(MAX_EXPERTS) + " experts, even sizes)");
  Parts s =
      carve(a.workspace, a.rows, a.hidden, a.inner, a.experts, a.perToken);
  if (cudaMemsetAsync(s.counts, 0, size_t(a.experts + 1) * sizeof(int),
                      stream) != cudaSuccess)
    launched("clearing the expert lists");
  const size_t shared =
      (2 * size_t(a.experts) + size_t(a.groups)) * sizeof(float) +
      size_t(a.groups) * sizeof(int);
  routeKernel<<<a.rows, 32, shared, stream>>>(a, s);
  launched("routing");
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess)
    launched("asking whether the stream is captured");
  if (a.blas && a.rows >= kMoeGemmRows &&
      capture == cudaStreamCaptureStatusNone)
    return grouped(a, s, stream);
  // Grids over the experts that can be active (at most a row's K each):
  // a decode step of few rows launches few CTAs.
  const int slots =
      int(std::min<long long>(a.experts, (long long)a.rows * a.perToken));
  gateUpKernel<<<dim3(slots, (a.inner + WARPS - 1) / WARPS), WARPS * 32, 0,
                 stream>>>(a, s);
  launched("the experts' gate and up projections");
  downKernel<<<dim3(slots, (a.hidden + WARPS - 1) / WARPS), WARPS * 32, 0,
               stream>>>(a, s);
  launched("the experts' down projections");
  const long long n = (long long)a.rows * a.hidden;
  const int blocks = int(std::min<long long>((n + 255) / 256, 65535));
  combineKernel<<<blocks, 256, 0, stream>>>(a, s);
  launched("combining the experts");
}
