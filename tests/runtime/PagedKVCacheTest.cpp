//===- PagedKVCacheTest.cpp - Paged KV cache, fork, fields, states --------===//

#include "vflow/Runtime/PagedKVCache.h"

#include "../common/Configs.h"
#include "../common/Random.h"
#include "TestUtil.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>

using namespace vflow::rt;
using vflow::rt::test::expectError;

namespace {

/// What the cache keeps of element `d` of the (layer, head) row starting
/// at `rowStart` of `token`: the dtype's rounding, for a scaled dtype of
/// the row divided by its scale (its largest magnitude over the format's
/// largest value), times the scale.
float storedValue(DType type, const std::vector<float> &token, size_t rowStart,
                  int headDim, int d) {
  const float x = token[rowStart + size_t(d)];
  if (!isScaledKVDType(type))
    return roundToDType(type, x);
  float absMax = 0;
  for (int i = 0; i < headDim; ++i)
    absMax = std::max(absMax, std::fabs(token[rowStart + size_t(i)]));
  const float scale = absMax / kvFormatMax(type);
  return scale == 0 ? 0.0f : roundToDType(type, x / scale) * scale;
}

CacheConfig smallConfig(DType kvDType = DType::F32, int numPages = 16) {
  return vflow::testing::cacheConfig(2, 3, 5, 4, numPages, kvDType);
}

/// Appends random tokens and remembers them, so every sequence can be read
/// back through its block table and compared with what was appended.
class Recorder {
public:
  Recorder(PagedKVCache &cache, unsigned seed) : cache(cache), rng(seed) {}

  void append(SeqId seq, int64_t numTokens = 1) {
    for (int64_t i = 0; i < numTokens; ++i) {
      // Recorded first, so a page-full hook already sees the token.
      keys[seq].push_back(randomToken());
      values[seq].push_back(randomToken());
      if (cache.config().valuesAreKeys) {
        // V reads K; the v given (NaN) must never be stored.
        std::vector<float> unread(values[seq].back().size(), std::nanf(""));
        values[seq].back() = keys[seq].back();
        cache.append(seq, keys[seq].back().data(), unread.data());
        continue;
      }
      cache.append(seq, keys[seq].back().data(), values[seq].back().data());
    }
  }

  /// Evicts whole blocks (cache.evict) and forgets their tokens.
  void evict(SeqId seq, const std::vector<int64_t> &blocks) {
    cache.evict(seq, blocks);
    const size_t p = size_t(cache.pageSize());
    for (auto *tokens : {&keys[seq], &values[seq]})
      for (auto b = blocks.rbegin(); b != blocks.rend(); ++b)
        tokens->erase(tokens->begin() + long(size_t(*b) * p),
                      tokens->begin() + long((size_t(*b) + 1) * p));
  }

  /// Evicts single tokens (cache.evictTokens) and forgets them.
  void evictTokens(SeqId seq, const std::vector<int64_t> &tokens) {
    cache.evictTokens(seq, tokens);
    for (auto *kept : {&keys[seq], &values[seq]})
      for (auto t = tokens.rbegin(); t != tokens.rend(); ++t)
        kept->erase(kept->begin() + long(*t));
  }

  /// A forked sequence starts with its parent's tokens.
  void fork(SeqId parent, SeqId child) {
    keys[child] = keys[parent];
    values[child] = values[parent];
  }

  std::vector<float> randomToken() {
    return vflow::testing::NormalDraws(rng, 3.0f).take(cache.tokenElements());
  }

  /// Reads every token of `seq` back and compares it, rounded to the KV
  /// dtype, bit for bit; slots past the length must read as zero.
  void check(SeqId seq) {
    const auto &expectedK = keys[seq];
    const auto &expectedV = values[seq];
    ASSERT_EQ(cache.length(seq), static_cast<int64_t>(expectedK.size()));
    const int pageSize = cache.pageSize(), headDim = cache.headDim();
    const std::vector<PageId> &table = cache.blockTable(seq);
    ASSERT_EQ(static_cast<int64_t>(table.size()), cache.numBlocks(seq));
    for (int layer = 0; layer < cache.numLayers(); ++layer)
      for (int head = 0; head < cache.numKVHeads(); ++head)
        for (size_t block = 0; block < table.size(); ++block) {
          std::vector<float> k = cache.readKBlock(layer, table[block], head);
          std::vector<float> v = cache.readVBlock(layer, table[block], head);
          for (int slot = 0; slot < pageSize; ++slot) {
            size_t position = block * pageSize + slot;
            for (int d = 0; d < headDim; ++d) {
              float gotK = k[slot * headDim + d], gotV = v[slot * headDim + d];
              float wantK = 0, wantV = 0;
              if (position < expectedK.size()) {
                size_t index =
                    (static_cast<size_t>(layer) * cache.numKVHeads() + head) *
                        headDim +
                    d;
                const size_t rowStart = index - size_t(d);
                wantK = storedValue(cache.kvDType(), expectedK[position],
                                    rowStart, headDim, d);
                wantV = storedValue(cache.kvDType(), expectedV[position],
                                    rowStart, headDim, d);
              }
              ASSERT_EQ(gotK, wantK)
                  << "seq " << seq << " layer " << layer << " head " << head
                  << " pos " << position << " dim " << d;
              ASSERT_EQ(gotV, wantV) << "seq " << seq << " pos " << position;
            }
          }
        }
  }

