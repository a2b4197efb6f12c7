//===- CudaModel.cu - The model's math on the GPU -------------------------===//

#include "CudaActivation.cuh"
#include "CudaBlas.h"
#include "CudaModel.h"
#include "CudaMoe.h"
#include "CudaSampling.h"
#include "Internal.h"

#include "vflow/Runtime/Error.h"

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

using namespace vflow;
using namespace vflow::model;
using vflow::model::detail::Blas;
using vflow::model::detail::checkBlas;

namespace {

typedef __nv_bfloat16 bf16;

void check(cudaError_t status, const char *what) {
  if (status != cudaSuccess)
    throw rt::Error(std::string("model runner (CUDA): ") + what + ": " +
                    cudaGetErrorString(status));
}

/// A device allocation of `n` elements of T, grown on demand.
template <class T> struct Array {
  T *ptr = nullptr;
  size_t n = 0;
  Array() = default;
  Array(const Array &) = delete;
  Array &operator=(const Array &) = delete;
  Array(Array &&o) noexcept : ptr(o.ptr), n(o.n) {
    o.ptr = nullptr;
    o.n = 0;
  }
  ~Array() {
    if (ptr)
      cudaFree(ptr);
  }
  T *get(size_t count) {
    if (count > n) {
      if (ptr)
        cudaFree(ptr);
      ptr = nullptr;
      check(cudaMalloc(&ptr, count * sizeof(T)), "allocating");
      n = count;
    }
    return ptr;
  }
};

__device__ float blockSum(float v) {
  __shared__ float part[32];
  for (int o = 16; o > 0; o /= 2)
    v += __shfl_down_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0)
    part[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) / 32;
  v = threadIdx.x < warps ? part[threadIdx.x] : 0.0f;
  if (warp == 0)
    for (int o = 16; o > 0; o /= 2)
      v += __shfl_down_sync(0xffffffffu, v, o);
  __shared__ float total;
  if (threadIdx.x == 0)
    total = v;
  __syncthreads();
  float out = total;
  __syncthreads();
  return out;
}

/// x[r] = table[ids[r]] * scale (Gemma scales its embeddings).
__global__ void embedKernel(const bf16 *table, const int *ids, int E,
                            float scale, float *x) {
  const int r = blockIdx.x;
  const bf16 *row = table + (long long)ids[r] * E;
  for (int e = threadIdx.x; e < E; e += blockDim.x)
    x[(long long)r * E + e] = __bfloat162float(row[e]) * scale;
}

/// With `y`: x[src] += y[src]; then out[r] = rmsnorm(x[src]) * (w + wOffset)
/// in bf16 (Gemma's norms scale by 1 + w), src = rows[r] (r itself when rows
/// is null). One CTA per row, each thread's PER elements in registers:
/// every load is issued before the first store, so `out` may be `y`.
template <int PER, int THREADS>
__global__ void __launch_bounds__(THREADS)
    addNormKernel(float *x, const bf16 *y, const int *rows, int n,
                  const bf16 *w, float wOffset, float eps, bf16 *out) {
  const int r = blockIdx.x;
  const long long src = (long long)(rows ? rows[r] : r) * n;
  float *xr = x + src;
  float v[PER], s = 0;
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    v[i] = j < n ? xr[j] : 0.0f;
  }
  if (y) {
    float add[PER];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      add[i] = j < n ? __bfloat162float(y[src + j]) : 0.0f;
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
      const int j = threadIdx.x + i * blockDim.x;
      v[i] += add[i];
      if (j < n)
        xr[j] = v[i];
    }
  }
#pragma unroll
  for (int i = 0; i < PER; ++i)
    s += v[i] * v[i];
  const float inv = rsqrtf(blockSum(s) / float(n) + eps);
#pragma unroll
  for (int i = 0; i < PER; ++i) {
    const int j = threadIdx.x + i * blockDim.x;
    if (j < n)
      out[(long long)r * n + j] =
          __float2bfloat16(v[i] * inv * (__bfloat162float(w[j]) + wOffset));
  }
}

/// out[r] = rmsnorm(in[r]) * (w + wOffset), bf16 rows of `n` (Gemma's norms
/// of the attention's and the MLP's outputs); `out` may be `in`.
__global__ void normRowsKernel(const bf16 *in, int n, const bf16 *w,
                               float wOffset, float eps, bf16 *out) {
  const long long r = blockIdx.x;
  float s = 0;
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float v = __bfloat162float(in[r * n + j]);
    s += v * v;
  }
  const float inv = rsqrtf(blockSum(s) / float(n) + eps);
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    out[r * n + j] = __float2bfloat16(__bfloat162float(in[r * n + j]) * inv *
                                      (__bfloat162float(w[j]) + wOffset));
}

