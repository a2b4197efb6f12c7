//===- GatherBench.cu - vflow-bench-gather --------------------------------===//
//
// The byte ceiling of the sparse attention: how fast the GPU gathers just
// the K and V pages the attention reads (64 random pages of 16 tokens per
// (sequence, KV head), bf16, D = 128, Hkv = 8, L = 32K, the lists read as
// the attention reads them), with cp.async (16 bytes per lane) or bulk
// copies (cp.async.bulk, sm_90), over grid shapes: warps per CTA, copies
// in flight per warp, CTAs per (sequence, KV head). Timed back to back
// (median of 40 behind a spin kernel), rotating input sets. Usage:
// vflow-bench-gather [B] (default 8). docs/perf/ has its numbers.
//
//===----------------------------------------------------------------------===//
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cuda_runtime.h>
#include <numeric>
#include <random>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t err_ = (x);                                                    \
    if (err_ != cudaSuccess) {                                                 \
      printf("%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(err_));      \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

constexpr int H = 8, P = 16, D = 128, CHUNK = P * D * 2; // 4 KB

struct Args {
  const uint8_t *k, *v;
  const int *indptr, *pages;
  int perSplit;
  float *out;
};

__device__ __forceinline__ uint32_t sa(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

template <int W, int DEPTH>
__global__ void __launch_bounds__(W * 32) gatherCp(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int meta[256];
  const int row = blockIdx.x, kvh = row % H, split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int base = a.indptr[row];
  const int count = a.indptr[row + 1] - base;
  const int first = split * a.perSplit;
  const int n = max(0, min(count - first, a.perSplit));
  for (int j = threadIdx.x; j < n; j += W * 32)
    meta[j] = a.pages[base + first + j];
  __syncthreads();
  uint8_t *ring = smem + warp * DEPTH * 2 * CHUNK;
  auto issue = [&](int e, int st) {
    const size_t off = ((size_t)meta[e] * H + kvh) * CHUNK;
    const uint32_t kd = sa(ring + st * 2 * CHUNK), vd = kd + CHUNK;
#pragma unroll
    for (int i = 0; i < CHUNK / 16 / 32; ++i) {
      const int u = lane + 32 * i;
      asm volatile(
          "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(kd + u * 16),
          "l"(a.k + off + u * 16));
      asm volatile(
          "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(vd + u * 16),
          "l"(a.v + off + u * 16));
    }
  };
  int load = warp;
  for (int s = 0; s < DEPTH - 1; ++s) {
    if (load < n) {
      issue(load, s);
      load += W;
    }
    asm volatile("cp.async.commit_group;");
  }
  float acc = 0;
  int it = 0;
  for (int e = warp; e < n; e += W, ++it) {
    if (load < n) {
      issue(load, (it + DEPTH - 1) % DEPTH);
      load += W;
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group %0;" ::"n"(DEPTH - 1));
    __syncwarp();
    const float4 *c =
        reinterpret_cast<const float4 *>(ring + (it % DEPTH) * 2 * CHUNK);
#pragma unroll
    for (int i = 0; i < 2 * CHUNK / 16 / 32; ++i) {
      float4 x = c[lane + 32 * i];
      acc += x.x + x.w;
    }
    __syncwarp();
  }
  asm volatile("cp.async.wait_group 0;");
  if (acc == 12345.f)
    a.out[threadIdx.x] = acc;
}

template <int W, int DEPTH>
__global__ void __launch_bounds__(W * 32) gatherBulk(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int meta[256];
  __shared__ __align__(8) uint64_t bars[W][DEPTH];
  const int row = blockIdx.x, kvh = row % H, split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int base = a.indptr[row];
  const int count = a.indptr[row + 1] - base;
  const int first = split * a.perSplit;
  const int n = max(0, min(count - first, a.perSplit));
  for (int j = threadIdx.x; j < n; j += W * 32)
    meta[j] = a.pages[base + first + j];
  if (lane < DEPTH)
    asm volatile(
        "mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(sa(&bars[warp][lane])));
  asm volatile("fence.mbarrier_init.release.cluster;");
  __syncthreads();
  uint8_t *ring = smem + warp * DEPTH * 2 * CHUNK;
  auto issue = [&](int e, int st) {
    if (lane == 0) {
      const size_t off = ((size_t)meta[e] * H + kvh) * CHUNK;
      const uint32_t bar = sa(&bars[warp][st]);
      const uint32_t kd = sa(ring + st * 2 * CHUNK), vd = kd + CHUNK;
      asm volatile(
          "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
          "r"(2 * CHUNK));
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx:"
                   ":bytes [%0], [%1], %2, [%3];" ::"r"(kd),
                   "l"(a.k + off), "r"(CHUNK), "r"(bar)
                   : "memory");
      asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx:"
                   ":bytes [%0], [%1], %2, [%3];" ::"r"(vd),
                   "l"(a.v + off), "r"(CHUNK), "r"(bar)
                   : "memory");
    }
  };
  int load = warp, issued = 0;
  for (int s = 0; s < DEPTH - 1; ++s)
    if (load < n) {
      issue(load, s);
      load += W;
      ++issued;
    }
  float acc = 0;
  int it = 0;
  for (int e = warp; e < n; e += W, ++it) {
    if (load < n) {
      issue(load, (it + DEPTH - 1) % DEPTH);
      load += W;
    }
    const int st = it % DEPTH;
    const uint32_t parity = (it / DEPTH) & 1;
    const uint32_t bar = sa(&bars[warp][st]);
    uint32_t done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 "
                   "p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done)
                   : "r"(bar), "r"(parity)
                   : "memory");
    const float4 *c = reinterpret_cast<const float4 *>(ring + st * 2 * CHUNK);
#pragma unroll
    for (int i = 0; i < 2 * CHUNK / 16 / 32; ++i) {
      float4 x = c[lane + 32 * i];
      acc += x.x + x.w;
    }
    __syncwarp();
  }
  if (acc == 12345.f)
    a.out[threadIdx.x] = acc;
}

__global__ void spin(long long c) {
  long long s = clock64();
  while (clock64() - s < c) {
  }
}

template <class K>
double timeIt(K kernel, dim3 grid, int threads, int smem,
              std::vector<Args> &sets) {
  if (smem > 48 * 1024)
    CK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            smem));
  for (int i = 0; i < 5; ++i)
    kernel<<<grid, threads, smem>>>(sets[i % sets.size()]);
  CK(cudaDeviceSynchronize());
  const int iters = 40;
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto &e : ev)
    CK(cudaEventCreate(&e));
  spin<<<1, 1>>>(20000000);
  CK(cudaEventRecord(ev[0]));
  for (int i = 0; i < iters; ++i) {
    kernel<<<grid, threads, smem>>>(sets[i % sets.size()]);
    CK(cudaEventRecord(ev[i + 1]));
  }
  CK(cudaEventSynchronize(ev.back()));
  CK(cudaGetLastError());
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float t;
    CK(cudaEventElapsedTime(&t, ev[i], ev[i + 1]));
    ms[i] = t;
  }
  for (auto &e : ev)
    cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2] * 1000.0;
}

