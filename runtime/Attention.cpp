//===- Attention.cpp - Host reference decode attention --------------------===//

#include "vflow/Runtime/Attention.h"
#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

using namespace vflow::rt;

namespace {

std::string str(int64_t value) { return std::to_string(value); }

void checkCommon(const PagedKVCache &cache, SeqId seq, int layer,
                 const float *q, int group, float scale, const float *out,
                 const char *operation) {
  if (layer < 0 || layer >= cache.numLayers())
    throw Error(std::string(operation) + ": layer " + str(layer) +
                " is out of range: the cache has " + str(cache.numLayers()) +
                " layers");
  if (group <= 0)
    throw Error(std::string(operation) +
                ": group (query heads per kv head) must be positive, got " +
                str(group));
  if (!q || !out)
    throw Error(std::string(operation) + ": q and out must not be null");
  if (!std::isfinite(scale))
    throw Error(std::string(operation) + ": the softmax scale must be finite");
  if (cache.length(seq) == 0)
    throw Error(std::string(operation) + ": sequence " + str(seq) +
                " is empty; attention over zero tokens is undefined");
}

/// Attention of one kv head's `group` query heads over `blocks` of `seq`.
/// q and out point at the group's first query head; massOut (or null) at
/// the kv head's [numBlocks, group] slice, already zeroed.
void attendKVHead(const PagedKVCache &cache, SeqId seq, int layer, int kvHead,
                  const float *q, int group, float scale,
                  const std::vector<int64_t> &blocks, float *out,
                  float *massOut) {
  const int pageSize = cache.pageSize();
  const int headDim = cache.headDim();
  const std::vector<PageId> &table = cache.blockTable(seq);

  // Scores of every attended token, [group, tokens], in list order.
  std::vector<int> blockTokens;
  int64_t totalTokens = 0;
  for (int64_t block : blocks) {
    int tokens = cache.tokensInBlock(seq, block);
    blockTokens.push_back(tokens);
    totalTokens += tokens;
  }
  std::vector<float> scores(static_cast<size_t>(group) * totalTokens);
  std::vector<float> tile(static_cast<size_t>(pageSize) * headDim);

  int64_t base = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    cache.readKBlock(layer, table[blocks[i]], kvHead, tile.data());
    for (int g = 0; g < group; ++g) {
      const float *qRow = q + static_cast<size_t>(g) * headDim;
      for (int t = 0; t < blockTokens[i]; ++t) {
        const float *kRow = tile.data() + static_cast<size_t>(t) * headDim;
        float dot = 0.0f;
        for (int d = 0; d < headDim; ++d)
          dot += qRow[d] * kRow[d];
        scores[static_cast<size_t>(g) * totalTokens + base + t] = dot * scale;
      }
    }
    base += blockTokens[i];
  }

  std::vector<float> denominators(group);
  for (int g = 0; g < group; ++g) {
    float *row = scores.data() + static_cast<size_t>(g) * totalTokens;
    float maxScore = -std::numeric_limits<float>::infinity();
    for (int64_t t = 0; t < totalTokens; ++t)
      maxScore = std::max(maxScore, row[t]);
    float sum = 0.0f;
    for (int64_t t = 0; t < totalTokens; ++t) {
      row[t] = std::exp(row[t] - maxScore);
      sum += row[t];
    }
    denominators[g] = sum;
  }

  std::fill(out, out + static_cast<size_t>(group) * headDim, 0.0f);
  base = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    cache.readVBlock(layer, table[blocks[i]], kvHead, tile.data());
    for (int g = 0; g < group; ++g) {
      const float *weights =
          scores.data() + static_cast<size_t>(g) * totalTokens + base;
      float *outRow = out + static_cast<size_t>(g) * headDim;
      float blockMass = 0.0f;
      for (int t = 0; t < blockTokens[i]; ++t) {
        const float *vRow = tile.data() + static_cast<size_t>(t) * headDim;
        for (int d = 0; d < headDim; ++d)
          outRow[d] += weights[t] * vRow[d];
        blockMass += weights[t];
      }
      if (massOut)
        massOut[blocks[i] * group + g] = blockMass / denominators[g];
    }
    base += blockTokens[i];
  }
  for (int g = 0; g < group; ++g) {
    float inverse = 1.0f / denominators[g];
    float *outRow = out + static_cast<size_t>(g) * headDim;
    for (int d = 0; d < headDim; ++d)
      outRow[d] *= inverse;
  }
}

} // namespace