/// Launches addNormKernel for rows of `n` (at most 16,384) elements.
void addNorm(int rowCount, float *x, const bf16 *y, const int *rows, int n,
             const bf16 *w, float wOffset, float eps, bf16 *out,
             cudaStream_t st) {
  if (n <= 2048)
    addNormKernel<8, 256>
        <<<rowCount, 256, 0, st>>>(x, y, rows, n, w, wOffset, eps, out);
  else if (n <= 4096)
    addNormKernel<16, 256>
        <<<rowCount, 256, 0, st>>>(x, y, rows, n, w, wOffset, eps, out);
  else if (n <= 8192)
    addNormKernel<32, 256>
        <<<rowCount, 256, 0, st>>>(x, y, rows, n, w, wOffset, eps, out);
  else
    addNormKernel<16, 1024>
        <<<rowCount, 1024, 0, st>>>(x, y, rows, n, w, wOffset, eps, out);
}

/// The attention inputs of one row and head from the fused QKV product
/// (row layout [q heads, k heads, v heads] x D): the bias (when `bias`),
/// then for q and k heads the head's RMSNorm (when its weight is given)
/// and RoPE in Hugging Face's layout (halves rotate together) at the
/// row's position; v heads are copied. Grid (rows, Hq + 2 Hkv), D / 2
/// threads (thread i rotates the pair i, i + D / 2).
__global__ void qkvPrepareKernel(const bf16 *qkv, const bf16 *bias, int Hq,
                                 int Hkv, int D, const bf16 *qNorm,
                                 const bf16 *kNorm, float wOffset, float eps,
                                 const int *positions, const float *invFreq,
                                 float ropeFactor, bf16 *q, bf16 *k, bf16 *v) {
  const int r = blockIdx.x, slot = blockIdx.y, half = D / 2;
  const int width = (Hq + 2 * Hkv) * D;
  const bf16 *in = qkv + (long long)r * width + (long long)slot * D;
  const int i = threadIdx.x;
  auto value = [&](int e) {
    float f = __bfloat162float(in[e]);
    if (bias)
      f = __bfloat162float(
          __float2bfloat16(f + __bfloat162float(bias[slot * D + e])));
    return f;
  };
  float a = value(i), b = value(i + half);
  if (slot >= Hq + Hkv) {
    bf16 *out = v + ((long long)r * Hkv + (slot - Hq - Hkv)) * D;
    out[i] = __float2bfloat16(a);
    out[i + half] = __float2bfloat16(b);
    return;
  }
  const bool isQ = slot < Hq;
  const bf16 *w = isQ ? qNorm : kNorm;
  bf16 *out = isQ ? q + ((long long)r * Hq + slot) * D
                  : k + ((long long)r * Hkv + (slot - Hq)) * D;
  if (w) {
    const float inv = rsqrtf(blockSum(a * a + b * b) / float(D) + eps);
    a = __bfloat162float(__float2bfloat16(a * inv)) *
        (__bfloat162float(w[i]) + wOffset);
    b = __bfloat162float(__float2bfloat16(b * inv)) *
        (__bfloat162float(w[i + half]) + wOffset);
  }
  float c, sn;
  sincosf(float(positions[r]) * invFreq[i], &sn, &c);
  c *= ropeFactor;
  sn *= ropeFactor;
  out[i] = __float2bfloat16(a * c - b * sn);
  out[i + half] = __float2bfloat16(b * c + a * sn);
}

/// RoPE of one head's `d` dims at x (in place) at `pos`: thread i rotates
/// pair i, the dims (2i, 2i + 1) when `interleaved` (DeepSeek's layout),
/// else (i, i + d / 2); cos and sin times `factor` (YaRN's).
__device__ void ropeHead(float *x, int d, int pos, const float *invFreq,
                         float factor, bool interleaved, int i) {
  const int ia = interleaved ? 2 * i : i,
            ib = interleaved ? 2 * i + 1 : i + d / 2;
  float c, sn;
  sincosf(float(pos) * invFreq[i], &sn, &c);
  c *= factor;
  sn *= factor;
  const float a = x[ia], b = x[ib];
  x[ia] = a * c - b * sn;
  x[ib] = b * c + a * sn;
}

/// Multi-head latent attention's cached rows, in place in `row` [T, C + R]
/// (kv_a_proj_with_mqa's output): the latent c = RMSNorm(row[:C]) * w, then
/// k_pe = RoPE(row[C:]). One CTA a row.
__global__ void latentRowKernel(bf16 *row, int C, int R, const bf16 *w,
                                float wOffset, float eps, const int *positions,
                                const float *invFreq, float factor,
                                bool interleaved) {
  __shared__ float pe[256];
  bf16 *x = row + (long long)blockIdx.x * (C + R);
  float s = 0;
  for (int j = threadIdx.x; j < C; j += blockDim.x) {
    const float v = __bfloat162float(x[j]);
    s += v * v;
  }
  const float inv = rsqrtf(blockSum(s) / float(C) + eps);
  for (int j = threadIdx.x; j < C; j += blockDim.x)
    x[j] = __float2bfloat16(__bfloat162float(x[j]) * inv *
                            (__bfloat162float(w[j]) + wOffset));
  for (int j = threadIdx.x; j < R; j += blockDim.x)
    pe[j] = __bfloat162float(x[C + j]);
  __syncthreads();
  if (threadIdx.x < R / 2)
    ropeHead(pe, R, positions[blockIdx.x], invFreq, factor, interleaved,
             threadIdx.x);
  __syncthreads();
  for (int j = threadIdx.x; j < R; j += blockDim.x)
    x[C + j] = __float2bfloat16(pe[j]);
}

