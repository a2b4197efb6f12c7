//===- SelectBench.cu - vflow-bench-select --------------------------------===//
//
// The selection primitives generated select kernels call (vd::ctaTopK, then
// vd::ctaWriteList), in a kernel shaped like the generated one: first
// checked against a host reference (top k by rules::rankKey, ties to the
// lower index, the partial last block kept) on normal, tied, all-equal,
// NaN/-0/-inf and negative scores, 20 to 65536 blocks, k from 1 to 2047,
// at 1024 and 256 threads; then timed back to back (median of 50) by parts
// (the whole kernel, top-k only, list only, the prologue alone) and CTA
// size, 64 of 2048 blocks per (sequence, KV head) at B = 1, 8, 64 (Hkv 8).
// Exits 1 when a check fails. Run on the GPU machine:
// .gpu-carry/build/bin/vflow-bench-select (tools/gpu-build.sh).
//
//===----------------------------------------------------------------------===//

#include "../common/BackToBack.cuh"
#include "vflow/Runtime/cuda/FlowDevice.cuh"

#include <cmath>
#include <random>
#include <utility>

using vflow::bench::checkCuda;
using vflow::bench::upload;

namespace {

constexpr int PAGE = 16;

enum Part { Whole, TopKOnly, ListOnly, PrologueOnly };

/// The generated select kernel's body (Quest's k1): scores at ws[0, N),
/// flags at ws[maxBlocks, +N), then the list; or one part of it.
template <Part P>
__global__ void __launch_bounds__(1024) selectKernel(VflowGpuArgs a) {
  const int r = blockIdx.x;
  const int b = r / a.numKVHeads;
  const int L = a.seqLen[b], N = L / PAGE, numBlocks = (L + PAGE - 1) / PAGE;
  const double *params = a.params;
  float *ws = a.workspace + (long long)r * 2 * a.maxBlocks;
  __shared__ vd::CtaScratch scratch;
  auto candidate = [&](int j) {
    return !(j < (long long)params[2] ||
             (long long)j >= (long long)N - (long long)params[3]);
  };
  if (P == PrologueOnly) {
    if (threadIdx.x == 0)
      a.tableCount[r] = N + (int)params[2];
    return;
  }
  if (P != ListOnly && N > 0) {
    auto score = [&](int i) -> float { return ws[i]; };
    const long long k = (long long)double(vd::roundBudget(params[0]));
    vd::ctaTopK(N, k, 0, score, candidate, ws + a.maxBlocks, scratch);
  }
  if (P != TopKOnly)
    vd::ctaWriteList(a, b, r, N > 0 ? ws + a.maxBlocks : nullptr, N, numBlocks,
                     (long long)params[2], (long long)params[3], scratch);
}

/// One problem on the device: `batch` sequences of `length` tokens, Hkv
/// lists each, block j of sequence b in page pageOf(b * blocks + j), the
/// scores of list r at scores[r * blocks + j]. Device memory is not freed
/// (the program is short).
struct Problem {
  int rows = 0, blocks = 0;
  std::vector<int> table;
  VflowGpuArgs args{};