void vflow::rt::sparseDecodeAttention(const PagedKVCache &cache, SeqId seq,
                                      int layer, const float *q, int group,
                                      float scale, const BlockLists &blocks,
                                      float *out, float *mass) {
  const char *operation = "sparseDecodeAttention";
  checkCommon(cache, seq, layer, q, group, scale, out, operation);
  const int64_t numBlocks = cache.numBlocks(seq);
  if (static_cast<int64_t>(blocks.size()) != cache.numKVHeads())
    throw Error(std::string(operation) + ": expected one block list per kv " +
                "head (" + str(cache.numKVHeads()) + "), got " +
                str(blocks.size()));
  std::vector<char> seen(static_cast<size_t>(numBlocks));
  for (int head = 0; head < cache.numKVHeads(); ++head) {
    if (blocks[head].empty())
      throw Error(std::string(operation) + ": the block list of kv head " +
                  str(head) +
                  " is empty; attention over zero tokens is undefined");
    std::fill(seen.begin(), seen.end(), 0);
    for (int64_t block : blocks[head]) {
      if (block < 0 || block >= numBlocks)
        throw Error(std::string(operation) + ": block " + str(block) +
                    " of kv head " + str(head) + " is out of range: sequence " +
                    str(seq) + " has " + str(numBlocks) + " blocks");
      if (seen[block])
        throw Error(std::string(operation) + ": block " + str(block) +
                    " is listed twice for kv head " + str(head));
      seen[block] = 1;
    }
  }

  const size_t headDim = static_cast<size_t>(cache.headDim());
  const size_t massSlice = static_cast<size_t>(numBlocks) * group;
  if (mass)
    std::fill(mass, mass + massSlice * cache.numKVHeads(), 0.0f);
  for (int head = 0; head < cache.numKVHeads(); ++head) {
    size_t firstQHead = static_cast<size_t>(head) * group;
    attendKVHead(cache, seq, layer, head, q + firstQHead * headDim, group,
                 scale, blocks[head], out + firstQHead * headDim,
                 mass ? mass + head * massSlice : nullptr);
  }
}

void vflow::rt::denseDecodeAttention(const PagedKVCache &cache, SeqId seq,
                                     int layer, const float *q, int group,
                                     float scale, float *out, float *mass) {
  checkCommon(cache, seq, layer, q, group, scale, out, "denseDecodeAttention");
  std::vector<int64_t> all(static_cast<size_t>(cache.numBlocks(seq)));
  for (size_t block = 0; block < all.size(); ++block)
    all[block] = static_cast<int64_t>(block);
  sparseDecodeAttention(cache, seq, layer, q, group, scale,
                        BlockLists(cache.numKVHeads(), all), out, mass);
}

