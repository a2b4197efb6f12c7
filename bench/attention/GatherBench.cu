//===- GatherBench.cu - vflow-bench-gather --------------------------------===//
//
// The byte ceiling of the sparse attention: how fast the GPU gathers just
// the K and V pages the attention reads (64 random pages of 16 tokens per
// (sequence, KV head), bf16, D = 128, Hkv = 8, L = 32K, the lists read as
// the attention reads them), with cp.async (16 bytes per lane) or bulk
// copies (cp.async.bulk, sm_90), over grid shapes: warps per CTA, copies
// in flight per warp, CTAs per (sequence, KV head). Timed back to back
// (median of 40 behind a spin kernel), rotating input sets. Usage:
// vflow-bench-gather [B] (default 8). lab/records/perf/ has its numbers.
//
//===----------------------------------------------------------------------===//
#include "../common/BackToBack.cuh"
#include "../common/RandomLists.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <numeric>
#include <random>
#include <vector>

using vflow::bench::checkCuda;
using vflow::bench::upload;

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

/// This CTA's part of its row's list: the pages into `meta`, as the
/// attention reads them (the row's offset, then its pages); their count.
__device__ int splitPages(const Args &a, int row, int split, int *meta) {
  const int base = a.indptr[row];
  const int count = a.indptr[row + 1] - base;
  const int first = split * a.perSplit;
  const int n = max(0, min(count - first, a.perSplit));
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    meta[j] = a.pages[base + first + j];
  return n;
}

/// Reads one landed stage (a page's K and V chunks) out of shared memory,
/// 16 bytes per lane at a time; their sum keeps the reads (the kernels
/// store it only on a value it never takes).
__device__ __forceinline__ float readStage(const uint8_t *stage, int lane) {
  const float4 *c = reinterpret_cast<const float4 *>(stage);
  float acc = 0;
#pragma unroll
  for (int i = 0; i < 2 * CHUNK / 16 / 32; ++i) {
    float4 x = c[lane + 32 * i];
    acc += x.x + x.w;
  }
  return acc;
}

/// The pipeline both kernels run: this warp reads its pages e = warp,
/// warp + W, ... (of n) through a ring of DEPTH stages in `ring`, loading
/// DEPTH - 1 ahead. start(e, stage) starts page e's copy into the stage,
/// commit() closes each step's loads (taken or not), wait(it) waits for the
/// stage of the it-th page. The sum of what it read.
template <int W, int DEPTH, class Start, class Commit, class Wait>
__device__ __forceinline__ float pipeline(int warp, int lane, int n,
                                          const uint8_t *ring, Start start,
                                          Commit commit, Wait wait) {
  int load = warp;
  auto next = [&](int stage) {
    if (load < n) {
      start(load, stage);
      load += W;
    }
    commit();
  };
  for (int s = 0; s < DEPTH - 1; ++s)
    next(s);
  float acc = 0;
  int it = 0;
  for (int e = warp; e < n; e += W, ++it) {
    next((it + DEPTH - 1) % DEPTH);
    wait(it);
    acc += readStage(ring + (it % DEPTH) * 2 * CHUNK, lane);
    __syncwarp();
  }
  return acc;
}

template <int W, int DEPTH>
__global__ void __launch_bounds__(W * 32) gatherCp(Args a) {
  extern __shared__ __align__(128) uint8_t smem[];
  __shared__ int meta[256];
  const int row = blockIdx.x, kvh = row % H, split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int n = splitPages(a, row, split, meta);
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
  const float acc = pipeline<W, DEPTH>(
      warp, lane, n, ring, issue,
      [] { asm volatile("cp.async.commit_group;"); },
      [](int) {
        asm volatile("cp.async.wait_group %0;" ::"n"(DEPTH - 1));
        __syncwarp();
      });
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
  const int n = splitPages(a, row, split, meta);
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
  const float acc = pipeline<W, DEPTH>(
      warp, lane, n, ring, issue, [] {},
      [&](int it) {
        const uint32_t parity = (it / DEPTH) & 1;
        const uint32_t bar = sa(&bars[warp][it % DEPTH]);
        uint32_t done = 0;
        while (!done)
          asm volatile(
              "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 "
              "p, [%1], %2; selp.u32 %0, 1, 0, p; }"
              : "=r"(done)
              : "r"(bar), "r"(parity)
              : "memory");
      });
  if (acc == 12345.f)
    a.out[threadIdx.x] = acc;
}