/// The absorbed queries' rotary part: q_pe of row blockIdx.x, head
/// blockIdx.y (q [T, H, N + R], its last R) rotated into qw [T, H, C + R]'s
/// last R. R / 2 threads.
__global__ void queryPeKernel(const bf16 *q, int H, int N, int R, int C,
                              const int *positions, const float *invFreq,
                              float factor, bool interleaved, bf16 *qw) {
  __shared__ float pe[256];
  const long long t = blockIdx.x, h = blockIdx.y;
  const bf16 *in = q + (t * H + h) * (N + R) + N;
  for (int j = threadIdx.x; j < R; j += blockDim.x)
    pe[j] = __bfloat162float(in[j]);
  __syncthreads();
  ropeHead(pe, R, positions[t], invFreq, factor, interleaved, threadIdx.x);
  __syncthreads();
  bf16 *out = qw + (t * H + h) * (C + R) + C;
  for (int j = threadIdx.x; j < R; j += blockDim.x)
    out[j] = __float2bfloat16(pe[j]);
}

/// a[i] += b[i] (bf16; DeepSeek's shared experts onto the routed ones).
__global__ void addKernel(bf16 *a, const bf16 *b, long long n) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x)
    a[i] = __float2bfloat16(__bfloat162float(a[i]) + __bfloat162float(b[i]));
}

unsigned gridFor(long long n) {
  long long blocks = (n + 255) / 256;
  return unsigned(blocks < 4096 ? blocks : 4096);
}

/// The activations and step inputs of one forward. The eager path grows
/// its own; CUDA graphs use one set sized for the largest batch, never
/// reallocated (a graph keeps its pointers).
struct Buffers {
  Array<float> x, logits;
  Array<bf16> h, qkv, q, k, v, attn, gu, last;
  Array<int> ids, positions, lastRows, tokens;
  Array<vflow::model::RowSampling> draws;
  /// A mixture of experts' router logits [T, X] and workspace.
  Array<float> routerLogits;
  Array<unsigned char> moe;
  /// Multi-head latent attention: q_a [T, qLoraRank], the queries [T, H,
  /// N + R], the heads' outputs [T, H, Vd]; DeepSeek's shared experts'
  /// gate/up [T, 2 S] and output [T, E].
  Array<bf16> qa, qFull, heads, sharedGu, shared;

  void reserve(const ModelConfig &c, int T, int B) {
    const size_t E = size_t(c.hiddenSize), D = size_t(c.headDim);
    const size_t Hq = size_t(c.numHeads), Hkv = size_t(c.numKVHeads);
    x.get(size_t(T) * E);
    h.get(size_t(T) * std::max(E, Hq * D));
    qkv.get(size_t(T) * (Hq + 2 * Hkv) * D);
    q.get(size_t(T) * Hq * D);
    k.get(size_t(T) * Hkv * D);
    v.get(size_t(T) * Hkv * D);
    attn.get(size_t(T) * Hq * D);
    gu.get(size_t(T) * 2 * size_t(c.intermediateSize));
    last.get(size_t(B) * E);
    logits.get(size_t(B) * size_t(c.vocabSize));
    ids.get(size_t(T));
    positions.get(size_t(T));
    lastRows.get(size_t(B));
    tokens.get(size_t(B));
    draws.get(size_t(B));
    if (c.mla()) {
      const size_t H = size_t(c.numHeads);
      qa.get(size_t(T) * size_t(std::max<int64_t>(1, c.qLoraRank)));
      qFull.get(size_t(T) * H * size_t(c.qkNopeHeadDim + c.qkRopeHeadDim));
      heads.get(size_t(T) * H * size_t(c.vHeadDim));
    }
    if (c.numSharedExperts > 0) {
      const size_t S = size_t(c.numSharedExperts * c.expertIntermediateSize);
      sharedGu.get(size_t(T) * 2 * S);
      shared.get(size_t(T) * E);
    }
    if (c.numExperts > 0) {
      routerLogits.get(size_t(T) * size_t(c.numExperts));
      moe.get(moeWorkspaceBytes(T, int(c.hiddenSize),
                                int(c.expertIntermediateSize),
                                int(c.numExperts), int(c.expertsPerToken)));
    }
  }
};

} // namespace

