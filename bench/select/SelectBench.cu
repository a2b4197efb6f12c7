//===- SelectBench.cu - vflow-bench-select --------------------------------===//
//
// The selection primitives generated select kernels call (vd::ctaTopK, then
// vd::ctaWriteList), in a kernel shaped like the generated one: first
// checked against a host reference (top k by rank key, ties to the lower
// index, the partial last block kept) on normal, tied, all-equal,
// NaN/-0/-inf and negative scores, 20 to 65536 blocks, k from 1 to 2047,
// at 1024 and 256 threads; then timed back to back (median of 50 behind a
// spin kernel) by parts (the whole kernel, top-k only, list only, the
// prologue alone) and CTA size, 64 of 2048 blocks per (sequence, KV head)
// at B = 1, 8, 64 (Hkv 8). Exits 1 when a check fails. Run on the GPU
// machine: .gpu-carry/build/bin/vflow-bench-select (tools/gpu-build.sh).
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/cuda/FlowDevice.cuh"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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
constexpr int PAGE = 16;
#define WS_STRIDE (2 * (long long)a.maxBlocks)

/// MODE 0: the generated select kernel's body (top-k, then the list);
/// 1: top-k only; 2: the list only (flags already there); 3: the prologue.
template <int MODE>
__global__ void __launch_bounds__(1024) selectKernel(VflowGpuArgs a) {
  const int r = blockIdx.x;
  const int b = r / a.numKVHeads;
  const int L = a.seqLen[b], N = L / PAGE, numBlocks = (L + PAGE - 1) / PAGE;
  const double *P = a.params;
  float *ws = a.workspace + (long long)r * WS_STRIDE;
  __shared__ vd::CtaScratch scratch;
  auto candidate = [&](int j) {
    return !(j < (long long)P[2] ||
             (long long)j >= (long long)N - (long long)P[3]);
  };
  if (MODE == 3) { // prologue only
    if (threadIdx.x == 0)
      a.tableCount[r] = N + (int)P[2];
    return;
  }
  if (MODE != 2 && N > 0) {
    auto score = [&](int i) -> float { return ws[i]; };
    const long long k = (long long)double(vd::roundBudget(P[0]));
    vd::ctaTopK(N, k, 0, score, candidate, ws + a.maxBlocks, scratch);
  }
  if (MODE != 1)
    vd::ctaWriteList(a, b, r, N > 0 ? ws + a.maxBlocks : nullptr, N, numBlocks,
                     (long long)P[2], (long long)P[3], scratch);
}

