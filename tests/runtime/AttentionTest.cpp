//===- AttentionTest.cpp - Reference decode attention vs float64 ----------===//

#include "vflow/Runtime/Attention.h"

#include "../common/Configs.h"
#include "../common/Random.h"
#include "TestUtil.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <string>

using namespace vflow::rt;
using vflow::rt::test::expectError;
using vflow::testing::cacheConfig;
using vflow::testing::NormalDraws;

namespace {

struct Shape {
  const char *name;
  int numKVHeads;
  int group;
  int headDim;
  int pageSize;
  int length;
  DType kvDType;
};

void PrintTo(const Shape &shape, std::ostream *os) { *os << shape.name; }

/// Tokens of one sequence as stored (rounded to the KV dtype), per token
/// [numLayers, numKVHeads, headDim].
using Tokens = std::vector<std::vector<float>>;

struct Reference {
  std::vector<double> out;  // [numQHeads, headDim]
  std::vector<double> mass; // [numKVHeads, numBlocks, group]
};

/// Attention in float64 straight from the token list: no pages, no block
/// tables; block b covers positions [b * pageSize, (b + 1) * pageSize).
Reference referenceAttention(const Tokens &keys, const Tokens &values,
                             int numKVHeads, int headDim, int pageSize,
                             int layer, const std::vector<float> &q, int group,
                             double scale, const BlockLists &blocks) {
  const int64_t length = static_cast<int64_t>(keys.size());
  const int64_t numBlocks = (length + pageSize - 1) / pageSize;
  Reference ref;
  ref.out.assign(static_cast<size_t>(numKVHeads) * group * headDim, 0.0);
  ref.mass.assign(static_cast<size_t>(numKVHeads) * numBlocks * group, 0.0);
  for (int kvHead = 0; kvHead < numKVHeads; ++kvHead) {
    std::vector<int64_t> positions;
    for (int64_t block : blocks[kvHead])
      for (int64_t p = block * pageSize;
           p < std::min<int64_t>(length, (block + 1) * pageSize); ++p)
        positions.push_back(p);
    size_t base = (static_cast<size_t>(layer) * numKVHeads + kvHead) * headDim;
    for (int g = 0; g < group; ++g) {
      int qHead = kvHead * group + g;
      std::vector<double> scores;
      for (int64_t p : positions) {
        double dot = 0;
        for (int d = 0; d < headDim; ++d)
          dot += double(q[qHead * headDim + d]) * keys[p][base + d];
        scores.push_back(dot * scale);
      }
      double top = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      for (double &s : scores) {
        s = std::exp(s - top);
        sum += s;
      }
      for (size_t i = 0; i < positions.size(); ++i) {
        double p = scores[i] / sum;
        for (int d = 0; d < headDim; ++d)
          ref.out[qHead * headDim + d] += p * values[positions[i]][base + d];
        int64_t block = positions[i] / pageSize;
        ref.mass[(kvHead * numBlocks + block) * group + g] += p;
      }
    }
  }
  return ref;
}

/// |got - want| <= 1e-5 * the largest |want| of the query head's row.
void expectCloseRows(const std::vector<float> &got,
                     const std::vector<double> &want, int headDim,
                     double relative = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t row = 0; row < got.size() / headDim; ++row) {
    double scale = 0;
    for (int d = 0; d < headDim; ++d)
      scale = std::max(scale, std::fabs(want[row * headDim + d]));
    for (int d = 0; d < headDim; ++d) {
      size_t i = row * headDim + d;
      ASSERT_LE(std::fabs(got[i] - want[i]), relative * scale)
          << "query head " << row << " dim " << d << ": got " << got[i]
          << ", want " << want[i];
    }
  }
}

void expectMass(const std::vector<float> &got, const Reference &ref,
                const BlockLists &blocks, int numBlocks, int group) {
  ASSERT_EQ(got.size(), ref.mass.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], ref.mass[i], 1e-6) << "mass entry " << i;
  for (size_t kvHead = 0; kvHead < blocks.size(); ++kvHead) {
    std::vector<char> attended(numBlocks, 0);
    for (int64_t block : blocks[kvHead])
      attended[block] = 1;
    for (int g = 0; g < group; ++g) {
      double total = 0;
      for (int b = 0; b < numBlocks; ++b) {
        float m = got[(kvHead * numBlocks + b) * group + g];
        if (!attended[b]) {
          EXPECT_EQ(m, 0.0f) << "unattended block " << b;
        }
        EXPECT_GE(m, 0.0f);
        total += m;
      }
      EXPECT_NEAR(total, 1.0, 1e-5) << "kv head " << kvHead << " head " << g;
    }
  }
}