void vflow::rt::causalPrefillAttention(const PagedKVCache &cache, SeqId seq,
                                       int layer, const float *q, int64_t n,
                                       int group, float scale, float *out,
                                       float *mass, int64_t observe) {
  const char *operation = "causalPrefillAttention";
  checkCommon(cache, seq, layer, q, group, scale, out, operation);
  const int64_t length = cache.length(seq);
  if (n < 1 || n > length)
    throw Error(std::string(operation) + ": " + str(n) +
                " query rows for a sequence of " + str(length) + " tokens");
  const int64_t P = cache.pageSize(), D = cache.headDim();
  const int64_t H = cache.numKVHeads(), numBlocks = cache.numBlocks(seq);
  std::vector<float> k(size_t(numBlocks * P * D)), v(k.size()), scores;
  // The observation window: the last `window` rows add their mass / window.
  const int64_t window = mass ? std::min(std::max<int64_t>(observe, 0), n) : 0;
  if (mass)
    std::fill(mass, mass + size_t(H * numBlocks * group), 0.0f);
  for (int64_t head = 0; head < H; ++head) {
    // This head's K and V of every token, in order.
    for (int64_t b = 0; b < numBlocks; ++b) {
      PageId page = cache.physicalPage(seq, b);
      cache.readKBlock(layer, page, int(head), k.data() + b * P * D);
      cache.readVBlock(layer, page, int(head), v.data() + b * P * D);
    }
    for (int64_t i = 0; i < n; ++i) {
      const int64_t visible = length - n + i + 1;
      scores.resize(size_t(visible));
      for (int g = 0; g < group; ++g) {
        const size_t row = size_t((i * H + head) * group + g) * size_t(D);
        const float *qr = q + row;
        float top = -std::numeric_limits<float>::infinity();
        for (int64_t t = 0; t < visible; ++t) {
          const float *kr = k.data() + t * D;
          float dot = 0;
          for (int64_t d = 0; d < D; ++d)
            dot += qr[d] * kr[d];
          scores[size_t(t)] = dot * scale;
          top = std::max(top, scores[size_t(t)]);
        }
        float sum = 0;
        for (float &s : scores) {
          s = std::exp(s - top);
          sum += s;
        }
        float *o = out + row;
        std::fill(o, o + D, 0.0f);
        const bool observed = i >= n - window;
        for (int64_t t = 0; t < visible; ++t) {
          const float w = scores[size_t(t)] / sum;
          const float *vr = v.data() + t * D;
          for (int64_t d = 0; d < D; ++d)
            o[d] += w * vr[d];
          if (observed)
            mass[size_t((head * numBlocks + t / P) * group + g)] +=
                w / float(window);
        }
      }
    }
  }
}

namespace {

size_t massElements(const PagedKVCache &cache, SeqId seq, int group) {
  return static_cast<size_t>(cache.numKVHeads()) * cache.numBlocks(seq) *
         std::max(group, 0);
}

} // namespace

namespace {

/// Runs `one(i, q_i, out_i, mass_i)` for every sequence of a batch, with the
/// per-sequence mass arrays sized as the single-sequence kernels expect.
template <typename Fn>
void forEachSequence(const PagedKVCache &cache, const std::vector<SeqId> &seqs,
                     const float *q, int group, float *out,
                     std::vector<std::vector<float>> *masses, Fn one) {
  const size_t stride = static_cast<size_t>(cache.numKVHeads()) *
                        std::max(group, 0) * cache.headDim();
  if (masses)
    masses->assign(seqs.size(), {});
  for (size_t i = 0; i < seqs.size(); ++i) {
    float *mass = nullptr;
    if (masses) {
      (*masses)[i].resize(massElements(cache, seqs[i], group));
      mass = (*masses)[i].data();
    }
    one(i, q + i * stride, out + i * stride, mass);
  }
}

} // namespace

void vflow::rt::denseDecodeAttentionBatch(
    const PagedKVCache &cache, const std::vector<SeqId> &seqs, int layer,
    const float *q, int group, float scale, float *out,
    std::vector<std::vector<float>> *masses) {
  if (!q || !out)
    throw Error("denseDecodeAttentionBatch: q and out must not be null");
  forEachSequence(cache, seqs, q, group, out, masses,
                  [&](size_t i, const float *qi, float *oi, float *mass) {
                    denseDecodeAttention(cache, seqs[i], layer, qi, group,
                                         scale, oi, mass);
                  });
}

void vflow::rt::sparseDecodeAttentionBatch(
    const PagedKVCache &cache, const std::vector<SeqId> &seqs, int layer,
    const float *q, int group, float scale,
    const std::vector<BlockLists> &blocks, float *out,
    std::vector<std::vector<float>> *masses) {
  if (!q || !out)
    throw Error("sparseDecodeAttentionBatch: q and out must not be null");
  if (blocks.size() != seqs.size())
    throw Error("sparseDecodeAttentionBatch: expected one BlockLists per "
                "sequence (" +
                str(seqs.size()) + "), got " + str(blocks.size()));
  forEachSequence(cache, seqs, q, group, out, masses,
                  [&](size_t i, const float *qi, float *oi, float *mass) {
                    sparseDecodeAttention(cache, seqs[i], layer, qi, group,
                                          scale, blocks[i], oi, mass);
                  });
}