// Checks the kernel's lists against a host reference (top k by
// rules::rankKey, ties to the lower index; the partial last block always
// taken).
bool check(int B, int L, int k, int dist, int T, std::mt19937 &rng) {
  const int H = 2, N = L / PAGE, NB = (L + PAGE - 1) / PAGE, rows = B * H;
  VflowGpuArgs a{};
  a.batch = B;
  a.numKVHeads = H;
  a.maxBlocks = NB;
  a.pageSize = PAGE;
  std::vector<int> seq(B, L), table((size_t)B * NB), indptr(rows + 1);
  for (size_t i = 0; i < table.size(); ++i)
    table[i] = (int)i * 3 + 1;
  for (int r = 0; r <= rows; ++r)
    indptr[r] = r * NB;
  std::vector<double> params = {(double)k, 16, 0, 0};
  std::vector<float> ws((size_t)rows * 2 * NB);
  std::normal_distribution<float> nd(20.f, 4.f);
  std::uniform_int_distribution<int> small(0, 5);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < NB; ++j) {
      float v = nd(rng);
      if (dist == 1)
        v = float(small(rng)) * 0.5f; // many ties
      if (dist == 2)
        v = 3.0f; // all equal
      if (dist == 3 && j % 7 == 0)
        v = NAN; // NaNs
      if (dist == 3 && j % 11 == 0)
        v = (j % 2) ? -0.0f : 0.0f;
      if (dist == 3 && j % 13 == 0)
        v = -INFINITY;
      if (dist == 4)
        v = -v; // negatives
      ws[(size_t)r * 2 * NB + j] = v;
    }
  int *d;
  double *dp;
  float *dw;
  CK(cudaMalloc(&d, seq.size() * 4));
  CK(cudaMemcpy(d, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
  a.seqLen = d;
  CK(cudaMalloc(&d, table.size() * 4));
  CK(cudaMemcpy(d, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
  a.blockTable = d;
  CK(cudaMalloc(&d, indptr.size() * 4));
  CK(cudaMemcpy(d, indptr.data(), indptr.size() * 4, cudaMemcpyHostToDevice));
  a.tableIndptr = d;
  CK(cudaMalloc(&dp, params.size() * 8));
  CK(cudaMemcpy(dp, params.data(), params.size() * 8, cudaMemcpyHostToDevice));
  a.params = dp;
  CK(cudaMalloc(&dw, ws.size() * 4));
  CK(cudaMemcpy(dw, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
  a.workspace = dw;
  int *cnt, *pg, *bl;
  CK(cudaMalloc(&cnt, rows * 4));
  a.tableCount = cnt;
  CK(cudaMalloc(&pg, (size_t)rows * NB * 4));
  a.tablePages = pg;
  CK(cudaMalloc(&bl, (size_t)rows * NB * 4));
  a.tableBlocks = bl;
  selectKernel<0><<<rows, T>>>(a);
  CK(cudaDeviceSynchronize());
  std::vector<int> hc(rows), hp((size_t)rows * NB), hb((size_t)rows * NB);
  CK(cudaMemcpy(hc.data(), cnt, rows * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hp.data(), pg, hp.size() * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(hb.data(), bl, hb.size() * 4, cudaMemcpyDeviceToHost));
  bool ok = true;
  for (int r = 0; r < rows && ok; ++r) {
    std::vector<int> idx(N);
    for (int j = 0; j < N; ++j)
      idx[j] = j;
    const float *v = &ws[(size_t)r * 2 * NB];
    std::stable_sort(idx.begin(), idx.end(), [&](int x, int y) {
      return vflow::rules::rankKey(v[x]) > vflow::rules::rankKey(v[y]);
    });
    std::vector<int> want(idx.begin(), idx.begin() + std::min(k, N));
    for (int j = N; j < NB; ++j)
      want.push_back(j);
    std::sort(want.begin(), want.end());
    if (hc[r] != (int)want.size()) {
      printf("  row %d count %d want %zu\n", r, hc[r], want.size());
      ok = false;
      break;
    }
    for (size_t i = 0; i < want.size(); ++i)
      if (hb[(size_t)r * NB + i] != want[i] ||
          hp[(size_t)r * NB + i] != table[(size_t)(r / H) * NB + want[i]]) {
        printf("  row %d entry %zu block %d want %d\n", r, i,
               hb[(size_t)r * NB + i], want[i]);
        ok = false;
        break;
      }
  }
  printf("check B=%d L=%d k=%d dist=%d T=%d: %s\n", B, L, k, dist, T,
         ok ? "ok" : "FAILED");
  cudaFree((void *)a.seqLen);
  cudaFree((void *)a.blockTable);
  cudaFree((void *)a.tableIndptr);
  cudaFree((void *)dp);
  cudaFree(dw);
  cudaFree(cnt);
  cudaFree(pg);
  cudaFree(bl);
  return ok;
}

__global__ void spin(long long c) {
  long long s = clock64();
  while (clock64() - s < c) {
  }
}

template <class K>
double timeIt(K kernel, int grid, int threads,
              std::vector<VflowGpuArgs> &sets) {
  for (int i = 0; i < 5; ++i)
    kernel<<<grid, threads>>>(sets[i % sets.size()]);
  CK(cudaDeviceSynchronize());
  const int iters = 50;
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto &e : ev)
    CK(cudaEventCreate(&e));
  spin<<<1, 1>>>(20000000);
  CK(cudaEventRecord(ev[0]));
  for (int i = 0; i < iters; ++i) {
    kernel<<<grid, threads>>>(sets[i % sets.size()]);
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

int main() {
  const int H = 8, L = 32768, N = L / PAGE;
  std::mt19937 rng(3);
  bool all = true;
  for (int T : {1024, 256})
    for (int dist : {0, 1, 2, 3, 4})
      for (auto [len, k] : std::vector<std::pair<int, int>>{{32768, 64},
                                                            {32768 + 5, 64},
                                                            {300, 7},
                                                            {600, 30},
                                                            {32768, 1},
                                                            {32768, 2047},
                                                            {1 << 20, 512},
                                                            {1 << 20, 64}})
        all &= check(2, len, k, dist, T, rng);
  printf("checks: %s\n", all ? "all ok" : "SOME FAILED");
  if (!all)
    return 1;
  std::normal_distribution<float> nd(20.f, 4.f);
  for (int B : {1, 8, 64}) {
    const int rows = B * H;
    std::vector<VflowGpuArgs> sets;
    for (int s = 0; s < 4; ++s) {
      VflowGpuArgs a{};
      a.batch = B;
      a.numKVHeads = H;
      a.maxBlocks = N;
      a.pageSize = PAGE;
      std::vector<int> seq(B, L), table((size_t)B * N), indptr(rows + 1);
      for (size_t i = 0; i < table.size(); ++i)
        table[i] = (int)i;
      for (int r = 0; r <= rows; ++r)
        indptr[r] = r * N;
      std::vector<double> params = {64, 16, 0, 0};
      std::vector<float> ws((size_t)rows * 2 * N);
      for (int r = 0; r < rows; ++r)
        for (int j = 0; j < N; ++j)
          ws[(size_t)r * 2 * N + j] = nd(rng);
      int *d;
      double *dp;
      float *dw;
      CK(cudaMalloc(&d, seq.size() * 4));
      CK(cudaMemcpy(d, seq.data(), seq.size() * 4, cudaMemcpyHostToDevice));
      a.seqLen = d;
      CK(cudaMalloc(&d, table.size() * 4));
      CK(cudaMemcpy(d, table.data(), table.size() * 4, cudaMemcpyHostToDevice));
      a.blockTable = d;
      CK(cudaMalloc(&d, indptr.size() * 4));
      CK(cudaMemcpy(d, indptr.data(), indptr.size() * 4,
                    cudaMemcpyHostToDevice));
      a.tableIndptr = d;
      CK(cudaMalloc(&dp, params.size() * 8));
      CK(cudaMemcpy(dp, params.data(), params.size() * 8,
                    cudaMemcpyHostToDevice));
      a.params = dp;
      CK(cudaMalloc(&dw, ws.size() * 4));
      CK(cudaMemcpy(dw, ws.data(), ws.size() * 4, cudaMemcpyHostToDevice));
      a.workspace = dw;
      CK(cudaMalloc(&d, rows * 4));
      a.tableCount = d;
      CK(cudaMalloc(&d, (size_t)rows * N * 4));
      a.tablePages = d;
      CK(cudaMalloc(&d, (size_t)rows * N * 4));
      a.tableBlocks = d;
      sets.push_back(a);
    }
    for (int T : {256, 512, 1024}) {
      printf("B=%2d T=%4d  full %6.2f  topk %6.2f  list %6.2f  prologue %6.2f "
             "us\n",
             B, T, timeIt(selectKernel<0>, rows, T, sets),
             timeIt(selectKernel<1>, rows, T, sets),
             timeIt(selectKernel<2>, rows, T, sets),
             timeIt(selectKernel<3>, rows, T, sets));
    }
  }
  return 0;
}