class DecodeAttention : public ::testing::TestWithParam<Shape> {
protected:
  static constexpr int kLayers = 2;

  void SetUp() override {
    const Shape &shape = GetParam();
    // Seeded per shape and per test, so every test draws its own data.
    std::string id =
        std::string(shape.name) + "/" +
        ::testing::UnitTest::GetInstance()->current_test_info()->name();
    rng.seed(static_cast<unsigned>(std::hash<std::string>()(id)));
    cache = std::make_unique<PagedKVCache>(
        cacheConfig(kLayers, shape.numKVHeads, shape.headDim, shape.pageSize,
                    2 * (shape.length / shape.pageSize + 2), shape.kvDType));
    seq = cache->addSequence();
    other = cache->addSequence();
    // Interleave another sequence so the block table is not the identity.
    for (int i = 0; i < shape.length; ++i) {
      appendRandom(seq, keys, values);
      if (i % shape.pageSize == 0)
        appendRandom(other, otherKeys, otherValues);
    }
    scale = 1.0f / std::sqrt(static_cast<float>(shape.headDim));
  }

  void appendRandom(SeqId target, Tokens &ks, Tokens &vs) {
    std::vector<float> k(cache->tokenElements()), v(cache->tokenElements());
    NormalDraws(rng).fill(k, v);
    cache->append(target, k.data(), v.data());
    for (float &x : k)
      x = roundToDType(cache->kvDType(), x);
    for (float &x : v)
      x = roundToDType(cache->kvDType(), x);
    ks.push_back(k);
    vs.push_back(v);
  }

  std::vector<float> randomQuery() {
    return NormalDraws(rng, 1.5f).take(numQHeads() * GetParam().headDim);
  }

  int numQHeads() const { return GetParam().numKVHeads * GetParam().group; }
  int numBlocks() const { return static_cast<int>(cache->numBlocks(seq)); }
  BlockLists allBlocks() const {
    std::vector<int64_t> all(numBlocks());
    std::iota(all.begin(), all.end(), 0);
    return BlockLists(GetParam().numKVHeads, all);
  }

  Reference reference(int layer, const std::vector<float> &q,
                      const BlockLists &blocks) const {
    const Shape &shape = GetParam();
    return referenceAttention(keys, values, shape.numKVHeads, shape.headDim,
                              shape.pageSize, layer, q, shape.group, scale,
                              blocks);
  }

  std::mt19937 rng;
  std::unique_ptr<PagedKVCache> cache;
  SeqId seq = 0, other = 0;
  Tokens keys, values, otherKeys, otherValues;
  float scale = 1.0f;
};

TEST_P(DecodeAttention, DenseMatchesFloat64Reference) {
  const Shape &shape = GetParam();
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<float> q = randomQuery();
    std::vector<float> out(q.size()),
        mass(static_cast<size_t>(shape.numKVHeads) * numBlocks() * shape.group);
    denseDecodeAttention(*cache, seq, layer, q.data(), shape.group, scale,
                         out.data(), mass.data());
    Reference ref = reference(layer, q, allBlocks());
    expectCloseRows(out, ref.out, shape.headDim);
    expectMass(mass, ref, allBlocks(), numBlocks(), shape.group);
  }
}

TEST_P(DecodeAttention, SparseMatchesFloat64Reference) {
  const Shape &shape = GetParam();
  std::bernoulli_distribution coin(0.5);
  for (int trial = 0; trial < 3; ++trial) {
    int layer = trial % kLayers;
    // Different blocks per kv head, always with the (possibly partial) last.
    BlockLists blocks(shape.numKVHeads);
    for (auto &list : blocks) {
      for (int b = 0; b + 1 < numBlocks(); ++b)
        if (coin(rng))
          list.push_back(b);
      list.push_back(numBlocks() - 1);
      std::shuffle(list.begin(), list.end(), rng);
    }
    std::vector<float> q = randomQuery();
    std::vector<float> out(q.size()),
        mass(static_cast<size_t>(shape.numKVHeads) * numBlocks() * shape.group);
    sparseDecodeAttention(*cache, seq, layer, q.data(), shape.group, scale,
                          blocks, out.data(), mass.data());
    Reference ref = reference(layer, q, blocks);
    expectCloseRows(out, ref.out, shape.headDim);
    expectMass(mass, ref, blocks, numBlocks(), shape.group);
  }
}