struct CudaModel::Impl {
  ModelConfig cfg;
  int maxBatch = 0;
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  /// Q, K and V (and their biases) as one [(Hq + 2 Hkv) D, E] matrix,
  /// gate and up as one [2 I, E]: one GEMM each. A mixture of experts'
  /// layer: its router [X, E], gateUp [X, 2 I, E] (each expert's gate rows,
  /// then its up rows) and down [X, E, I].
  /// Gemma's sandwich norms: attnOutNorm and mlpOutNorm (the outputs'),
  /// postNorm is then its pre_feedforward_layernorm. A sliding layer
  /// rotates with localInvFreq.
  /// MLA: qA, qANorm, qB (or wq), kvA, kvANorm, kvB as the checkpoint
  /// holds them. DeepSeek's experts: routerBias (V3's, f32) and the shared
  /// experts' sharedGateUp [2 S, E] and sharedDown [E, S].
  struct Layer {
    Array<bf16> inputNorm, postNorm, wqkv, wo, bqkv, qNorm, kNorm, gateUp, down,
        router, attnOutNorm, mlpOutNorm;
    Array<bf16> qA, qANorm, qB, wq, kvA, kvANorm, kvB, sharedGateUp, sharedDown;
    Array<float> routerBias;
    bool sliding = false;
  };
  float ropeFactor = 1.0f;
  std::vector<Layer> layers;
  Array<bf16> embed, finalNorm, lmHead;
  Array<float> invFreq, localInvFreq;
  Buffers eager, graphed;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> marks;
  /// Timing events, made once and reused step after step.
  std::vector<cudaEvent_t> events;
  size_t eventsUsed = 0;

  cudaEvent_t event() {
    if (eventsUsed == events.size()) {
      cudaEvent_t e;
      check(cudaEventCreate(&e), "creating an event");
      events.push_back(e);
    }
    return events[eventsUsed++];
  }
  /// Decode graphs by the session's step key; keys seen once (their first
  /// step runs eagerly, loading every kernel before a capture).
  std::unordered_map<rt::StepKey, cudaGraphExec_t, rt::StepKeyHash> graphs;
  std::unordered_set<rt::StepKey, rt::StepKeyHash> warm, failed;

  void upload(const ModelWeights &w, const std::string &name, Array<bf16> &a) {
    uploadRows(w, {name}, a);
  }

