//===- PrefillTest.cpp - GPU prefill attention vs float64 -----------------===//

#include "AttentionTestUtil.h"

#include <cstdio>

using namespace vflow::rt;
using namespace vflow::rt::cuda;
using namespace vflow::rt::cuda::test;

namespace {

/// `lengths`: the tokens of each sequence, new ones included. (A
/// constructor: GCC 12 wrongly warns -Wmaybe-uninitialized of a static
/// array of such aggregates.)
struct PrefillCase : CacheCase {
  PrefillCase(CacheCase cache, std::vector<int> newTokens, int window = 0)
      : CacheCase(std::move(cache)), newTokens(std::move(newTokens)),
        window(window) {}
  std::vector<int> newTokens; ///< query rows of each sequence
  int window;                 ///< a sliding window (0: none)
};

class Prefill : public ::testing::TestWithParam<PrefillCase> {};

TEST_P(Prefill, MatchesCausalFloat64Reference) {
  VFLOW_REQUIRE_GPU();
  const PrefillCase &c = GetParam();
  std::mt19937 &rng = testRng();
  const PagedCache cache = makeCache(rng, c);
  const int batch = static_cast<int>(c.lengths.size());
  const int H = c.numKVHeads, G = c.group, D = c.headDim;
  std::vector<int32_t> qIndptr{0}, indptr{0}, pages;
  for (int b = 0; b < batch; ++b) {
    qIndptr.push_back(qIndptr.back() + c.newTokens[b]);
    pages.insert(pages.end(), cache.pageOf[b].begin(), cache.pageOf[b].end());
    indptr.push_back(static_cast<int32_t>(pages.size()));
  }
  const int rows = qIndptr.back();
  const size_t rowElems = static_cast<size_t>(H) * G * D;
  const std::vector<uint16_t> q = randomBF16(rng, rows * rowElems, 2.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  std::vector<double> ref(rows * rowElems, 0.0);
  for (int b = 0; b < batch; ++b)
    for (int i = 0; i < c.newTokens[b]; ++i) {
      const int row = qIndptr[b] + i;
      const int position = c.lengths[b] - c.newTokens[b] + i;
      // A sliding window: keys before position - window + 1 are out.
      const int lo = c.window > 0 ? std::max(0, position - c.window + 1) : 0;
      for (int h = 0; h < H * G; ++h) {
        const size_t at = row * rowElems + static_cast<size_t>(h) * D;
        std::vector<double> scores(position + 1, -INFINITY);
        for (int t = lo; t <= position; ++t) {
          double dot = 0;
          for (int d = 0; d < D; ++d)
            dot += static_cast<double>(bf16ToFloat(q[at + d])) *
                   cache.kAt(b, t / c.pageSize, h / G, t % c.pageSize, d);
          scores[t] = dot * scale;
        }
        const double top = *std::max_element(scores.begin(), scores.end());
        double sum = 0;
        for (double &s : scores)
          sum += (s = std::exp(s - top));
        for (int t = lo; t <= position; ++t)
          for (int d = 0; d < D; ++d)
            ref[at + d] +=
                scores[t] / sum *
                cache.vAt(b, t / c.pageSize, h / G, t % c.pageSize, d);
      }
    }

  DeviceCache pools(cache);
  DeviceArray<uint16_t> qDev(q), out(q.size());
  DeviceArray<int32_t> qIndptrDev(qIndptr), seqLen(c.lengths),
      indptrDev(indptr), pagesDev(pages);
  PrefillAttentionArgs args{
      kvArgs(cache, pools, G, qDev.get(), out.get(), scale)};
  args.totalTokens = rows;
  args.qIndptr = qIndptrDev.get();
  args.seqLen = seqLen.get();
  args.indptr = indptrDev.get();
  args.pages = pagesDev.get();
  args.window = c.window;
  out.fill(0xFF);
  prefillAttention(args, nullptr);
  VFLOW_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = bf16Vector(out.download());
  const double err = relativeError(got, ref);
  std::printf("  %-28s %-8s rel.err %.2e\n", c.name, kvTypeName(c.type), err);
  EXPECT_LE(err, 1e-2);
  for (size_t row = 0; row < got.size() / D; ++row)
    ASSERT_LE(relativeError(got, ref, row * D, (row + 1) * D), 2e-2)
        << "query row " << row;
}

using KT = KVType;
const PrefillCase kPrefillCases[] = {
    {{"bf16_g4_d128", KT::BF16, 2, 4, 128, 16, {40, 17, 100}}, {5, 17, 1}},
    {{"bf16_g5_d64_p32", KT::BF16, 2, 5, 64, 32, {70, 33}}, {70, 9}},
    {{"f16_g1_d256", KT::F16, 3, 1, 256, 16, {50}}, {20}},
    {{"fp8_g8_d128_p64", KT::FP8E4M3, 1, 8, 128, 64, {200, 3}}, {31, 3}},
    // Several 64-row query tiles and key tiles, partial last tiles.
    {{"bf16_tiles_g2_d128", KT::BF16, 2, 2, 128, 16, {700, 300, 129}},
     {300, 300, 65}},
    {{"fp8_tiles_g4_d64_p32", KT::FP8E4M3, 2, 4, 64, 32, {513, 64}}, {200, 64}},
    {{"f16_tiles_g2_d256", KT::F16, 1, 2, 256, 16, {260}}, {130}},
    // A scale per stored row (int8 always; fp8 "rowscale").
    {{"int8_g8_d128_p64", KT::INT8, 1, 8, 128, 64, {200, 3}}, {31, 3}},
    {{"int8_tiles_g4_d64_p32", KT::INT8, 2, 4, 64, 32, {513, 64}}, {200, 64}},
    {{"int8_g2_d256", KT::INT8, 2, 2, 256, 16, {130, 40}}, {70, 40}},
    {{"fp8_rowscale_tiles_g4_d128", KT::FP8E4M3, 2, 4, 128, 16, {300, 77}},
     {150, 77}},
    // Sliding windows: rows whose windows start in different key tiles of
    // one query tile (a row may see no key of a tile), tiles wholly before
    // every row skipped, a window longer than the sequence.
    {{"window_tiles_g2_d128", KT::BF16, 2, 2, 128, 16, {700, 300, 129}},
     {300, 300, 65},
     40},
    {{"window_int8_g4_d64_p32", KT::INT8, 2, 4, 64, 32, {513, 64}},
     {200, 64},
     100},
    {{"window_long_f16_d256", KT::F16, 1, 2, 256, 16, {260}}, {130}, 1000},
};

INSTANTIATE_TEST_SUITE_P(Cases, Prefill, ::testing::ValuesIn(kPrefillCases),
                         CaseName());

} // namespace