TEST_P(DecodeAttention, SparseOverAllBlocksEqualsDense) {
  const Shape &shape = GetParam();
  std::vector<float> q = randomQuery();
  std::vector<float> dense(q.size()), sparse(q.size()), shuffled(q.size());
  size_t massSize =
      static_cast<size_t>(shape.numKVHeads) * numBlocks() * shape.group;
  std::vector<float> denseMass(massSize), sparseMass(massSize);
  denseDecodeAttention(*cache, seq, 1, q.data(), shape.group, scale,
                       dense.data(), denseMass.data());
  sparseDecodeAttention(*cache, seq, 1, q.data(), shape.group, scale,
                        allBlocks(), sparse.data(), sparseMass.data());
  EXPECT_EQ(sparse, dense);
  EXPECT_EQ(sparseMass, denseMass);
  // In another order only the float summation order changes.
  BlockLists reversed = allBlocks();
  for (auto &list : reversed)
    std::reverse(list.begin(), list.end());
  sparseDecodeAttention(*cache, seq, 1, q.data(), shape.group, scale, reversed,
                        shuffled.data());
  std::vector<double> denseAsDouble(dense.begin(), dense.end());
  expectCloseRows(shuffled, denseAsDouble, shape.headDim);
}

TEST_P(DecodeAttention, BatchedEqualsOneByOne) {
  const Shape &shape = GetParam();
  std::vector<SeqId> seqs = {seq, other, seq};
  size_t stride = static_cast<size_t>(numQHeads()) * shape.headDim;
  std::vector<float> q;
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<float> one = randomQuery();
    q.insert(q.end(), one.begin(), one.end());
  }
  std::vector<float> out(q.size());
  std::vector<std::vector<float>> masses;
  denseDecodeAttentionBatch(*cache, seqs, 0, q.data(), shape.group, scale,
                            out.data(), &masses);
  ASSERT_EQ(masses.size(), seqs.size());
  std::vector<BlockLists> lists;
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<float> one(stride),
        mass(static_cast<size_t>(shape.numKVHeads) * cache->numBlocks(seqs[i]) *
             shape.group);
    denseDecodeAttention(*cache, seqs[i], 0, q.data() + i * stride, shape.group,
                         scale, one.data(), mass.data());
    EXPECT_EQ(std::vector<float>(out.begin() + i * stride,
                                 out.begin() + (i + 1) * stride),
              one);
    EXPECT_EQ(masses[i], mass);
    lists.push_back(BlockLists(
        shape.numKVHeads, std::vector<int64_t>{cache->numBlocks(seqs[i]) - 1}));
  }
  std::vector<float> sparseOut(q.size());
  sparseDecodeAttentionBatch(*cache, seqs, 0, q.data(), shape.group, scale,
                             lists, sparseOut.data());
  for (size_t i = 0; i < seqs.size(); ++i) {
    std::vector<float> one(stride);
    sparseDecodeAttention(*cache, seqs[i], 0, q.data() + i * stride,
                          shape.group, scale, lists[i], one.data());
    EXPECT_EQ(std::vector<float>(sparseOut.begin() + i * stride,
                                 sparseOut.begin() + (i + 1) * stride),
              one);
  }
}