  /// The named tensors, stacked in order, as one bf16 array; a missing one
  /// is zeros of `missing` elements (nothing at all when every one is
  /// missing).
  void uploadRows(const ModelWeights &w, const std::vector<std::string> &names,
                  Array<bf16> &a, const std::vector<int64_t> &missing = {}) {
    std::vector<int64_t> sizes;
    bool any = false;
    for (size_t i = 0; i < names.size(); ++i) {
      const bool has = w.has(names[i]);
      any = any || has;
      sizes.push_back(has ? w.numElements(names[i])
                          : (i < missing.size() ? missing[i] : 0));
    }
    if (!any)
      return;
    int64_t total = 0;
    for (int64_t n : sizes)
      total += n;
    std::vector<uint16_t> host(size_t(total), 0);
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      if (w.has(names[i]))
        w.toBF16(names[i], host.data() + at);
      at += sizes[i];
    }
    check(cudaMemcpy(a.get(host.size()), host.data(), host.size() * 2,
                     cudaMemcpyHostToDevice),
          "uploading weights");
  }

  /// out[rows, n] = in[rows, k] * w[n, k]^T, bf16 (or f32 out); rows of
  /// `in` are `ldIn` elements apart (k when 0).
  void linear(const bf16 *in, int rows, int k, const bf16 *w, int n, void *out,
              bool f32Out = false, int ldIn = 0) {
    if (rows == 0)
      return;
    const float one = 1.0f, zero = 0.0f;
    checkBlas(Blas::get().gemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k,
                                 &one, w, CUDA_R_16BF, k, in, CUDA_R_16BF,
                                 ldIn ? ldIn : k, &zero, out,
                                 f32Out ? CUDA_R_32F : CUDA_R_16BF, n,
                                 CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "a GEMM");
  }

  /// Uploads a step's inputs into `b` (on the stream).
  void inputs(Buffers &b, const std::vector<int32_t> &ids,
              const std::vector<int64_t> &positions,
              const std::vector<int64_t> *lastRows,
              const std::vector<RowSampling> *draws) {
    auto put = [&](void *dst, const void *src, size_t bytes) {
      if (bytes)
        check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream),
              "uploading the step's inputs");
    };
    std::vector<int> id(ids.begin(), ids.end()),
        pos(positions.begin(), positions.end());
    put(b.ids.ptr, id.data(), id.size() * sizeof(int));
    put(b.positions.ptr, pos.data(), pos.size() * sizeof(int));
    if (lastRows) {
      std::vector<int> lr(lastRows->begin(), lastRows->end());
      put(b.lastRows.ptr, lr.data(), lr.size() * sizeof(int));
    }
    if (draws)
      put(b.draws.ptr, draws->data(), draws->size() * sizeof(RowSampling));
    // A copy from pageable memory returns once its bytes are staged, so
    // the host vectors may go; the stream orders the copies before the
    // kernels.
  }

  /// The model's kernels for T rows; logits of B rows (lastRows, or rows
  /// 0..B-1 when `rowsAreLast`), then tokens when `sample`. `timed`
  /// brackets each kind of work with events (not inside a capture).
  void body(Buffers &b, int T, int B, bool rowsAreLast, bool sample,
            const Attend &attend, bool timing, std::vector<int> &kinds) {
    const ModelConfig &c = cfg;
    const int E = int(c.hiddenSize), D = int(c.headDim), Hq = int(c.numHeads),
              Hkv = int(c.numKVHeads), I = int(c.intermediateSize),
              V = int(c.vocabSize);
    const float eps = float(c.rmsNormEps), off = float(c.normWeightOffset);
    cudaStream_t st = stream;
    float *x = b.x.ptr;
    bf16 *h = b.h.ptr, *qkv = b.qkv.ptr, *q = b.q.ptr, *k = b.k.ptr,
         *v = b.v.ptr, *attn = b.attn.ptr, *gu = b.gu.ptr;
    auto timed = [&](int kind, auto work) {
      if (!timing) {
        work();
        return;
      }
      cudaEvent_t e0 = event(), e1 = event();
      check(cudaEventRecord(e0, st), "recording an event");
      work();
      check(cudaEventRecord(e1, st), "recording an event");
      marks.push_back({e0, e1});
      kinds.push_back(kind);
    };
    timed(2, [&] {
      embedKernel<<<T, 256, 0, st>>>(embed.ptr, b.ids.ptr, E,
                                     float(c.embedScale), x);
    });
    const int Wqkv = (Hq + 2 * Hkv) * D;
    for (int l = 0; l < int(c.numLayers); ++l) {
      Layer &L = layers[size_t(l)];
      // The residual of the previous layer's MLP (in h), then the norm.
      timed(2, [&] {
        addNorm(T, x, l ? h : nullptr, nullptr, E, L.inputNorm.ptr, off, eps, h,
                st);
      });
      if (c.mla()) {
        latentAttention(b, L, l, T, attend, timed);
      } else {
        timed(0, [&] { linear(h, T, E, L.wqkv.ptr, Wqkv, qkv); });
        timed(2, [&] {
          qkvPrepareKernel<<<dim3(T, Hq + 2 * Hkv), D / 2, 0, st>>>(
              qkv, L.bqkv.ptr, Hq, Hkv, D, L.qNorm.ptr, L.kNorm.ptr, off, eps,
              b.positions.ptr, L.sliding ? localInvFreq.ptr : invFreq.ptr,
              ropeFactor, q, k, v);
        });
        check(cudaGetLastError(), "launching the attention inputs");
        timed(1, [&] { attend(l, q, k, v, attn, st); });
        timed(0, [&] { linear(attn, T, Hq * D, L.wo.ptr, E, h); });
      }
      timed(2, [&] {
        normRows(T, L.attnOutNorm.ptr, h);
        addNorm(T, x, h, nullptr, E, L.postNorm.ptr, off, eps, h, st);
      });
      if (L.router.ptr) {
        timed(0, [&] { experts(b, L, T); });
        continue;
      }
      timed(0, [&] { linear(h, T, E, L.gateUp.ptr, 2 * I, gu); });
      timed(2, [&] {
        detail::gatedKernel<<<gridFor((long long)T * I), 256, 0, st>>>(
            gu, I, (long long)T * I, c.activation == "gelu_tanh");
      });
      timed(0, [&] { linear(gu, T, I, L.down.ptr, E, h, false, 2 * I); });
      timed(2, [&] { normRows(T, L.mlpOutNorm.ptr, h); });
    }
    // The last MLP's residual and the final norm, on the logits' rows.
    timed(2, [&] {
      addNorm(B, x, h, rowsAreLast ? nullptr : b.lastRows.ptr, E, finalNorm.ptr,
              off, eps, b.last.ptr, st);
    });
    timed(0, [&] {
      linear(b.last.ptr, B, E, cfg.tieEmbeddings ? embed.ptr : lmHead.ptr, V,
             b.logits.ptr, true);
    });
    if (sample)
      timed(3, [&] {
        sampleRows(b.logits.ptr, B, V, b.draws.ptr, b.tokens.ptr, st);
      });
    check(cudaGetLastError(), "launching the model's kernels");
  }

  /// h [T, hidden] = rmsnorm(h) * (w + offset) when `w` (Gemma's norms of
  /// the attention's and MLP's outputs); nothing without.
  void normRows(int T, const bf16 *w, bf16 *h) {
    if (!w || T == 0)
      return;
    normRowsKernel<<<T, 256, 0, stream>>>(h, int(cfg.hiddenSize), w,
                                          float(cfg.normWeightOffset),
                                          float(cfg.rmsNormEps), h);
  }

  /// A mixture of experts' layer on h [T, E] (normed), its output in h.
  void experts(Buffers &b, Layer &L, int T) {
    const ModelConfig &c = cfg;
    linear(b.h.ptr, T, int(c.hiddenSize), L.router.ptr, int(c.numExperts),
           b.routerLogits.ptr, true);
    MoeArgs a;
    a.rows = T;
    a.hidden = int(c.hiddenSize);
    a.inner = int(c.expertIntermediateSize);
    a.experts = int(c.numExperts);
    a.perToken = int(c.expertsPerToken);
    a.groups = int(c.expertGroups);
    a.keptGroups = int(c.topkGroups);
    a.sigmoid = c.sigmoidRouter;
    a.normalize = c.normTopKProb;
    a.scaling = float(c.routedScalingFactor);
    a.logits = b.routerLogits.ptr;
    a.bias = L.routerBias.ptr;
    a.x = b.h.ptr;
    a.gateUp = L.gateUp.ptr;
    a.down = L.down.ptr;
    a.out = b.h.ptr;
    a.workspace = b.moe.ptr;
    a.blas = blas;
    // DeepSeek's shared experts take every row: their MLP of h first (the
    // routed experts write over h), added after.
    const int S = int(c.numSharedExperts * c.expertIntermediateSize);
    if (S > 0) {
      linear(b.h.ptr, T, a.hidden, L.sharedGateUp.ptr, 2 * S, b.sharedGu.ptr);
      detail::gatedKernel<<<gridFor((long long)T * S), 256, 0, stream>>>(
          b.sharedGu.ptr, S, (long long)T * S, false);
      linear(b.sharedGu.ptr, T, S, L.sharedDown.ptr, a.hidden, b.shared.ptr,
             false, 2 * S);
    }
    moeForward(a, stream);
    if (S > 0) {
      const long long n = (long long)T * a.hidden;
      addKernel<<<gridFor(n), 256, 0, stream>>>(b.h.ptr, b.shared.ptr, n);
      check(cudaGetLastError(), "adding the shared experts");
    }
  }

  /// C_h = A_h op(B_h) for every head h (column-major, as cuBLAS): m x n
  /// results of k-long sums, each operand strided per head.
  void perHead(cublasOperation_t opA, int m, int n, int k, const bf16 *a,
               int lda, long long strideA, const bf16 *bm, int ldb,
               long long strideB, bf16 *cm, int ldc, long long strideC,
               int heads) {
    if (n == 0)
      return;
    const float one = 1.0f, zero = 0.0f;
    checkBlas(Blas::get().gemmBatched(blas, opA, CUBLAS_OP_N, m, n, k, &one, a,
                                      CUDA_R_16BF, lda, strideA, bm,
                                      CUDA_R_16BF, ldb, strideB, &zero, cm,
                                      CUDA_R_16BF, ldc, strideC, heads,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "a per-head GEMM");
  }

  /// Multi-head latent attention of h [T, E] (normed) into h (Runner.cpp's
  /// latentAttention on the device): the queries, the cached rows [c; k_pe]
  /// (written by `attend`), the absorbed queries [q_nope W_UK[h]; q_pe],
  /// attention whose values are the rows, each head's latent output times
  /// W_UV[h]^T, o_proj.
  template <class Timed>
  void latentAttention(Buffers &b, Layer &L, int l, int T, const Attend &attend,
                       Timed &timed) {
    const ModelConfig &c = cfg;
    const int E = int(c.hiddenSize), H = int(c.numHeads);
    const int C = int(c.kvLoraRank), R = int(c.qkRopeHeadDim),
              N = int(c.qkNopeHeadDim), Vd = int(c.vHeadDim), W = C + R;
    const float eps = float(c.rmsNormEps);
    cudaStream_t st = stream;
    bf16 *h = b.h.ptr, *qf = b.qFull.ptr, *row = b.k.ptr, *qw = b.q.ptr,
         *attn = b.attn.ptr;
    timed(0, [&] {
      if (c.qLoraRank > 0) {
        const int Qr = int(c.qLoraRank);
        linear(h, T, E, L.qA.ptr, Qr, b.qa.ptr);
        normRowsKernel<<<T, 256, 0, st>>>(b.qa.ptr, Qr, L.qANorm.ptr,
                                          float(c.normWeightOffset), eps,
                                          b.qa.ptr);
        linear(b.qa.ptr, T, Qr, L.qB.ptr, H * (N + R), qf);
      } else {
        linear(h, T, E, L.wq.ptr, H * (N + R), qf);
      }
      linear(h, T, E, L.kvA.ptr, W, row);
      // qw[t, h, :C] = q_nope[t, h] W_UK[h] (W_UK[h]: kv_b_proj's rows
      // h (N + Vd) .. + N, [N, C]).
      perHead(CUBLAS_OP_N, C, T, N, L.kvB.ptr, C, (long long)(N + Vd) * C, qf,
              H * (N + R), N + R, qw, H * W, W, H);
    });
    timed(2, [&] {
      latentRowKernel<<<T, 256, 0, st>>>(
          row, C, R, L.kvANorm.ptr, float(c.normWeightOffset), eps,
          b.positions.ptr, invFreq.ptr, ropeFactor, c.ropeInterleaved);
      queryPeKernel<<<dim3(T, H), R / 2, 0, st>>>(
          qf, H, N, R, C, b.positions.ptr, invFreq.ptr, ropeFactor,
          c.ropeInterleaved, qw);
    });
    check(cudaGetLastError(), "launching the latent attention's inputs");
    // The values are the cached rows themselves (V = K).
    timed(1, [&] { attend(l, qw, row, row, attn, st); });
    timed(0, [&] {
      // heads[t, h] = attn[t, h, :C] W_UV[h]^T (W_UV[h]: kv_b_proj's rows
      // h (N + Vd) + N .. + Vd, [Vd, C]).
      perHead(CUBLAS_OP_T, Vd, T, C, L.kvB.ptr + size_t(N) * C, C,
              (long long)(N + Vd) * C, attn, H * W, W, b.heads.ptr, H * Vd, Vd,
              H);
      linear(b.heads.ptr, T, H * Vd, L.wo.ptr, E, h);
    });
  }

  void clearMarks() {
    marks.clear();
    eventsUsed = 0;
  }

  void readMarks(const std::vector<int> &kinds, ForwardTimes &times) {
    for (size_t i = 0; i < marks.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, marks[i].first, marks[i].second),
            "timing");
      (kinds[i] == 0   ? times.gemmMs
       : kinds[i] == 1 ? times.attentionMs
       : kinds[i] == 3 ? times.samplingMs
                       : times.otherMs) += ms;
    }
  }

  std::vector<int32_t> readTokens(Buffers &b, int B) {
    std::vector<int> picked(static_cast<size_t>(B));
    check(cudaMemcpyAsync(picked.data(), b.tokens.ptr, B * sizeof(int),
                          cudaMemcpyDeviceToHost, stream),
          "reading the tokens");
    check(cudaStreamSynchronize(stream), "running the model");
    return std::vector<int32_t>(picked.begin(), picked.end());
  }
};