/// One grid shape of one gather kernel, timed on the rotating sets.
template <class K>
double timeShape(K kernel, int rows, int splits, int warps, int depth,
                 std::vector<Args> &sets) {
  const int smem = warps * depth * 2 * CHUNK;
  if (smem > 48 * 1024)
    checkCuda(cudaFuncSetAttribute(
                  kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem),
              "cudaFuncSetAttribute");
  for (Args &set : sets)
    set.perSplit = (64 + splits - 1) / splits;
  return vflow::bench::medianBackToBackUs(5, 40, [&](int i) {
    kernel<<<dim3(rows, splits), warps * 32, smem>>>(sets[i % sets.size()]);
  });
}

static int run(int argc, char **argv) {
  const int B = argc > 1 ? std::atoi(argv[1]) : 8;
  if (argc > 2 || B < 1 || B > 256)
    throw vflow::rt::Error("usage: vflow-bench-gather [B], B a batch in "
                           "1..256 (default 8)");
  const int L = 32768, N = L / P, K = 64, rows = B * H;
  const size_t pages = (size_t)B * N, pool = pages * H * CHUNK;
  const int nsets = B >= 8 ? 4 : 8;
  std::mt19937 rng(7);
  std::vector<Args> sets;
  float *out = upload(std::vector<float>(1024));
  for (int s = 0; s < nsets; ++s) {
    uint8_t *k, *v;
    checkCuda(cudaMalloc(&k, pool), "cudaMalloc");
    checkCuda(cudaMalloc(&v, pool), "cudaMalloc");
    checkCuda(cudaMemset(k, 1, pool), "cudaMemset");
    checkCuda(cudaMemset(v, 1, pool), "cudaMemset");
    const vflow::bench::RandomLists lists =
        vflow::bench::randomLists(rng, B, H, N, K);
    sets.push_back({k, v, upload(lists.indptr), upload(lists.pages), 0, out});
  }
  const double bytes = (double)rows * K * 2 * CHUNK;
  printf("B=%d rows=%d bytes=%.1f MB floor@3000GB/s=%.2f us\n", B, rows,
         bytes / 1e6, bytes / 3000e3);
  auto report = [&](const char *name, int warps, int depth, int splits,
                    double us) {
    printf("%-10s W=%2d depth=%d S=%2d CTAs=%4d  %7.2f us  %6.0f GB/s\n", name,
           warps, depth, splits, rows * splits, us, bytes / us / 1e3);
  };
  for (int S : {1, 2, 4, 8, 16}) {
    report("gatherCp", 2, 4, S, timeShape(gatherCp<2, 4>, rows, S, 2, 4, sets));
    report("gatherCp", 4, 2, S, timeShape(gatherCp<4, 2>, rows, S, 4, 2, sets));
    report("gatherCp", 4, 3, S, timeShape(gatherCp<4, 3>, rows, S, 4, 3, sets));
    report("gatherCp", 4, 4, S, timeShape(gatherCp<4, 4>, rows, S, 4, 4, sets));
    report("gatherCp", 8, 2, S, timeShape(gatherCp<8, 2>, rows, S, 8, 2, sets));
    report("gatherCp", 8, 3, S, timeShape(gatherCp<8, 3>, rows, S, 8, 3, sets));
    report("gatherBulk", 2, 4, S,
           timeShape(gatherBulk<2, 4>, rows, S, 2, 4, sets));
    report("gatherBulk", 4, 3, S,
           timeShape(gatherBulk<4, 3>, rows, S, 4, 3, sets));
    report("gatherBulk", 4, 4, S,
           timeShape(gatherBulk<4, 4>, rows, S, 4, 4, sets));
    report("gatherBulk", 8, 2, S,
           timeShape(gatherBulk<8, 2>, rows, S, 8, 2, sets));
    report("gatherBulk", 8, 3, S,
           timeShape(gatherBulk<8, 3>, rows, S, 8, 3, sets));
  }
  return 0;
}

int main(int argc, char **argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception &error) {
    std::fprintf(stderr, "vflow-bench-gather: %s\n", error.what());
    return 2;
  }
}