// Prefill: the last n tokens' rows, each over every token up to its own,
// against float64; the mass is the mean of the last `window` rows'.
TEST_P(DecodeAttention, PrefillMatchesFloat64Reference) {
  const Shape &shape = GetParam();
  const int length = shape.length, D = shape.headDim, Hq = numQHeads();
  for (int n : {length, length / 2 + 1, 1}) {
    const int layer = n % kLayers, window = std::min(n, 5);
    std::vector<float> q = NormalDraws(rng, 1.5f).take(size_t(n) * Hq * D);
    std::vector<float> out(q.size()),
        mass(size_t(shape.numKVHeads) * numBlocks() * shape.group);
    causalPrefillAttention(*cache, seq, layer, q.data(), n, shape.group, scale,
                           out.data(), mass.data(), window);
    std::vector<double> wantMass(mass.size(), 0.0);
    for (int i = 0; i < n; ++i) {
      const int upTo = length - n + i + 1; // tokens row i sees
      Tokens ks(keys.begin(), keys.begin() + upTo),
          vs(values.begin(), values.begin() + upTo);
      const int blocks = (upTo + shape.pageSize - 1) / shape.pageSize;
      std::vector<int64_t> all(blocks);
      std::iota(all.begin(), all.end(), 0);
      std::vector<float> row(q.begin() + size_t(i) * Hq * D,
                             q.begin() + size_t(i + 1) * Hq * D);
      Reference ref = referenceAttention(
          ks, vs, shape.numKVHeads, D, shape.pageSize, layer, row, shape.group,
          scale, BlockLists(shape.numKVHeads, all));
      std::vector<float> got(out.begin() + size_t(i) * Hq * D,
                             out.begin() + size_t(i + 1) * Hq * D);
      SCOPED_TRACE("n " + std::to_string(n) + ", row " + std::to_string(i));
      expectCloseRows(got, ref.out, D);
      if (i >= n - window)
        for (int h = 0; h < shape.numKVHeads; ++h)
          for (int b = 0; b < blocks; ++b)
            for (int g = 0; g < shape.group; ++g)
              wantMass[(size_t(h) * numBlocks() + b) * shape.group + g] +=
                  ref.mass[(size_t(h) * blocks + b) * shape.group + g] / window;
    }
    for (size_t e = 0; e < mass.size(); ++e)
      ASSERT_NEAR(mass[e], wantMass[e], 1e-6) << "n " << n << ", mass " << e;
  }
}

const Shape kShapes[] = {
    {"G1_D64_F32", 2, 1, 64, 16, 37, DType::F32},
    {"G4_D128_BF16", 2, 4, 128, 16, 50, DType::BF16},
    {"G5_D64_ShorterThanAPage_F32", 3, 5, 64, 16, 5, DType::F32},
    {"G4_D128_WholePages_F16", 1, 4, 128, 16, 64, DType::F16},
    {"G5_D128_Page8_BF16", 2, 5, 128, 8, 33, DType::BF16},
    {"G1_D128_OneToken_BF16", 4, 1, 128, 32, 1, DType::BF16},
    {"G4_D64_Long_F32", 4, 4, 64, 16, 300, DType::F32},
};

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeAttention, ::testing::ValuesIn(kShapes),
                         [](const ::testing::TestParamInfo<Shape> &info) {
                           return std::string(info.param.name);
                         });

TEST(DecodeAttentionFork, EachForkAttendsToItsOwnTokens) {
  PagedKVCache cache(cacheConfig(1, 2, 64, 16, 16, DType::BF16));
  std::mt19937 rng(2024);
  NormalDraws normal(rng);
  auto token = [&] { return normal.take(cache.tokenElements()); };
  /// Appends a random token to `seq`, and to `ks` and `vs` as stored (bf16).
  auto append = [&](SeqId seq, Tokens &ks, Tokens &vs) {
    std::vector<float> k = token(), v = token();
    cache.append(seq, k.data(), v.data());
    for (float &x : k)
      x = roundToDType(DType::BF16, x);
    for (float &x : v)
      x = roundToDType(DType::BF16, x);
    ks.push_back(k);
    vs.push_back(v);
  };
  Tokens baseK, baseV;
  SeqId base = cache.addSequence();
  for (int i = 0; i < 20; ++i)
    append(base, baseK, baseV);
  SeqId child = cache.fork(base);
  Tokens childK = baseK, childV = baseV;
  for (int i = 0; i < 10; ++i) {
    append(base, baseK, baseV);
    append(child, childK, childV);
  }
  EXPECT_EQ(cache.blockTable(base)[0], cache.blockTable(child)[0]);
  EXPECT_NE(cache.blockTable(base)[1], cache.blockTable(child)[1]);
  std::vector<float> q = normal.take(2 * 3 * 64);
  BlockLists all(2, std::vector<int64_t>{0, 1});
  for (auto [target, ks, vs] :
       {std::tuple<SeqId, Tokens *, Tokens *>{base, &baseK, &baseV},
        {child, &childK, &childV}}) {
    std::vector<float> out(q.size());
    denseDecodeAttention(cache, target, 0, q.data(), 3, 0.125f, out.data());
    Reference ref =
        referenceAttention(*ks, *vs, 2, 64, 16, 0, q, 3, 0.125, all);
    expectCloseRows(out, ref.out, 64);
  }
}

