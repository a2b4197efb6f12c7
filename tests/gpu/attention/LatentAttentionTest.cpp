//===- LatentAttentionTest.cpp - Latent (MLA) attention vs float64 --------===//
//
// pagedDecodeAttention and prefillAttention over a latent cache
// (PagedKVArgs::valueDim: one bf16 row a token, values its first valueDim
// dims) against a float64 host reference on fresh random data: DeepSeek's
// shapes (rows of 576, values of 512, 16 and 128 heads), split entries,
// sparse lists with the mass epilogue, prefill with a cached prefix, and
// small odd shapes (the tiny models the engine tests use). Slots that hold
// no token are NaN, so reading one shows.
//
//===----------------------------------------------------------------------===//

#include "AttentionTestUtil.h"

#include <map>

namespace vflow::rt::cuda::test {
namespace {

struct LatentCase {
  std::string name;
  int heads, dk, dv, pageSize;
  std::vector<int> lengths;
  bool sparse = false, mass = false;
  std::vector<int> newRows = {}; ///< prefill: rows per sequence
  /// Decode: the maxEntries the step was planned for (a CUDA graph's plan
  /// holds for lists far longer than the step's); 0: the longest list.
  int planEntries = 0;
};

std::ostream &operator<<(std::ostream &os, const LatentCase &c) {
  return os << c.name;
}

/// A pool whose pages are shuffled over the sequences; every slot without
/// a token is NaN.
struct LatentPool {
  int dk = 0, pageSize = 0, numPages = 0;
  std::vector<uint16_t> rows; ///< [numPages, pageSize, dk]
  std::vector<std::vector<int>> pageOf;