  PagedKVCache &cache;
  std::mt19937 rng;
  std::map<SeqId, std::vector<std::vector<float>>> keys, values;
};

/// Checks the reference count of each page of `counts` (page, count) and
/// how many pages are in use.
void expectRefCounts(const BlockManager &pages,
                     const std::vector<std::pair<PageId, int32_t>> &counts,
                     int32_t used) {
  for (const auto &[page, count] : counts)
    EXPECT_EQ(pages.refCount(page), count) << "page " << page;
  EXPECT_EQ(pages.numUsed(), used);
}

//===----------------------------------------------------------------------===//
// Configuration
//===----------------------------------------------------------------------===//

TEST(PagedKVCache, RejectsBadConfigs) {
  auto make = [](auto edit) {
    return [edit] {
      CacheConfig config = smallConfig();
      edit(config);
      PagedKVCache cache(config);
    };
  };
  expectError(make([](CacheConfig &c) { c.numLayers = 0; }), "numLayers",
              "positive", "got 0");
  expectError(make([](CacheConfig &c) { c.numKVHeads = -1; }), "numKVHeads",
              "got -1");
  expectError(make([](CacheConfig &c) { c.headDim = 0; }), "headDim");
  expectError(make([](CacheConfig &c) { c.pageSize = 0; }), "pageSize");
  expectError(make([](CacheConfig &c) { c.numPages = 0; }), "numPages");
  expectError(make([](CacheConfig &c) { c.numPages = int64_t(1) << 40; }),
              "numPages must be at most");
  expectError(make([](CacheConfig &c) { c.kvDType = static_cast<DType>(99); }),
              "kvDType ? is not supported on the host");
  expectError(make([](CacheConfig &c) {
                c.fields = {{"kmax", DType::BF16, 5}, {"kmax", DType::F32, 5}};
              }),
              "cache field 'kmax' is declared twice");
  expectError(make([](CacheConfig &c) {
                c.fields = {{"kmin", DType::BF16, 0}};
              }),
              "cache field 'kmin'", "elementsPerBlock", "got 0");
  expectError(make([](CacheConfig &c) {
                c.fields = {{"", DType::BF16, 1}};
              }),
              "empty name");
  expectError(make([](CacheConfig &c) {
                c.states = {{"acc", DType::F32, 1, true, 0.0f},
                            {"acc", DType::F32, 1, false, 0.0f}};
              }),
              "state 'acc' is declared twice");
  expectError(make([](CacheConfig &c) {
                c.states = {{"acc", DType::F32, -2, true, 0.0f}};
              }),
              "state 'acc'", "got -2");
  expectError(make([](CacheConfig &c) {
                c.numPages = int64_t(1) << 30;
                c.headDim = 1 << 30;
                c.pageSize = 1 << 30;
              }),
              "overflows");
  // One layer of one KV head: `numPages` pages of `pageSize` tokens of
  // `headDim`, f32.
  auto oneHead = [](int64_t numPages, int headDim, int pageSize) {
    return [=] {
      PagedKVCache cache(vflow::testing::cacheConfig(1, 1, headDim, pageSize,
                                                     numPages, DType::F32));
    };
  };
  expectError(oneHead(1, 1 << 30, 1 << 30), "need 8796093022208 MiB",
              "more than this machine's");
  // Larger than the machine, refused before anything is allocated (zeroing
  // it could get the process killed on an overcommitting kernel): 2 TiB
  // for K and as much for V.
  expectError(oneHead(512, 1 << 20, 1 << 10),
              "KV cache: 512 pages of 1024 tokens x 1 layer",
              "need 4194304 MiB, more than this machine's");
}

TEST(PagedKVCache, ReportsItsShape) {
  PagedKVCache cache(smallConfig(DType::BF16, 7));
  EXPECT_EQ(cache.numLayers(), 2);
  EXPECT_EQ(cache.numKVHeads(), 3);
  EXPECT_EQ(cache.headDim(), 5);
  EXPECT_EQ(cache.pageSize(), 4);
  EXPECT_EQ(cache.numPages(), 7);
  EXPECT_EQ(cache.kvDType(), DType::BF16);
  EXPECT_EQ(cache.tokenElements(), 2 * 3 * 5);
  EXPECT_EQ(cache.blockElements(), 4 * 5);
  EXPECT_EQ(cache.blockManager().numFree(), 7);
  // Blocks are contiguous: [numPages, numKVHeads, pageSize, headDim].
  auto *pool = static_cast<const unsigned char *>(cache.kPool(1));
  EXPECT_EQ(static_cast<const unsigned char *>(cache.kBlock(1, 2, 1)) - pool,
            (2 * 3 + 1) * 4 * 5 * 2);
  auto *vPool = static_cast<const unsigned char *>(cache.vPool(0));
  EXPECT_EQ(static_cast<const unsigned char *>(cache.vBlock(0, 6, 2)) - vPool,
            (6 * 3 + 2) * 4 * 5 * 2);
}

//===----------------------------------------------------------------------===//
// Appending
//===----------------------------------------------------------------------===//

class AppendEveryDType : public ::testing::TestWithParam<DType> {};

TEST_P(AppendEveryDType, AcrossPageBoundaries) {
  PagedKVCache cache(smallConfig(GetParam()));
  Recorder recorder(cache, 100 + static_cast<unsigned>(GetParam()));
  SeqId a = cache.addSequence(), b = cache.addSequence();
  EXPECT_EQ(cache.length(a), 0);
  EXPECT_EQ(cache.numBlocks(a), 0);
  EXPECT_TRUE(cache.blockTable(a).empty());
  // Interleaved appends give each sequence non-contiguous pages.
  for (int i = 0; i < 11; ++i) {
    recorder.append(a);
    if (i % 2 == 0)
      recorder.append(b);
  }
  EXPECT_EQ(cache.length(a), 11);
  EXPECT_EQ(cache.numBlocks(a), 3);
  EXPECT_EQ(cache.numCompleteBlocks(a), 2);
  EXPECT_EQ(cache.tokensInBlock(a, 0), 4);
  EXPECT_EQ(cache.tokensInBlock(a, 2), 3);
  EXPECT_EQ(cache.length(b), 6);
  EXPECT_EQ(cache.numBlocks(b), 2);
  EXPECT_EQ(cache.blockManager().numUsed(), 5);
  std::set<PageId> distinct(cache.blockTable(a).begin(),
                            cache.blockTable(a).end());
  distinct.insert(cache.blockTable(b).begin(), cache.blockTable(b).end());
  EXPECT_EQ(distinct.size(), 5u);
  EXPECT_EQ(cache.physicalPage(a, 1), cache.blockTable(a)[1]);
  recorder.check(a);
  recorder.check(b);
}

INSTANTIATE_TEST_SUITE_P(KVDTypes, AppendEveryDType,
                         ::testing::Values(DType::F32, DType::BF16, DType::F16,
                                           DType::INT8, DType::FP8E4M3,
                                           DType::FP8E5M2),
                         [](const ::testing::TestParamInfo<DType> &info) {
                           return std::string(dtypeName(info.param));
                         });

TEST(PagedKVCache, AppendTokensEqualsRepeatedAppend) {
  PagedKVCache one(smallConfig(DType::F16)), many(smallConfig(DType::F16));
  Recorder recorder(one, 7);
  SeqId seq = one.addSequence();
  SeqId bulk = many.addSequence();
  recorder.append(seq, 9);
  std::vector<float> k, v;
  for (int i = 0; i < 9; ++i) {
    k.insert(k.end(), recorder.keys[seq][i].begin(),
             recorder.keys[seq][i].end());
    v.insert(v.end(), recorder.values[seq][i].begin(),
             recorder.values[seq][i].end());
  }
  many.appendTokens(bulk, 9, k.data(), v.data());
  ASSERT_EQ(many.blockTable(bulk), one.blockTable(seq));
  for (int layer = 0; layer < 2; ++layer)
    for (PageId page : one.blockTable(seq))
      for (int head = 0; head < 3; ++head) {
        EXPECT_EQ(many.readKBlock(layer, page, head),
                  one.readKBlock(layer, page, head));
        EXPECT_EQ(many.readVBlock(layer, page, head),
                  one.readVBlock(layer, page, head));
      }
  many.appendTokens(bulk, 0, nullptr, nullptr);
  EXPECT_EQ(many.length(bulk), 9);
}

//===----------------------------------------------------------------------===//
// Fork, copy-on-write, freeing
//===----------------------------------------------------------------------===//

TEST(PagedKVCache, ForkCopiesAPartialTailOnWrite) {
  PagedKVCache cache(smallConfig(DType::BF16));
  Recorder recorder(cache, 3);
  SeqId parent = cache.addSequence();
  recorder.append(parent, 6); // one full page, two tokens in the tail
  const BlockManager &pages = cache.blockManager();
  PageId full = cache.blockTable(parent)[0];
  PageId tail = cache.blockTable(parent)[1];

  SeqId child = cache.fork(parent);
  recorder.fork(parent, child);
  EXPECT_EQ(cache.blockTable(child), cache.blockTable(parent));
  EXPECT_EQ(cache.length(child), 6);
  expectRefCounts(pages, {{full, 2}, {tail, 2}}, 2);

  // The child's first write copies the shared tail; the full page stays.
  recorder.append(child);
  EXPECT_EQ(cache.blockTable(child)[0], full);
  PageId childTail = cache.blockTable(child)[1];
  EXPECT_NE(childTail, tail);
  expectRefCounts(pages, {{full, 2}, {tail, 1}, {childTail, 1}}, 3);

  // The parent now owns its tail alone and writes in place.
  recorder.append(parent);
  EXPECT_EQ(cache.blockTable(parent)[1], tail);
  EXPECT_EQ(pages.numUsed(), 3);
  recorder.check(parent);
  recorder.check(child);

  // Filling further never copies the shared full page.
  recorder.append(parent, 5);
  recorder.append(child, 3);
  EXPECT_EQ(cache.blockTable(parent)[0], full);
  EXPECT_EQ(cache.blockTable(child)[0], full);
  expectRefCounts(pages, {{full, 2}}, 1 + 2 + 2);
  recorder.check(parent);
  recorder.check(child);
}

TEST(PagedKVCache, ForkAtAPageBoundaryCopiesNothing) {
  PagedKVCache cache(smallConfig(DType::F32));
  Recorder recorder(cache, 4);
  SeqId parent = cache.addSequence();
  recorder.append(parent, 8);
  SeqId child = cache.fork(parent);
  recorder.fork(parent, child);
  EXPECT_EQ(cache.blockManager().numUsed(), 2);
  recorder.append(child);
  recorder.append(parent);
  // One new page each; both full pages still shared.
  EXPECT_EQ(cache.blockManager().numUsed(), 4);
  for (PageId page : {cache.blockTable(parent)[0], cache.blockTable(parent)[1]})
    EXPECT_EQ(cache.blockManager().refCount(page), 2);
  EXPECT_NE(cache.blockTable(parent)[2], cache.blockTable(child)[2]);
  recorder.check(parent);
  recorder.check(child);
}

TEST(PagedKVCache, ForkOfAnEmptySequence) {
  PagedKVCache cache(smallConfig());
  Recorder recorder(cache, 5);
  SeqId parent = cache.addSequence();
  SeqId child = cache.fork(parent);
  recorder.append(child, 2);
  recorder.check(child);
  EXPECT_EQ(cache.length(parent), 0);
  EXPECT_EQ(cache.blockManager().numUsed(), 1);
}

TEST(PagedKVCache, FreeingReturnsPagesWhenTheLastUserGoes) {
  PagedKVCache cache(smallConfig(DType::F32, 8));
  Recorder recorder(cache, 6);
  SeqId root = cache.addSequence();
  recorder.append(root, 10); // 3 pages
  SeqId child = cache.fork(root);
  SeqId grandchild = cache.fork(child);
  recorder.fork(root, grandchild);
  recorder.append(grandchild, 2); // copies the tail: 4 pages
  EXPECT_EQ(cache.blockManager().numUsed(), 4);
  EXPECT_EQ(cache.numSequences(), 3u);
  EXPECT_EQ(cache.sequenceIds(), (std::vector<SeqId>{root, child, grandchild}));

  cache.freeSequence(root);
  EXPECT_FALSE(cache.hasSequence(root));
  EXPECT_EQ(cache.blockManager().numUsed(), 4);
  cache.freeSequence(child);
  // Only the grandchild's pages remain: two shared full pages and its copy.
  EXPECT_EQ(cache.blockManager().numUsed(), 3);
  for (PageId page : cache.blockTable(grandchild))
    EXPECT_EQ(cache.blockManager().refCount(page), 1);
  recorder.check(grandchild);
  cache.freeSequence(grandchild);
  EXPECT_EQ(cache.blockManager().numFree(), 8);
  EXPECT_EQ(cache.numSequences(), 0u);

  // Reused pages start zeroed.
  SeqId fresh = cache.addSequence();
  recorder.append(fresh, 1);
  recorder.check(fresh);
}

TEST(PagedKVCache, ExhaustionIsAnErrorAndChangesNothing) {
  PagedKVCache cache(smallConfig(DType::F32, 2));
  Recorder recorder(cache, 8);
  SeqId seq = cache.addSequence();
  recorder.append(seq, 8);
  std::vector<float> k = recorder.randomToken(), v = recorder.randomToken();
  expectError([&] { cache.append(seq, k.data(), v.data()); },
              "KV cache exhausted: all 2 pages are in use (sequence 0 needs "
              "one more for its token at position 8)");
  EXPECT_EQ(cache.length(seq), 8);
  EXPECT_EQ(cache.numBlocks(seq), 2);
  recorder.check(seq);

  // A shared partial tail needs a page for its copy.
  cache.freeSequence(seq);
  recorder.keys.clear();
  recorder.values.clear();
  SeqId a = cache.addSequence();
  recorder.append(a, 5);
  SeqId b = cache.fork(a);
  recorder.fork(a, b);
  expectError([&] { cache.append(b, k.data(), v.data()); },
              "KV cache exhausted: all 2 pages are in use (sequence " +
                  std::to_string(b) +
                  " needs one more to copy its shared tail page before "
                  "writing its token at position 5)");
  recorder.check(a);
  recorder.check(b);

  // Bulk appends check every page first.
  cache.freeSequence(b);
  std::vector<float> many(cache.tokenElements() * 8);
  expectError([&] { cache.appendTokens(a, 8, many.data(), many.data()); },
              "needs 2 more for its tokens at positions 5..12, 0 are free");
  recorder.check(a);
}

//===----------------------------------------------------------------------===//
// Cache fields
//===----------------------------------------------------------------------===//

CacheConfig configWithFields() {
  CacheConfig config = smallConfig(DType::BF16);
  config.fields = {{"kmax", DType::BF16, 5}, {"energy", DType::F32, 1}};
  return config;
}

TEST(PagedKVCache, FieldsLiveInPagePoolsSharedByFork) {
  PagedKVCache cache(configWithFields());
  Recorder recorder(cache, 9);
  EXPECT_EQ(cache.numFields(), 2);
  int kmax = cache.fieldIndex("kmax"), energy = cache.fieldIndex("energy");
  EXPECT_EQ(kmax, 0);
  EXPECT_EQ(energy, 1);
  EXPECT_EQ(cache.fieldSpec(1).elementsPerBlock, 1);

  SeqId parent = cache.addSequence();
  recorder.append(parent, 6);
  PageId full = cache.blockTable(parent)[0];
  PageId tail = cache.blockTable(parent)[1];
  std::vector<float> values = {1.0f, -2.5f, 3.14159f, 0.0f, 1e-3f};
  cache.writeField(kmax, 1, full, 2, values.data());
  float one = 7.25f;
  cache.writeField(energy, 0, tail, 0, &one);
  std::vector<float> stored = cache.readField(kmax, 1, full, 2);
  for (size_t i = 0; i < values.size(); ++i)
    EXPECT_EQ(stored[i], roundToDType(DType::BF16, values[i]));
  EXPECT_EQ(cache.readField(kmax, 0, full, 2), std::vector<float>(5, 0.0f));

  SeqId child = cache.fork(parent);
  // Shared pages share their fields: a write through either is seen by both.
  EXPECT_EQ(cache.readField(kmax, 1, cache.blockTable(child)[0], 2), stored);
  float two = -1.5f;
  cache.writeField(energy, 1, cache.blockTable(child)[0], 1, &two);
  EXPECT_EQ(cache.readField(energy, 1, full, 1), std::vector<float>{-1.5f});

  // Copy-on-write carries the tail's fields over to the copy.
  recorder.fork(parent, child);
  recorder.append(child);
  PageId copy = cache.blockTable(child)[1];
  ASSERT_NE(copy, tail);
  EXPECT_EQ(cache.readField(energy, 0, copy, 0), std::vector<float>{7.25f});
  float three = 2.0f;
  cache.writeField(energy, 0, copy, 0, &three);
  EXPECT_EQ(cache.readField(energy, 0, tail, 0), std::vector<float>{7.25f});

  // The index stage's view: complete blocks only, in logical order.
  EXPECT_EQ(cache.gatherField(child, energy, 1, 1), std::vector<float>{-1.5f});
  recorder.append(child, 1); // completes the child's second block
  EXPECT_EQ(cache.gatherField(child, energy, 0, 0),
            (std::vector<float>{0.0f, 2.0f}));
  EXPECT_EQ(cache.gatherField(parent, energy, 0, 0), std::vector<float>{0.0f});
  std::vector<float> gathered = cache.gatherField(child, kmax, 1, 2);
  ASSERT_EQ(gathered.size(), 10u);
  EXPECT_EQ(std::vector<float>(gathered.begin(), gathered.begin() + 5), stored);

  // Layout: [numPages, numKVHeads, elementsPerBlock] per layer.
  auto *pool = static_cast<const unsigned char *>(cache.fieldPool(kmax, 1));
  EXPECT_EQ(
      static_cast<const unsigned char *>(cache.fieldBlock(kmax, 1, full, 2)) -
          pool,
      (full * 3 + 2) * 5 * 2);
}

TEST(PagedKVCache, FieldErrors) {
  PagedKVCache cache(configWithFields());
  expectError([&] { cache.fieldIndex("kmin"); }, "no field named 'kmin'",
              "kmax, energy");
  expectError([&] { cache.readField(2, 0, 0, 0); }, "field index 2",
              "2 cache fields");
  expectError([&] { cache.readField(0, 0, 16, 0); }, "page 16", "16 pages");
  expectError([&] { cache.writeField(0, 0, 0, 0, nullptr); }, "null");
  expectError([&] { cache.gatherField(5, 0, 0, 0); },
              "gatherField: sequence 5 does not exist");
  SeqId seq = cache.addSequence();
  expectError([&] { cache.gatherField(seq, 0, 0, 4); }, "kv head 4");
  EXPECT_TRUE(cache.gatherField(seq, 1, 1, 2).empty());
  PagedKVCache plain(smallConfig());
  expectError([&] { plain.fieldIndex("kmax"); }, "no cache fields");
}

//===----------------------------------------------------------------------===//
// States
//===----------------------------------------------------------------------===//

CacheConfig configWithStates() {
  CacheConfig config = smallConfig(DType::F32);
  config.states = {{"acc", DType::F32, 1, true, 1.5f},
                   {"qbar", DType::BF16, 2 * 5, false, 0.1f},
                   {"hist", DType::FP8E4M3, 2, true, 1000.0f}};
  return config;
}

TEST(PagedKVCache, PerBlockStatesGrowWithCompleteBlocks) {
  PagedKVCache cache(configWithStates());
  Recorder recorder(cache, 10);
  int acc = cache.stateIndex("acc"), qbar = cache.stateIndex("qbar"),
      hist = cache.stateIndex("hist");
  SeqId seq = cache.addSequence();
  EXPECT_EQ(cache.stateElements(seq, acc), 0);
  EXPECT_EQ(cache.stateElements(seq, qbar), 10);
  EXPECT_EQ(cache.readState(seq, qbar, 1, 2),
            std::vector<float>(10, roundToDType(DType::BF16, 0.1f)));

  recorder.append(seq, 3); // no complete block yet
  EXPECT_EQ(cache.stateElements(seq, acc), 0);
  recorder.append(seq, 1);
  EXPECT_EQ(cache.stateElements(seq, acc), 1);
  EXPECT_EQ(cache.stateElements(seq, hist), 2);
  EXPECT_EQ(cache.readState(seq, acc, 0, 0), std::vector<float>{1.5f});
  // The init value is stored in the state's dtype: 1000 saturates to 448.
  EXPECT_EQ(cache.readState(seq, hist, 1, 1),
            (std::vector<float>{448.0f, 448.0f}));

  float stored = 9.0f;
  cache.writeState(seq, acc, 1, 2, &stored, 1);
  recorder.append(seq, 4);
  EXPECT_EQ(cache.readState(seq, acc, 1, 2), (std::vector<float>{9.0f, 1.5f}));
  EXPECT_EQ(cache.readState(seq, acc, 1, 1), (std::vector<float>{1.5f, 1.5f}));
  EXPECT_EQ(*static_cast<const float *>(cache.stateData(seq, acc, 1, 2)), 9.0f);

  std::vector<float> wrong(3);
  expectError([&] { cache.writeState(seq, acc, 0, 0, wrong.data(), 3); },
              "state 'acc'", "holds 2 elements, got 3");
  expectError([&] { cache.stateIndex("mass"); }, "no state named 'mass'",
              "acc, qbar, hist");
  expectError([&] { cache.readState(seq, 3, 0, 0); }, "state index 3");
  expectError([&] { cache.readState(seq, acc, 2, 0); }, "layer 2");
  expectError([&] { cache.readState(seq, acc, 0, 3); }, "kv head 3");
}

// Block-grain eviction: pages go back to the pool unless a fork still
// holds them, later blocks move down with their per-block state rows, the
// original positions are kept, and a partial tail shared with a fork is
// copied before the evicted sequence writes into it.
TEST(PagedKVCache, EvictReturnsPagesAndKeepsTheRest) {
  PagedKVCache cache(configWithStates());
  Recorder recorder(cache, 12);
  const int acc = cache.stateIndex("acc"), hist = cache.stateIndex("hist");
  SeqId parent = cache.addSequence();
  recorder.append(parent, 18); // blocks 0-3 complete, block 4 partial
  const std::vector<float> rows = {10, 11, 12, 13};
  cache.writeState(parent, acc, 1, 2, rows.data(), 4);
  const std::vector<PageId> pages = cache.blockTable(parent);
  SeqId child = cache.fork(parent);
  recorder.fork(parent, child);
  EXPECT_EQ(cache.blockManager().numFree(), 16 - 5);

  recorder.evict(child, {1, 2});
  recorder.check(child);
  recorder.check(parent);
  EXPECT_EQ(cache.blockTable(child),
            (std::vector<PageId>{pages[0], pages[3], pages[4]}));
  EXPECT_EQ(cache.blockManager().numFree(), 16 - 5); // the parent holds them
  EXPECT_EQ(cache.length(child), 10);
  EXPECT_EQ(cache.pageTable().evictedTokens(child), 8);
  EXPECT_EQ(cache.pageTable().originalBlock(child, 1), 3);
  EXPECT_EQ(cache.readState(child, acc, 1, 2), (std::vector<float>{10, 13}));
  EXPECT_EQ(cache.readState(parent, acc, 1, 2), rows);
  EXPECT_EQ(cache.stateElements(child, hist), 2 * 2);

  // The parent lets go of block 1 too: its page is free now.
  recorder.evict(parent, {1});
  recorder.check(parent);
  EXPECT_EQ(cache.blockManager().numFree(), 16 - 4);
  EXPECT_TRUE(cache.blockManager().isFree(pages[1]));
  EXPECT_EQ(cache.readState(parent, acc, 1, 2),
            (std::vector<float>{10, 12, 13}));

  // Growing after an eviction: the shared tail is copied first, the new
  // block's original index counts the evicted ones.
  recorder.append(child, 3);
  recorder.check(child);
  recorder.check(parent);
  EXPECT_NE(cache.blockTable(child)[2], pages[4]);
  EXPECT_EQ(cache.pageTable().originalBlock(child, 3), 5);
  EXPECT_EQ(cache.readState(child, acc, 1, 2),
            (std::vector<float>{10, 13, 1.5f}));

  // Bad blocks are errors that change nothing.
  expectError([&] { cache.evict(child, {1, 0}); }, "strictly increasing");
  expectError([&] { cache.evict(child, {3}); }, "block 3",
              "not a complete block");
  expectError([&] { cache.evict(child, {-1}); }, "block -1");
  expectError([&] { cache.evict(99, {0}); }, "99");
  recorder.check(child);
  // Its pages no longer hold a prefix of its tokens.
  expectError([&] { cache.sharePrefix(child, 4); }, "evicted 8 tokens");
  cache.evict(child, {});
  recorder.check(child);
  cache.freeSequence(child);
  cache.freeSequence(parent);
  EXPECT_EQ(cache.blockManager().numFree(), 16);
}

// Token-grain eviction: the kept tokens move down in order (K/V as stored,
// the tail past the length zero), a page a fork shares is copied instead of
// rewritten, the rewritten blocks' per-block state rows start over, the
// fields hook runs for them, and the original positions are kept.
TEST(PagedKVCache, EvictTokensRepacksAndCopiesSharedPages) {
  PagedKVCache cache(configWithStates());
  Recorder recorder(cache, 21);
  const int acc = cache.stateIndex("acc");
  std::set<std::tuple<int, PageId, int>> hooked;
  SeqId parent = cache.addSequence();
  recorder.append(parent, 18); // blocks 0-3 complete, block 4 partial
  const std::vector<float> rows = {10, 11, 12, 13};
  cache.writeState(parent, acc, 1, 2, rows.data(), 4);
  const std::vector<PageId> pages = cache.blockTable(parent);
  SeqId child = cache.fork(parent);
  recorder.fork(parent, child);
  cache.setPageFullHook([&](int layer, PageId page, int head) {
    hooked.insert({layer, page, head});
  });
  // Tokens 5, 6 (block 1) and 12 (block 3): 15 tokens in blocks 0-3.
  recorder.evictTokens(child, {5, 6, 12});
  recorder.check(child);
  recorder.check(parent);
  const std::vector<PageId> now = cache.blockTable(child);
  ASSERT_EQ(now.size(), 4u);
  EXPECT_EQ(now[0], pages[0]); // before the first evicted token: shared
  for (size_t b = 1; b < 4; ++b)
    EXPECT_TRUE(std::find(pages.begin(), pages.end(), now[b]) == pages.end())
        << "block " << b << " was shared and must be a copy";
  // Blocks 1 and 2 are complete and rewritten: their fields, per layer and
  // head (2 x 3 x 2 calls).
  EXPECT_EQ(hooked.size(), size_t(2 * 3 * 2));
  EXPECT_EQ(cache.readState(child, acc, 1, 2),
            (std::vector<float>{10, 1.5f, 1.5f}));
  EXPECT_EQ(cache.readState(parent, acc, 1, 2), rows);
  EXPECT_EQ(cache.pageTable().originalPosition(child, 5), 7);
  EXPECT_EQ(cache.pageTable().originalPosition(child, 9), 11);
  EXPECT_EQ(cache.pageTable().originalPosition(child, 10), 13);
  EXPECT_EQ(cache.pageTable().originalBlock(child, 2), 2); // token 10 first
  EXPECT_EQ(cache.pageTable().evictedTokens(child), 3);
  EXPECT_EQ(cache.blockManager().numFree(), 16 - 5 - 3);

  // Block 0 is still shared (copied now), the others are the child's own
  // (rewritten in place); its last page goes back.
  recorder.evictTokens(child, {0, 1, 2, 3});
  recorder.check(child);
  recorder.check(parent);
  EXPECT_NE(cache.blockTable(child)[0], pages[0]);
  EXPECT_EQ(cache.blockTable(child)[1], now[1]);
  EXPECT_EQ(cache.blockManager().numFree(), 16 - 5 - 3);
  recorder.append(child, 2); // positions 18 and 19
  recorder.check(child);
  EXPECT_EQ(cache.pageTable().originalPosition(child, 11), 18);

  // Bad input changes nothing.
  expectError([&] { cache.evictTokens(child, {3, 2}); }, "strictly increasing");
  expectError([&] { cache.evictTokens(child, {12}); }, "token 12",
              "not in a complete block");
  expectError([&] { cache.evictTokens(99, {0}); }, "99");
  recorder.check(child);
  cache.freeSequence(child);
  cache.freeSequence(parent);
  EXPECT_EQ(cache.blockManager().numFree(), 16);
}

TEST(PagedKVCache, ScaledKVMovesItsScalesWithItsTokens) {
  // int8 K/V: fork's copy on write, token eviction's repack and block
  // eviction carry each token's scale with its bytes.
  CacheConfig config = smallConfig(DType::INT8);
  PagedKVCache cache(config);
  Recorder recorder(cache, 23);
  SeqId parent = cache.addSequence();
  recorder.append(parent, 14);
  SeqId child = cache.fork(parent);
  recorder.fork(parent, child);
  recorder.append(child, 3); // copies the shared partial tail
  recorder.evictTokens(child, {1, 4, 5, 9});
  recorder.check(child);
  recorder.check(parent);
  ASSERT_NE(cache.kScales(0, cache.blockTable(child)[0], 0), nullptr);
  EXPECT_EQ(PagedKVCache(smallConfig(DType::BF16)).kScales(0, 0, 0), nullptr);
}

TEST(PagedKVCache, ValuesAreKeysKeepsOnePool) {
  // Latent attention's rows: V reads K's bytes and scales through appends,
  // fork's copy on write, token and block eviction; no V pool is kept.
  for (DType type : {DType::F32, DType::INT8}) {
    CacheConfig config = smallConfig(type);
    config.valuesAreKeys = true;
    PagedKVCache cache(config);
    EXPECT_EQ(cache.vPool(1), cache.kPool(1));
    Recorder recorder(cache, 29);
    SeqId parent = cache.addSequence();
    recorder.append(parent, 14);
    SeqId child = cache.fork(parent);
    recorder.fork(parent, child);
    recorder.append(child, 3);
    recorder.evictTokens(child, {1, 4, 5, 9});
    recorder.evict(child, {1});
    recorder.check(child);
    recorder.check(parent);
    EXPECT_EQ(cache.vScales(0, cache.blockTable(child)[0], 1),
              cache.kScales(0, cache.blockTable(child)[0], 1));
  }
}

TEST(PagedKVCache, ScaledKVErrorIsBoundedOnFreshData) {
  // Against the float64 value: int8 is off by at most half a step (the
  // row's largest magnitude / 254), fp8e4m3 by half a unit in its last
  // place (2^-4 relative) or, below its normal range, half a subnormal
  // step of the scaled row; bf16 for comparison.
  for (unsigned seed : {1u, 2u, 3u}) {
    for (DType type : {DType::INT8, DType::FP8E4M3, DType::BF16}) {
      PagedKVCache cache(smallConfig(type));
      Recorder recorder(cache, seed * 7);
      SeqId seq = cache.addSequence();
      recorder.append(seq, 8);
      const int D = cache.headDim();
      double worst = 0;
      for (int64_t t = 0; t < 8; ++t)
        for (int layer = 0; layer < cache.numLayers(); ++layer)
          for (int head = 0; head < cache.numKVHeads(); ++head) {
            std::vector<float> k = cache.readKBlock(
                layer, cache.blockTable(seq)[size_t(t / 4)], head);
            const size_t row = (size_t(layer) * cache.numKVHeads() + head) * D;
            const std::vector<float> &want = recorder.keys[seq][size_t(t)];
            double absMax = 0;
            for (int d = 0; d < D; ++d)
              absMax = std::max(absMax, std::fabs(double(want[row + d])));
            for (int d = 0; d < D; ++d) {
              const double x = want[row + d];
              const double got = k[size_t(t % 4) * D + d];
              const double bound =
                  type == DType::INT8 ? absMax / 254.0
                  : type == DType::FP8E4M3
                      ? std::fabs(x) / 16.0 + absMax / 448.0 / 1024.0
                      : std::fabs(x) / 256.0;
              EXPECT_LE(std::fabs(got - x), bound * (1 + 1e-6))
                  << dtypeName(type) << " seed " << seed << " token " << t;
              worst = std::max(worst, std::fabs(got - x) / absMax);
            }
          }
      EXPECT_GT(worst, 0.0) << dtypeName(type); // it does round
    }
  }
}

TEST(PagedKVCache, ForkCopiesStates) {
  PagedKVCache cache(configWithStates());
  Recorder recorder(cache, 11);
  int acc = cache.stateIndex("acc"), qbar = cache.stateIndex("qbar");
  SeqId parent = cache.addSequence();
  recorder.append(parent, 9);
  std::vector<float> values = {4.0f, 5.0f};
  cache.writeState(parent, acc, 0, 1, values.data(), 2);
  std::vector<float> q(10);
  for (int i = 0; i < 10; ++i)
    q[i] = 0.5f * i;
  cache.writeState(parent, qbar, 1, 0, q.data(), 10);

  SeqId child = cache.fork(parent);
  EXPECT_EQ(cache.readState(child, acc, 0, 1), values);
  EXPECT_EQ(cache.readState(child, qbar, 1, 0), q);
  // Independent after the fork.
  std::vector<float> other = {-1.0f, -2.0f};
  cache.writeState(child, acc, 0, 1, other.data(), 2);
  EXPECT_EQ(cache.readState(parent, acc, 0, 1), values);
  recorder.fork(parent, child);
  recorder.append(child, 3);
  EXPECT_EQ(cache.stateElements(child, acc), 3);
  EXPECT_EQ(cache.stateElements(parent, acc), 2);
  EXPECT_EQ(cache.readState(child, acc, 0, 1),
            (std::vector<float>{-1.0f, -2.0f, 1.5f}));
}

TEST(PagedKVCache, SharePrefixSharesPagesWithFreshStates) {
  PagedKVCache cache(configWithStates());
  Recorder recorder(cache, 12);
  int acc = cache.stateIndex("acc"), qbar = cache.stateIndex("qbar");
  SeqId parent = cache.addSequence();
  recorder.append(parent, 10); // blocks of 4: two full pages and a partial
  std::vector<float> values = {4.0f, 5.0f};
  cache.writeState(parent, acc, 0, 1, values.data(), 2);
  int64_t usedBefore = cache.blockManager().numUsed();

  SeqId child = cache.sharePrefix(parent, 8);
  EXPECT_EQ(cache.length(child), 8);
  EXPECT_EQ(cache.blockManager().numUsed(), usedBefore); // nothing copied
  EXPECT_EQ(cache.blockTable(child),
            std::vector<PageId>(cache.blockTable(parent).begin(),
                                cache.blockTable(parent).begin() + 2));
  // Its own states at their initial values, covering the prefix's blocks.
  EXPECT_EQ(cache.readState(child, acc, 0, 1),
            (std::vector<float>{1.5f, 1.5f}));
  EXPECT_EQ(cache.readState(child, qbar, 1, 0),
            std::vector<float>(10, roundToDType(DType::BF16, 0.1f)));
  // Its tokens are the parent's first 8; it grows on pages of its own.
  recorder.keys[child].assign(recorder.keys[parent].begin(),
                              recorder.keys[parent].begin() + 8);
  recorder.values[child].assign(recorder.values[parent].begin(),
                                recorder.values[parent].begin() + 8);
  recorder.append(child, 3);
  recorder.check(child);
  recorder.check(parent);
  EXPECT_EQ(cache.readState(parent, acc, 0, 1), values);

  // The whole sequence (a partial tail) is a prefix too: copy on write.
  SeqId whole = cache.sharePrefix(parent, 10);
  recorder.fork(parent, whole);
  recorder.append(whole, 1);
  recorder.append(parent, 1);
  recorder.check(whole);
  recorder.check(parent);
  SeqId empty = cache.sharePrefix(parent, 0);
  EXPECT_EQ(cache.length(empty), 0);
  EXPECT_EQ(cache.numBlocks(empty), 0);

  expectError([&] { cache.sharePrefix(parent, 6); }, "sharePrefix",
              "not a whole number of blocks of 4");
  expectError([&] { cache.sharePrefix(parent, 12); }, "sharePrefix",
              "which has 11");
  expectError([&] { cache.sharePrefix(99, 0); }, "sharePrefix");
  // Releasing the parent leaves the shared pages with the children.
  cache.freeSequence(parent);
  recorder.check(child);
  recorder.check(whole);
}

//===----------------------------------------------------------------------===//
// The page-full hook
//===----------------------------------------------------------------------===//

TEST(PagedKVCache, PageFullHookFiresOncePerLayerPageAndHead) {
  CacheConfig config = configWithFields();
  config.states = {{"acc", DType::F32, 1, true, 0.0f}};
  PagedKVCache cache(config);
  Recorder recorder(cache, 12);
  std::map<std::tuple<int, PageId, int>, int> calls;
  std::vector<std::tuple<int, PageId, int>> order;
  SeqId current = -1;
  int kmax = cache.fieldIndex("kmax");
  cache.setPageFullHook([&](int layer, PageId page, int kvHead) {
    ++calls[{layer, page, kvHead}];
    order.emplace_back(layer, page, kvHead);
    // The page holds all its tokens, and the per-block state has grown.
    std::vector<float> k = cache.readKBlock(layer, page, kvHead);
    const std::vector<float> &last = recorder.keys[current].back();
    for (int d = 0; d < 5; ++d)
      EXPECT_EQ(k[3 * 5 + d],
                roundToDType(DType::BF16, last[(layer * 3 + kvHead) * 5 + d]));
    EXPECT_EQ(cache.stateElements(current, 0), cache.length(current) / 4);
    // The compiled cache stage would compute fields here: kmax over tokens.
    std::vector<float> maxima(5, -1e30f);
    for (int t = 0; t < 4; ++t)
      for (int d = 0; d < 5; ++d)
        maxima[d] = std::max(maxima[d], k[t * 5 + d]);
    cache.writeField(kmax, layer, page, kvHead, maxima.data());
  });

  SeqId seq = cache.addSequence();
  current = seq;
  recorder.append(seq, 3);
  EXPECT_TRUE(calls.empty());
  recorder.append(seq, 1);
  EXPECT_EQ(calls.size(), 2u * 3u);
  std::vector<std::tuple<int, PageId, int>> expectedOrder;
  PageId first = cache.blockTable(seq)[0];
  for (int layer = 0; layer < 2; ++layer)
    for (int head = 0; head < 3; ++head)
      expectedOrder.emplace_back(layer, first, head);
  EXPECT_EQ(order, expectedOrder);

  recorder.append(seq, 2); // partial: nothing
  EXPECT_EQ(calls.size(), 6u);
  SeqId child = cache.fork(seq);
  recorder.fork(seq, child);
  current = child;
  recorder.append(child, 2); // copies the tail, then fills the copy
  current = seq;
  recorder.append(seq, 2); // fills the original tail
  EXPECT_EQ(calls.size(), 3u * 6u);
  for (const auto &entry : calls)
    EXPECT_EQ(entry.second, 1);
  for (SeqId s : {seq, child})
    for (PageId page : cache.blockTable(s))
      for (int layer = 0; layer < 2; ++layer)
        for (int head = 0; head < 3; ++head)
          EXPECT_EQ(calls.count({layer, page, head}), 1u);

  // The field written by the hook is the per-dim max of the block's keys.
  std::vector<float> k = cache.readKBlock(1, first, 2);
  std::vector<float> field = cache.readField(kmax, 1, first, 2);
  for (int d = 0; d < 5; ++d)
    EXPECT_EQ(field[d], std::max({k[d], k[5 + d], k[10 + d], k[15 + d]}));

  // The hook may not change sequences; the token that filled the page stays.
  cache.setPageFullHook([&](int, PageId, int) { cache.addSequence(); });
  current = seq;
  int64_t before = cache.length(seq);
  std::vector<float> t = recorder.randomToken();
  std::vector<float> tokens;
  for (int i = 0; i < 4; ++i)
    tokens.insert(tokens.end(), t.begin(), t.end());
  expectError([&] { cache.appendTokens(seq, 4, tokens.data(), tokens.data()); },
              "addSequence: not allowed inside the page-full hook");
  EXPECT_EQ(cache.length(seq), before + 4);
  cache.setPageFullHook({});
  SeqId after = cache.addSequence();
  EXPECT_TRUE(cache.hasSequence(after));
}

//===----------------------------------------------------------------------===//
// Bad arguments
//===----------------------------------------------------------------------===//

TEST(PagedKVCache, BadArgumentsAreErrors) {
  PagedKVCache cache(smallConfig());
  Recorder recorder(cache, 13);
  SeqId seq = cache.addSequence();
  recorder.append(seq, 5);
  std::vector<float> token = recorder.randomToken();
  expectError([&] { cache.length(42); }, "length: sequence 42 does not exist");
  expectError([&] { cache.append(-1, token.data(), token.data()); },
              "append: sequence -1 does not exist");
  SeqId gone = cache.addSequence();
  cache.freeSequence(gone);
  expectError([&] { cache.append(gone, token.data(), token.data()); },
              "sequence 1 was freed");
  expectError([&] { cache.freeSequence(gone); }, "freeSequence", "was freed");
  expectError([&] { cache.fork(gone); }, "fork: sequence 1 was freed");
  expectError([&] { cache.append(seq, nullptr, token.data()); },
              "must not be null");
  expectError([&] { cache.appendTokens(seq, -2, token.data(), token.data()); },
              "numTokens", "got -2");
  expectError([&] { cache.physicalPage(seq, 2); }, "block 2 is out of range",
              "has 2 blocks");
  expectError([&] { cache.tokensInBlock(seq, -1); }, "block -1");
  expectError([&] { cache.kBlock(2, 0, 0); }, "kBlock: layer 2", "2 layers");
  expectError([&] { cache.readVBlock(0, -1, 0); }, "vBlock: page -1");
  expectError([&] { cache.readKBlock(0, 0, 3); }, "kv head 3", "3 kv heads");
  expectError([&] { cache.kPool(-1); }, "layer -1");
  EXPECT_EQ(cache.length(seq), 5);
  recorder.check(seq);
}

} // namespace