// A sliding window of W tokens: decode and each prefill row equal
// attention over a sequence holding only the W tokens up to the row's own
// (windows starting inside a block of 4), bit for bit.
TEST(DecodeAttentionWindow, EqualsASequenceOfTheWindowOnly) {
  PagedKVCache cache(cacheConfig(1, 2, 16, 4, 64, DType::F32));
  std::mt19937 rng(77);
  NormalDraws normal(rng);
  const int64_t n = 30, W = 9;
  std::vector<std::vector<float>> ks, vs;
  SeqId full = cache.addSequence();
  for (int64_t i = 0; i < n; ++i) {
    ks.push_back(normal.take(cache.tokenElements()));
    vs.push_back(normal.take(cache.tokenElements()));
    cache.append(full, ks.back().data(), vs.back().data());
  }
  // The window up to position `last`, as a sequence of its own.
  auto windowOnly = [&](int64_t last) {
    SeqId s = cache.addSequence();
    for (int64_t i = std::max<int64_t>(0, last - W + 1); i <= last; ++i)
      cache.append(s, ks[size_t(i)].data(), vs[size_t(i)].data());
    return s;
  };
  const int group = 3;
  const size_t row = size_t(2 * group * 16);
  std::vector<float> q = normal.take(size_t(n) * row);
  std::vector<float> got(row), want(row);
  const float *lastQ = q.data() + size_t(n - 1) * row;
  denseDecodeAttention(cache, full, 0, lastQ, group, 0.25f, got.data(), nullptr,
                       W);
  denseDecodeAttention(cache, windowOnly(n - 1), 0, lastQ, group, 0.25f,
                       want.data());
  EXPECT_EQ(got, want);

  std::vector<float> prefill(size_t(n) * row);
  causalPrefillAttention(cache, full, 0, q.data(), n, group, 0.25f,
                         prefill.data(), nullptr, 0, W);
  for (int64_t r : {int64_t(0), int64_t(5), int64_t(8), int64_t(17), n - 1}) {
    SCOPED_TRACE("row " + std::to_string(r));
    SeqId s = windowOnly(r);
    std::vector<float> one(row);
    causalPrefillAttention(cache, s, 0, q.data() + size_t(r) * row, 1, group,
                           0.25f, one.data());
    for (size_t i = 0; i < row; ++i)
      EXPECT_NEAR(prefill[size_t(r) * row + i], one[i], 1e-6f);
  }
}

TEST(DecodeAttentionErrors, BadArguments) {
  PagedKVCache cache(cacheConfig(2, 2, 8, 4, 8, DType::BF16));
  SeqId empty = cache.addSequence();
  SeqId seq = cache.addSequence();
  std::vector<float> token(cache.tokenElements(), 0.5f);
  for (int i = 0; i < 6; ++i)
    cache.append(seq, token.data(), token.data());
  std::vector<float> q(2 * 2 * 8, 1.0f), out(q.size());
  expectError(
      [&] {
        denseDecodeAttention(cache, empty, 0, q.data(), 2, 1, out.data());
      },
      "sequence 0 is empty");
  expectError(
      [&] { denseDecodeAttention(cache, seq, 2, q.data(), 2, 1, out.data()); },
      "layer 2 is out of range");
  expectError(
      [&] { denseDecodeAttention(cache, seq, 0, q.data(), 0, 1, out.data()); },
      "group", "got 0");
  expectError(
      [&] { denseDecodeAttention(cache, seq, 0, nullptr, 2, 1, out.data()); },
      "must not be null");
  expectError(
      [&] {
        denseDecodeAttention(cache, seq, 0, q.data(), 2, NAN, out.data());
      },
      "scale must be finite");
  expectError(
      [&] { denseDecodeAttention(cache, 9, 0, q.data(), 2, 1, out.data()); },
      "sequence 9 does not exist");
  auto sparse = [&](BlockLists blocks) {
    return [&cache, &q, &out, seq, blocks] {
      sparseDecodeAttention(cache, seq, 0, q.data(), 2, 1, blocks, out.data());
    };
  };
  expectError(sparse({{0}}), "one block list per kv head (2), got 1");
  expectError(sparse({{0}, {}}), "block list of kv head 1 is empty");
  expectError(sparse({{0, 2}, {1}}), "block 2 of kv head 0 is out of range",
              "has 2 blocks");
  expectError(sparse({{0}, {1, 1}}), "block 1 is listed twice for kv head 1");
  expectError(sparse({{-1}, {1}}), "block -1");
  expectError(
      [&] {
        sparseDecodeAttentionBatch(cache, {seq, seq}, 0, q.data(), 2, 1,
                                   {BlockLists{{0}, {1}}}, out.data());
      },
      "one BlockLists per sequence (2), got 1");
}

} // namespace