CudaModel::CudaModel(const ModelWeights &weights, const ModelConfig &config,
                     int maxBatch)
    : impl(std::make_unique<Impl>()) {
  Impl &s = *impl;
  if (config.hiddenSize > 16384)
    throw rt::Error("model runner (CUDA): hidden_size " +
                    std::to_string(config.hiddenSize) +
                    " is over the 16,384 the GPU kernels handle");
  if (config.mla() && (config.qkRopeHeadDim % 2 || config.qkRopeHeadDim > 256))
    throw rt::Error("model runner (CUDA): qk_rope_head_dim " +
                    std::to_string(config.qkRopeHeadDim) +
                    " is not an even number of at most 256 (the GPU's "
                    "latent RoPE kernels)");
  s.cfg = config;
  s.maxBatch = std::max(1, maxBatch);
  check(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking),
        "creating a stream");
  checkBlas(Blas::get().create(&s.blas), "creating a handle");
  checkBlas(Blas::get().setStream(s.blas, s.stream), "setting the stream");
  s.upload(weights, "model.embed_tokens.weight", s.embed);
  s.upload(weights, "model.norm.weight", s.finalNorm);
  if (!config.tieEmbeddings)
    s.upload(weights, "lm_head.weight", s.lmHead);
  for (auto [inv, dev] :
       {std::make_pair(ropeInverseFrequencies(config), &s.invFreq),
        std::make_pair(ropeLocalInverseFrequencies(config), &s.localInvFreq)})
    check(cudaMemcpy(dev->get(inv.size()), inv.data(),
                     inv.size() * sizeof(float), cudaMemcpyHostToDevice),
          "uploading RoPE frequencies");
  s.ropeFactor = float(ropeAttentionFactor(config));
  s.layers.resize(size_t(config.numLayers));
  for (int64_t l = 0; l < config.numLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Impl::Layer &L = s.layers[size_t(l)];
    s.upload(weights, p + "input_layernorm.weight", L.inputNorm);
    L.sliding = config.slidingLayer(l);
    if (config.sandwichNorms) {
      s.upload(weights, p + "post_attention_layernorm.weight", L.attnOutNorm);
      s.upload(weights, p + "pre_feedforward_layernorm.weight", L.postNorm);
      s.upload(weights, p + "post_feedforward_layernorm.weight", L.mlpOutNorm);
    } else {
      s.upload(weights, p + "post_attention_layernorm.weight", L.postNorm);
    }
    const int64_t D = config.headDim, Wq = config.numHeads * D,
                  Wkv = config.numKVHeads * D;
    if (config.mla()) {
      const std::string a = p + "self_attn.";
      if (config.qLoraRank > 0) {
        s.upload(weights, a + "q_a_proj.weight", L.qA);
        s.upload(weights, a + "q_a_layernorm.weight", L.qANorm);
        s.upload(weights, a + "q_b_proj.weight", L.qB);
      } else {
        s.upload(weights, a + "q_proj.weight", L.wq);
      }
      s.upload(weights, a + "kv_a_proj_with_mqa.weight", L.kvA);
      s.upload(weights, a + "kv_a_layernorm.weight", L.kvANorm);
      s.upload(weights, a + "kv_b_proj.weight", L.kvB);
    } else {
      s.uploadRows(weights,
                   {p + "self_attn.q_proj.weight",
                    p + "self_attn.k_proj.weight",
                    p + "self_attn.v_proj.weight"},
                   L.wqkv);
    }
    s.upload(weights, p + "self_attn.o_proj.weight", L.wo);
    s.uploadRows(weights,
                 {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias",
                  p + "self_attn.v_proj.bias"},
                 L.bqkv, {Wq, Wkv, Wkv});
    s.upload(weights, p + "self_attn.q_norm.weight", L.qNorm);
    s.upload(weights, p + "self_attn.k_norm.weight", L.kNorm);
    if (config.moeLayer(l)) {
      const detail::ExpertNames moe(config.arch, l);
      std::vector<std::string> gateUp, down;
      for (int64_t e = 0; e < config.numExperts; ++e) {
        gateUp.push_back(moe.gate(e));
        gateUp.push_back(moe.up(e));
        down.push_back(moe.down(e));
      }
      s.upload(weights, moe.router, L.router);
      s.uploadRows(weights, gateUp, L.gateUp);
      s.uploadRows(weights, down, L.down);
      if (config.sigmoidRouter) {
        const std::vector<float> bias =
            weights.toFloat(p + "mlp.gate.e_score_correction_bias");
        check(cudaMemcpy(L.routerBias.get(bias.size()), bias.data(),
                         bias.size() * sizeof(float), cudaMemcpyHostToDevice),
              "uploading the router's bias");
      }
      if (config.numSharedExperts > 0) {
        const std::string e = p + "mlp.shared_experts.";
        s.uploadRows(weights, {e + "gate_proj.weight", e + "up_proj.weight"},
                     L.sharedGateUp);
        s.upload(weights, e + "down_proj.weight", L.sharedDown);
      }
      continue;
    }
    s.uploadRows(weights,
                 {p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"},
                 L.gateUp);
    s.upload(weights, p + "mlp.down_proj.weight", L.down);
  }
  // Graph buffers: the largest decode batch, allocated once.
  s.graphed.reserve(config, s.maxBatch, s.maxBatch);
}

