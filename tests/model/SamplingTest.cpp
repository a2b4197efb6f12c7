//===- SamplingTest.cpp - The engine's sampling rule on the host ----------===//
//
// Sampling.h's rule as sampleToken implements it: greedy ties, top-k and
// top-p sets (ties kept), the draw's distribution against the softmax over
// the kept tokens, and reproducibility by (seed, counter).
//
//===----------------------------------------------------------------------===//

#include "vflow/Model/Sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <vector>

using namespace vflow::model;

namespace {

RowSampling draw(float temperature, float topP, int64_t topK, uint64_t seed,
                 uint64_t counter) {
  return RowSampling{temperature, topP, topK, seed, counter};
}

/// How often each token is drawn over `n` draws of stream `seed`.
std::map<int32_t, int> histogram(const std::vector<float> &logits,
                                 RowSampling row, int n) {
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) {
    row.counter = uint64_t(i);
    ++h[sampleToken(logits.data(), int64_t(logits.size()), row)];
  }
  return h;
}

} // namespace

TEST(Sampling, GreedyTakesTheLowestIdAmongEqualMaxima) {
  std::vector<float> l = {1, 3, 2, 3, -1};
  EXPECT_EQ(sampleToken(l.data(), 5, draw(0, 1, 0, 1, 0)), 1);
}

// A row with a NaN or an infinity anywhere is not sampled, greedy or not
// (NaN logits used to give token 0 again and again).
TEST(Sampling, NonFiniteLogitsAreNotSampled) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {std::nanf(""), inf, -inf})
    for (size_t at : {size_t(0), size_t(3), size_t(7)}) {
      std::vector<float> l = {1, 3, 2, 3, 0.5f, -2, 4, 1};
      l[at] = bad;
      for (float t : {0.0f, 0.7f})
        EXPECT_EQ(
            sampleToken(l.data(), int64_t(l.size()), draw(t, 0.9f, 3, 5, 2)),
            kNonFiniteLogits)
            << bad << " at " << at << ", temperature " << t;
    }
  std::vector<float> all(50, std::nanf(""));
  EXPECT_EQ(sampleToken(all.data(), 50, draw(0, 1, 0, 1, 0)), kNonFiniteLogits);
}

TEST(Sampling, TopKOneAndTinyTopPAreGreedy) {
  std::vector<float> l = {0.5f, 2.0f, 1.9f, -1.0f};
  for (uint64_t c = 0; c < 50; ++c) {
    EXPECT_EQ(sampleToken(l.data(), 4, draw(1.0f, 1, 1, 7, c)), 1);
    EXPECT_EQ(sampleToken(l.data(), 4, draw(1.0f, 1e-6f, 0, 7, c)), 1);
  }
}

TEST(Sampling, DrawsFollowTheSoftmaxOfTheKeptTokens) {
  // Temperature 0.5 over 4 tokens, top-k 3: token 3 is never drawn; the
  // others with probabilities exp(2 l) normalized over the three.
  std::vector<float> l = {0.0f, 0.5f, 1.0f, -3.0f};
  const int n = 40000;
  std::map<int32_t, int> h = histogram(l, draw(0.5f, 1, 3, 11, 0), n);
  EXPECT_EQ(h.count(3), 0u);
  double z = 0;
  for (int i = 0; i < 3; ++i)
    z += std::exp(2.0 * l[size_t(i)]);
  for (int i = 0; i < 3; ++i) {
    const double p = std::exp(2.0 * l[size_t(i)]) / z;
    const double sd = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(double(h[i]) / n, p, 5 * sd) << "token " << i;
  }
}

TEST(Sampling, TopPKeepsTheSmallestHeadHoldingP) {
  // Probabilities at temperature 1: about 0.64, 0.24, 0.09, 0.03. top_p
  // 0.7 keeps the first two (0.64 < 0.7 <= 0.88).
  std::vector<float> l = {3.0f, 2.0f, 1.0f, 0.0f};
  std::map<int32_t, int> h = histogram(l, draw(1.0f, 0.7f, 0, 3, 0), 5000);
  EXPECT_GT(h[0], 0);
  EXPECT_GT(h[1], 0);
  EXPECT_EQ(h.count(2) + h.count(3), 0u);
}

TEST(Sampling, TiesAtTheThresholdAreKept) {
  // top-k 2 of {5, 4, 4, 1}: both 4s stay (the k-th largest value is 4).
  std::vector<float> l = {5.0f, 4.0f, 4.0f, 1.0f};
  std::map<int32_t, int> h = histogram(l, draw(2.0f, 1, 2, 5, 0), 4000);
  EXPECT_GT(h[1], 0);
  EXPECT_GT(h[2], 0);
  EXPECT_EQ(h.count(3), 0u);
}

TEST(Sampling, ADrawDependsOnlyOnSeedAndCounter) {
  std::vector<float> l(1000);
  for (size_t i = 0; i < l.size(); ++i)
    l[i] = float(std::sin(double(i) * 0.37));
  std::vector<int32_t> a, b, c;
  for (uint64_t k = 0; k < 64; ++k) {
    a.push_back(sampleToken(l.data(), 1000, draw(0.8f, 0.9f, 40, 123, k)));
    b.push_back(sampleToken(l.data(), 1000, draw(0.8f, 0.9f, 40, 123, k)));
    c.push_back(sampleToken(l.data(), 1000, draw(0.8f, 0.9f, 40, 124, k)));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // uniformDraw is in [0, 1) and not constant.
  double lo = 1, hi = 0;
  for (uint64_t k = 0; k < 1000; ++k) {
    const double u = uniformDraw(9, k);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    lo = std::min(lo, u);
    hi = std::max(hi, u);
  }
  EXPECT_LT(lo, 0.01);
  EXPECT_GT(hi, 0.99);
}
