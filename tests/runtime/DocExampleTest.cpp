//===- DocExampleTest.cpp - The example of docs/runtime.md ----------------===//
//
// The example from docs/runtime.md, verbatim in `example`, with checks of
// what it claims.
//
//===----------------------------------------------------------------------===//

#include "vflow/Runtime/Attention.h"
#include "vflow/Runtime/PagedKVCache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

using namespace vflow::rt;

namespace {

struct Observed {
  int hookCalls = 0;
  int usedAfterFork = 0, usedAfterCopy = 0, usedAtEnd = 0;
  std::vector<float> out, mass, kmax;
};

void example(Observed &seen) {
  CacheConfig config;
  config.numLayers = 1;
  config.numKVHeads = 2;
  config.headDim = 64;
  config.pageSize = 16;
  config.numPages = 64;
  config.kvDType = DType::BF16;
  config.fields = {{"kmax", DType::BF16, 64}};
  config.states = {{"acc", DType::F32, 1, /*perBlock=*/true, 0.0f}};
  PagedKVCache cache(config);

  // The cache stage: Quest's kmax = max(K, token), once per full page.
  int kmax = cache.fieldIndex("kmax");
  cache.setPageFullHook([&](int layer, PageId page, int kvHead) {
    ++seen.hookCalls;
    std::vector<float> k = cache.readKBlock(layer, page, kvHead);
    std::vector<float> maxima(64, -INFINITY);
    for (int t = 0; t < 16; ++t)
      for (int d = 0; d < 64; ++d)
        maxima[d] = std::max(maxima[d], k[t * 64 + d]);
    cache.writeField(kmax, layer, page, kvHead, maxima.data());
  });

  SeqId prompt = cache.addSequence();
  std::vector<float> k(cache.tokenElements(), 0.5f), v(k);
  for (int i = 0; i < 40; ++i) // 2 full pages, 8 tokens in the tail
    cache.append(prompt, k.data(), v.data());

  SeqId sample = cache.fork(prompt); // shares all 3 pages
  seen.usedAfterFork = cache.blockManager().numUsed();
  cache.append(sample, k.data(), v.data()); // copies only the tail page
  seen.usedAfterCopy = cache.blockManager().numUsed();

  // Attend blocks 0 and 2 (the partial tail) for both kv heads, group 4.
  std::vector<float> q(2 * 4 * 64, 0.1f), out(q.size());
  std::vector<float> mass(2 * cache.numBlocks(sample) * 4);
  sparseDecodeAttention(cache, sample, /*layer=*/0, q.data(), /*group=*/4,
                        1.0f / std::sqrt(64.0f), {{0, 2}, {0, 2}}, out.data(),
                        mass.data());
  seen.out = out;
  seen.mass = mass;
  seen.kmax = cache.readField(kmax, 0, cache.blockTable(sample)[1], 1);
  cache.freeSequence(prompt);
  cache.freeSequence(sample); // every page is free again
  seen.usedAtEnd = cache.blockManager().numUsed();
}

TEST(DocExample, DoesWhatTheDocSays) {
  Observed seen;
  example(seen);
  EXPECT_EQ(seen.hookCalls, 2 * 2); // two full pages, two kv heads
  EXPECT_EQ(seen.usedAfterFork, 3);
  EXPECT_EQ(seen.usedAfterCopy, 4);
  EXPECT_EQ(seen.usedAtEnd, 0);
  EXPECT_EQ(seen.kmax, std::vector<float>(64, 0.5f));
  // Every token has V = 0.5, so every output is 0.5; equal keys spread the
  // mass evenly over the 16 + 9 attended tokens.
  for (float x : seen.out)
    EXPECT_NEAR(x, 0.5f, 1e-6f);
  ASSERT_EQ(seen.mass.size(), 2u * 3u * 4u);
  for (int head = 0; head < 2; ++head)
    for (int g = 0; g < 4; ++g) {
      EXPECT_NEAR(seen.mass[(head * 3 + 0) * 4 + g], 16.0f / 25.0f, 1e-6f);
      EXPECT_EQ(seen.mass[(head * 3 + 1) * 4 + g], 0.0f);
      EXPECT_NEAR(seen.mass[(head * 3 + 2) * 4 + g], 9.0f / 25.0f, 1e-6f);
    }
}

} // namespace