int main(int argc, char **argv) {
  const int B = argc > 1 ? atoi(argv[1]) : 8;
  const int L = 32768, N = L / P, K = 64, rows = B * H;
  const size_t pages = (size_t)B * N, pool = pages * H * CHUNK;
  const int nsets = B >= 8 ? 4 : 8;
  std::mt19937 rng(7);
  std::vector<Args> sets;
  float *out;
  CK(cudaMalloc(&out, 4096));
  for (int s = 0; s < nsets; ++s) {
    uint8_t *k, *v;
    int *ip, *pg;
    CK(cudaMalloc(&k, pool));
    CK(cudaMalloc(&v, pool));
    CK(cudaMemset(k, 1, pool));
    CK(cudaMemset(v, 1, pool));
    std::vector<int> perm(pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int> indptr(rows + 1), pg_h;
    std::vector<int> all(N);
    std::iota(all.begin(), all.end(), 0);
    for (int r = 0; r < rows; ++r) {
      indptr[r] = r * K;
      std::shuffle(all.begin(), all.end(), rng);
      std::vector<int> pick(all.begin(), all.begin() + K);
      std::sort(pick.begin(), pick.end());
      for (int j : pick)
        pg_h.push_back(perm[(size_t)(r / H) * N + j]);
    }
    indptr[rows] = rows * K;
    CK(cudaMalloc(&ip, indptr.size() * 4));
    CK(cudaMalloc(&pg, pg_h.size() * 4));
    CK(cudaMemcpy(ip, indptr.data(), indptr.size() * 4,
                  cudaMemcpyHostToDevice));
    CK(cudaMemcpy(pg, pg_h.data(), pg_h.size() * 4, cudaMemcpyHostToDevice));
    sets.push_back({k, v, ip, pg, 0, out});
  }
  const double bytes = (double)rows * K * 2 * CHUNK;
  printf("B=%d rows=%d bytes=%.1f MB floor@3000GB/s=%.2f us\n", B, rows,
         bytes / 1e6, bytes / 3000e3);
#define RUN(KERNEL, W, DEPTH, S)                                               \
  {                                                                            \
    for (auto &x : sets)                                                       \
      x.perSplit = (K + S - 1) / S;                                            \
    double us = timeIt(KERNEL<W, DEPTH>, dim3(rows, S), W * 32,                \
                       W * DEPTH * 2 * CHUNK, sets);                           \
    printf("%-10s W=%2d depth=%d S=%2d CTAs=%4d  %7.2f us  %6.0f GB/s\n",      \
           #KERNEL, W, DEPTH, S, rows *S, us, bytes / us / 1e3);               \
  }
  for (int S : {1, 2, 4, 8, 16}) {
    RUN(gatherCp, 2, 4, S)
    RUN(gatherCp, 4, 2, S) RUN(gatherCp, 4, 3, S) RUN(gatherCp, 4, 4, S)
        RUN(gatherCp, 8, 2, S) RUN(gatherCp, 8, 3, S) RUN(gatherBulk, 2, 4, S)
            RUN(gatherBulk, 4, 3, S) RUN(gatherBulk, 4, 4, S)
                RUN(gatherBulk, 8, 2, S) RUN(gatherBulk, 8, 3, S)
  }
  return 0;
}