CudaModel::~CudaModel() {
  for (auto &g : impl->graphs)
    cudaGraphExecDestroy(g.second);
  for (cudaEvent_t e : impl->events)
    cudaEventDestroy(e);
  if (impl->blas)
    Blas::get().destroy(impl->blas);
  if (impl->stream) {
    cudaStreamSynchronize(impl->stream);
    cudaStreamDestroy(impl->stream);
  }
}

void *CudaModel::stream() const { return impl->stream; }

void CudaModel::forward(const std::vector<int32_t> &ids,
                        const std::vector<int64_t> &positions,
                        const std::vector<int64_t> &lastRows,
                        const Attend &attend, ForwardTimes &times,
                        const std::vector<RowSampling> *draws,
                        std::vector<float> *logitsOut,
                        std::vector<int32_t> *tokensOut) {
  Impl &s = *impl;
  const int T = int(ids.size()), B = int(lastRows.size());
  Buffers &b = s.eager;
  b.reserve(s.cfg, T, B);
  s.inputs(b, ids, positions, &lastRows, draws);
  s.clearMarks();
  std::vector<int> kinds;
  s.body(b, T, B, false, draws != nullptr, attend, true, kinds);
  if (draws) {
    *tokensOut = s.readTokens(b, B);
  } else {
    logitsOut->resize(size_t(B) * size_t(s.cfg.vocabSize));
    check(cudaMemcpyAsync(logitsOut->data(), b.logits.ptr,
                          logitsOut->size() * sizeof(float),
                          cudaMemcpyDeviceToHost, s.stream),
          "reading the logits");
    check(cudaStreamSynchronize(s.stream), "running the model");
  }
  s.readMarks(kinds, times);
}