  Problem(int batch, int numKVHeads, int length, int k,
          const std::vector<float> &scores) {
    rows = batch * numKVHeads;
    blocks = (length + PAGE - 1) / PAGE;
    table.resize(size_t(batch) * blocks);
    for (size_t i = 0; i < table.size(); ++i)
      table[i] = int(i) * 3 + 1;
    std::vector<int> indptr(rows + 1);
    for (int r = 0; r <= rows; ++r)
      indptr[r] = r * blocks;
    std::vector<float> ws(size_t(rows) * 2 * blocks);
    for (int r = 0; r < rows; ++r)
      std::copy(scores.begin() + size_t(r) * blocks,
                scores.begin() + size_t(r + 1) * blocks,
                ws.begin() + size_t(r) * 2 * blocks);
    args.batch = batch;
    args.numKVHeads = numKVHeads;
    args.maxBlocks = blocks;
    args.pageSize = PAGE;
    args.seqLen = upload(std::vector<int>(batch, length));
    args.blockTable = upload(table);
    args.tableIndptr = upload(indptr);
    args.params = upload(std::vector<double>{double(k), PAGE, 0, 0});
    args.workspace = upload(ws);
    args.tableCount = upload(std::vector<int>(rows));
    args.tablePages = upload(std::vector<int>(size_t(rows) * blocks));
    args.tableBlocks = upload(std::vector<int>(size_t(rows) * blocks));
  }
};

/// Scores of `count` blocks drawn from distribution `dist`.
std::vector<float> drawScores(size_t count, int dist, std::mt19937 &rng) {
  std::normal_distribution<float> normal(20.f, 4.f);
  std::uniform_int_distribution<int> small(0, 5);
  std::vector<float> scores(count);
  for (size_t i = 0; i < count; ++i) {
    float v = normal(rng);
    if (dist == 1)
      v = float(small(rng)) * 0.5f; // many ties
    if (dist == 2)
      v = 3.0f; // all equal
    if (dist == 3 && i % 7 == 0)
      v = NAN;
    if (dist == 3 && i % 11 == 0)
      v = (i % 2) ? -0.0f : 0.0f;
    if (dist == 3 && i % 13 == 0)
      v = -INFINITY;
    if (dist == 4)
      v = -v; // negatives
    scores[i] = v;
  }
  return scores;
}

/// Runs the kernel on one problem and checks every list against the host.
bool check(int length, int k, int dist, int threads, std::mt19937 &rng) {
  const int batch = 2, numKVHeads = 2;
  const int N = length / PAGE, blocks = (length + PAGE - 1) / PAGE;
  const std::vector<float> scores =
      drawScores(size_t(batch) * numKVHeads * blocks, dist, rng);
  Problem p(batch, numKVHeads, length, k, scores);
  selectKernel<Whole><<<p.rows, threads>>>(p.args);
  checkCuda(cudaDeviceSynchronize(), "the select kernel");
  std::vector<int> count(p.rows), pages(size_t(p.rows) * blocks),
      listed(pages.size());
  checkCuda(cudaMemcpy(count.data(), p.args.tableCount, count.size() * 4,
                       cudaMemcpyDeviceToHost),
            "download");
  checkCuda(cudaMemcpy(pages.data(), p.args.tablePages, pages.size() * 4,
                       cudaMemcpyDeviceToHost),
            "download");
  checkCuda(cudaMemcpy(listed.data(), p.args.tableBlocks, listed.size() * 4,
                       cudaMemcpyDeviceToHost),
            "download");
  bool ok = true;
  for (int r = 0; r < p.rows && ok; ++r) {
    const float *v = scores.data() + size_t(r) * blocks;
    std::vector<int> order(N);
    for (int j = 0; j < N; ++j)
      order[j] = j;
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) {
      return vflow::rules::rankKey(v[x]) > vflow::rules::rankKey(v[y]);
    });
    std::vector<int> want(order.begin(), order.begin() + std::min(k, N));
    for (int j = N; j < blocks; ++j)
      want.push_back(j);
    std::sort(want.begin(), want.end());
    const int b = r / numKVHeads;
    if (count[r] != int(want.size())) {
      std::printf("  list %d: %d entries, want %zu\n", r, count[r],
                  want.size());
      ok = false;
    }
    for (size_t i = 0; ok && i < want.size(); ++i) {
      const size_t at = size_t(r) * blocks + i;
      if (listed[at] != want[i] ||
          pages[at] != p.table[size_t(b) * blocks + want[i]]) {
        std::printf("  list %d entry %zu: block %d, want %d\n", r, i,
                    listed[at], want[i]);
        ok = false;
      }
    }
  }
  std::printf("check L=%d k=%d scores=%d threads=%d: %s\n", length, k, dist,
              threads, ok ? "ok" : "FAILED");
  return ok;
}

template <Part P>
double timePart(const std::vector<Problem> &sets, int threads) {
  return vflow::bench::medianBackToBackUs(5, 50, [&](int i) {
    const Problem &p = sets[i % sets.size()];
    selectKernel<P><<<p.rows, threads>>>(p.args);
  });
}

} // namespace

static int run() {
  std::mt19937 rng(3);
  bool all = true;
  const std::pair<int, int> shapes[] = {
      {32768, 64}, {32768 + 5, 64}, {300, 7},       {600, 30},
      {32768, 1},  {32768, 2047},   {1 << 20, 512}, {1 << 20, 64}};
  for (int threads : {1024, 256})
    for (int dist = 0; dist <= 4; ++dist)
      for (auto [length, k] : shapes)
        all &= check(length, k, dist, threads, rng);
  std::printf("checks: %s\n", all ? "all ok" : "SOME FAILED");
  if (!all)
    return 1;

  const int numKVHeads = 8, length = 32768, blocks = length / PAGE;
  for (int batch : {1, 8, 64}) {
    std::vector<Problem> sets;
    for (int s = 0; s < 4; ++s)
      sets.emplace_back(
          batch, numKVHeads, length, 64,
          drawScores(size_t(batch) * numKVHeads * blocks, 0, rng));
    for (int threads : {256, 512, 1024})
      std::printf("B=%2d T=%4d  full %6.2f  topk %6.2f  list %6.2f  "
                  "prologue %6.2f us\n",
                  batch, threads, timePart<Whole>(sets, threads),
                  timePart<TopKOnly>(sets, threads),
                  timePart<ListOnly>(sets, threads),
                  timePart<PrologueOnly>(sets, threads));
  }
  return 0;
}

int main() {
  try {
    return run();
  } catch (const std::exception &error) {
    std::fprintf(stderr, "vflow-bench-select: %s\n", error.what());
    return 2;
  }
}