  double at(int b, int block, int t, int d) const {
    return bf16ToFloat(
        rows[(size_t(pageOf[b][block]) * pageSize + t) * dk + d]);
  }
};

LatentPool makePool(std::mt19937 &rng, const LatentCase &c) {
  LatentPool pool;
  pool.dk = c.dk;
  pool.pageSize = c.pageSize;
  int pages = 2; // two pages no sequence owns
  for (int len : c.lengths)
    pages += (len + c.pageSize - 1) / c.pageSize;
  pool.numPages = pages;
  std::vector<int> order(pages);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  pool.rows.assign(size_t(pages) * c.pageSize * c.dk, 0x7FC0); // NaN
  const std::vector<uint16_t> values = randomBF16(rng, pool.rows.size(), 1.0f);
  int next = 0;
  for (int len : c.lengths) {
    std::vector<int> own;
    for (int j = 0; j * c.pageSize < len; ++j) {
      const int page = order[next++];
      own.push_back(page);
      for (int t = 0; t < c.pageSize && j * c.pageSize + t < len; ++t)
        for (int d = 0; d < c.dk; ++d) {
          const size_t i = (size_t(page) * c.pageSize + t) * c.dk + d;
          pool.rows[i] = values[i];
        }
    }
    pool.pageOf.push_back(own);
  }
  return pool;
}

/// Float64 attention of query q [heads, dk] over `blocks` of sequence b
/// (the first `len` tokens count): out [heads, dv] and each block's share.
void reference(const LatentPool &pool, const LatentCase &c, int b, int len,
               const std::vector<int> &blocks, const std::vector<float> &q,
               double scale, std::vector<double> &out,
               std::map<int, std::vector<double>> &share) {
  out.assign(size_t(c.heads) * c.dv, 0.0);
  for (int h = 0; h < c.heads; ++h) {
    std::vector<double> logits;
    std::vector<std::pair<int, int>> where;
    for (int block : blocks)
      for (int t = 0; t < c.pageSize && block * c.pageSize + t < len; ++t) {
        double s = 0;
        for (int d = 0; d < c.dk; ++d)
          s += double(q[size_t(h) * c.dk + d]) * pool.at(b, block, t, d);
        logits.push_back(s * scale);
        where.push_back({block, t});
      }
    if (logits.empty())
      continue;
    const double top = *std::max_element(logits.begin(), logits.end());
    double sum = 0;
    for (double &x : logits)
      sum += x = std::exp(x - top);
    for (size_t i = 0; i < logits.size(); ++i) {
      const double p = logits[i] / sum;
      auto &sh = share[where[i].first];
      sh.resize(c.heads, 0.0);
      sh[h] += p;
      for (int d = 0; d < c.dv; ++d)
        out[size_t(h) * c.dv + d] +=
            p * pool.at(b, where[i].first, where[i].second, d);
    }
  }
}

PagedKVArgs latentArgs(const LatentCase &c, const LatentPool &pool,
                       const DeviceArray<uint16_t> &dPool,
                       const DeviceArray<uint16_t> &dq,
                       const DeviceArray<uint16_t> &dOut) {
  PagedKVArgs a;
  a.kPool = dPool.get();
  a.kvType = KVType::BF16;
  a.batch = int(c.lengths.size());
  a.numKVHeads = 1;
  a.group = c.heads;
  a.headDim = c.dk;
  a.valueDim = c.dv;
  a.pageSize = c.pageSize;
  a.numPages = pool.numPages;
  a.q = dq.get();
  a.out = dOut.get();
  a.scale = 1.0f / std::sqrt(float(c.dk - c.dv + 128));
  return a;
}

class LatentDecode : public ::testing::TestWithParam<LatentCase> {};

TEST_P(LatentDecode, MatchesFloat64) {
  VFLOW_REQUIRE_GPU();
  const LatentCase c = GetParam();
  std::mt19937 &rng = testRng();
  const LatentPool pool = makePool(rng, c);
  const int B = int(c.lengths.size());
  // Lists: every block, or a random half of them (the last, partial one
  // kept where it is drawn); one slot of spare capacity per list.
  std::vector<int32_t> indptr{0}, count, pages, blocks;
  std::vector<std::vector<int>> chosen(B);
  int maxEntries = 0;
  for (int b = 0; b < B; ++b) {
    for (int j = 0; j < int(pool.pageOf[b].size()); ++j)
      if (!c.sparse || rng() % 2 || j == 0) {
        chosen[b].push_back(j);
        pages.push_back(pool.pageOf[b][j]);
        blocks.push_back(j);
      }
    count.push_back(int(chosen[b].size()));
    pages.push_back(-1); // past count: never read
    blocks.push_back(0);
    indptr.push_back(int(pages.size()));
    maxEntries = std::max(maxEntries, count.back());
  }
  maxEntries = std::max(maxEntries, c.planEntries);
  const std::vector<uint16_t> q =
      randomBF16(rng, size_t(B) * c.heads * c.dk, 1.0f);
  const std::vector<float> qf = bf16Vector(q);

  DeviceArray<uint16_t> dPool(pool.rows), dq(q),
      dOut(size_t(B) * c.heads * c.dv);
  DeviceArray<int32_t> dIndptr(indptr), dCount(count), dPages(pages),
      dBlocks(blocks),
      dLen(std::vector<int32_t>(c.lengths.begin(), c.lengths.end()));
  int massStride = 0;
  for (auto &own : pool.pageOf)
    massStride = std::max(massStride, int(own.size()));
  DeviceArray<float> dMass(size_t(B) * massStride * c.heads);
  dMass.fill(0);
  PagedAttentionArgs a;
  static_cast<PagedKVArgs &>(a) = latentArgs(c, pool, dPool, dq, dOut);
  a.indptr = dIndptr.get();
  a.count = dCount.get();
  a.pages = dPages.get();
  a.blocks = dBlocks.get();
  a.seqLen = dLen.get();
  a.maxEntries = maxEntries;
  if (c.mass) {
    a.mass = dMass.get();
    a.massStride = massStride;
  }
  const size_t need =
      pagedDecodeWorkspaceBytes(B, 1, c.heads, c.dk, maxEntries, c.dv);
  DeviceArray<uint8_t> work(std::max<size_t>(need, 16));
  work.fill(0xFF);
  a.workspace = work.get();
  a.workspaceBytes = need;
  pagedDecodeAttention(a, nullptr);
  VFLOW_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = bf16Vector(dOut.download());
  const std::vector<float> mass = dMass.download();

  double worstMass = 0;
  std::vector<double> want(size_t(B) * c.heads * c.dv);
  for (int b = 0; b < B; ++b) {
    std::vector<double> out;
    std::map<int, std::vector<double>> share;
    reference(pool, c, b, c.lengths[b], chosen[b],
              std::vector<float>(qf.begin() + size_t(b) * c.heads * c.dk,
                                 qf.begin() + size_t(b + 1) * c.heads * c.dk),
              a.scale, out, share);
    std::copy(out.begin(), out.end(), want.begin() + size_t(b) * out.size());
    if (c.mass)
      for (int block = 0; block < massStride; ++block)
        for (int h = 0; h < c.heads; ++h) {
          const double w = share.count(block) ? share[block][h] : 0.0;
          worstMass = std::max(
              worstMass,
              std::abs(mass[(size_t(b) * massStride + block) * c.heads + h] -
                       w));
        }
  }
  const double err = relativeError(got, want);
  std::printf("  %-26s %s  rel.err %.2e  mass err %.1e\n", c.name.c_str(),
              need ? "split" : "one CTA a row", err, worstMass);
  if (c.name.find("split") != std::string::npos) {
    EXPECT_GT(need, 0u) << "the case is meant to split its entries";
  }
  if (c.name.find("one_cta") != std::string::npos) {
    EXPECT_EQ(need, 0u) << "the case is meant to run one CTA a row";
  }
  EXPECT_LT(err, 1e-2);
  EXPECT_LT(worstMass, 2e-3);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LatentDecode,
    ::testing::Values(
        // DeepSeek-V2-Lite: 16 heads over rows of 512 + 64.
        LatentCase{"v2lite", 16, 576, 512, 16, {1, 100, 700}},
        // V3's 128 heads, long lists split over CTAs.
        LatentCase{"v3_heads128_split", 128, 576, 512, 64, {2000, 33}},
        // A flow's lists: half the blocks, the mass epilogue.
        LatentCase{"sparse_mass", 16, 576, 512, 16, {900, 400}, true, true},
        LatentCase{
            "sparse_mass_split_p64", 32, 576, 512, 64, {5000}, true, true},
        // The engine tests' tiny models: rows of 40, values of 32; heads
        // not a multiple of 16.
        LatentCase{"tiny", 4, 40, 32, 16, {5, 50}, false, true},
        // DeepSeek's shapes on one CTA a row: the output and the mass
        // written by the attention kernel itself.
        LatentCase{"one_cta_mass", 16, 576, 512, 16, {40, 60}, false, true},
        // The widest rows and values past 512 (the larger accumulator
        // set); an empty sequence (zeros, no mass).
        LatentCase{
            "wide_values_empty_seq", 16, 1024, 640, 32, {300, 0}, true, true},
        LatentCase{"odd_heads", 20, 96, 64, 32, {130, 31, 1}},
        // Planned for lists of 4096 entries: the splits share each row's
        // own entries.
        LatentCase{"graph_plan_4096",
                   16,
                   576,
                   512,
                   16,
                   {300, 2000, 0},
                   false,
                   true,
                   {},
                   4096},
        // Pages of 48: a tile of 32 tokens takes part of one page and part
        // of the next; partial last pages.
        LatentCase{"pages48_mass", 16, 576, 512, 48, {100, 7, 290}, true, true},
        // An odd head count (a CTA's last half-warp or rows past the
        // model's heads) and values not a multiple of 16, on tensor cores
        // and on CUDA cores, with the mass.
        LatentCase{"odd_heads_values40", 5, 48, 40, 16, {70, 33}, true, true},
        LatentCase{"cuda_cores_odd_heads", 5, 42, 40, 16, {70, 33}, true, true},
        // Rows of a dims count that is not a multiple of 8: the CUDA-core
        // kernel (both accumulator sets).
        LatentCase{"cuda_cores_rows42", 4, 42, 42, 16, {5, 50}, true, true},
        LatentCase{"cuda_cores_values_past_512",
                   16,
                   1018,
                   640,
                   32,
                   {70},
                   false,
                   true}),
    [](const ::testing::TestParamInfo<LatentCase> &i) { return i.param.name; });

class LatentPrefill : public ::testing::TestWithParam<LatentCase> {};

TEST_P(LatentPrefill, MatchesFloat64) {
  VFLOW_REQUIRE_GPU();
  const LatentCase c = GetParam();
  std::mt19937 &rng = testRng();
  const LatentPool pool = makePool(rng, c);
  const int B = int(c.lengths.size());
  std::vector<int32_t> qIndptr{0}, indptr{0}, pages;
  for (int b = 0; b < B; ++b) {
    qIndptr.push_back(qIndptr.back() + c.newRows[b]);
    for (int page : pool.pageOf[b])
      pages.push_back(page);
    indptr.push_back(int(pages.size()));
  }
  const int rows = qIndptr.back();
  const std::vector<uint16_t> q =
      randomBF16(rng, size_t(rows) * c.heads * c.dk, 1.0f);
  const std::vector<float> qf = bf16Vector(q);
  DeviceArray<uint16_t> dPool(pool.rows), dq(q),
      dOut(size_t(rows) * c.heads * c.dv);
  DeviceArray<int32_t> dQIndptr(qIndptr), dIndptr(indptr), dPages(pages),
      dLen(std::vector<int32_t>(c.lengths.begin(), c.lengths.end()));
  PrefillAttentionArgs a;
  static_cast<PagedKVArgs &>(a) = latentArgs(c, pool, dPool, dq, dOut);
  a.totalTokens = rows;
  a.qIndptr = dQIndptr.get();
  a.seqLen = dLen.get();
  a.indptr = dIndptr.get();
  a.pages = dPages.get();
  prefillAttention(a, nullptr);
  VFLOW_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<float> got = bf16Vector(dOut.download());

  std::vector<double> want(got.size());
  for (int b = 0; b < B; ++b)
    for (int i = 0; i < c.newRows[b]; ++i) {
      const int row = qIndptr[b] + i;
      const int len = c.lengths[b] - c.newRows[b] + i + 1;
      std::vector<int> blocks;
      for (int j = 0; j * c.pageSize < len; ++j)
        blocks.push_back(j);
      std::vector<double> out;
      std::map<int, std::vector<double>> share;
      reference(
          pool, c, b, len, blocks,
          std::vector<float>(qf.begin() + size_t(row) * c.heads * c.dk,
                             qf.begin() + size_t(row + 1) * c.heads * c.dk),
          a.scale, out, share);
      std::copy(out.begin(), out.end(),
                want.begin() + size_t(row) * out.size());
    }
  const double err = relativeError(got, want);
  std::printf("  %-26s rows=%d  rel.err %.2e\n", c.name.c_str(), rows, err);
  EXPECT_LT(err, 1e-2);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LatentPrefill,
    ::testing::Values(
        // A whole prompt and one whose first 283 tokens are cached.
        LatentCase{"v2lite_prefix",
                   16,
                   576,
                   512,
                   16,
                   {40, 300},
                   false,
                   false,
                   {40, 17}},
        LatentCase{
            "v3_heads128", 128, 576, 512, 64, {130}, false, false, {130}},
        LatentCase{"tiny", 4, 40, 32, 32, {1, 70}, false, false, {1, 70}},
        LatentCase{"cuda_cores_rows42",
                   4,
                   42,
                   42,
                   16,
                   {3, 90},
                   false,
                   false,
                   {3, 41}}),
    [](const ::testing::TestParamInfo<LatentCase> &i) { return i.param.name; });

} // namespace
} // namespace vflow::rt::cuda::test