bool CudaModel::decodeStep(const std::vector<int32_t> &ids,
                           const std::vector<int64_t> &positions,
                           const std::vector<RowSampling> &draws,
                           const rt::StepKey &key, const Attend &stepLayer,
                           ForwardTimes &times, std::vector<int32_t> &tokens) {
  Impl &s = *impl;
  const int B = int(ids.size());
  if (B > s.maxBatch)
    return false;
  Buffers &b = s.graphed;
  s.inputs(b, ids, positions, nullptr, &draws);
  auto eager = [&] {
    std::vector<int> kinds;
    s.clearMarks();
    s.body(b, B, B, true, true, stepLayer, true, kinds);
    tokens = s.readTokens(b, B);
    s.readMarks(kinds, times);
  };
  auto found = s.graphs.find(key);
  if (found == s.graphs.end()) {
    // The first step of a key runs eagerly on the graph's buffers (it loads
    // every kernel a capture needs); the second captures. A key whose
    // capture failed stays eager.
    if (!s.warm.count(key) || s.failed.count(key)) {
      s.warm.insert(key);
      eager();
      return true;
    }
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    check(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal),
          "starting a capture");
    bool ok = true;
    try {
      std::vector<int> kinds;
      s.body(b, B, B, true, true, stepLayer, false, kinds);
    } catch (const std::exception &) {
      ok = false;
    }
    cudaError_t e = cudaStreamEndCapture(s.stream, &graph);
    if (ok && e == cudaSuccess)
      e = cudaGraphInstantiate(&exec, graph, 0);
    if (graph)
      cudaGraphDestroy(graph);
    if (!ok || e != cudaSuccess) {
      cudaGetLastError();
      s.failed.insert(key);
      eager();
      return true;
    }
    found = s.graphs.emplace(key, exec).first;
  }
  s.clearMarks();
  cudaEvent_t e0 = s.event(), e1 = s.event();
  check(cudaEventRecord(e0, s.stream), "recording an event");
  check(cudaGraphLaunch(found->second, s.stream), "replaying a step");
  check(cudaEventRecord(e1, s.stream), "recording an event");
  tokens = s.readTokens(b, B);
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e0, e1), "timing");
  times.graphMs += ms;
  return true;
}
