//===- Attention.cpp - Host reference decode attention --------------------===//

#include "vflow/Runtime/Attention.h"
#include "vflow/Runtime/Error.h"

#ifdef VFLOW_HAS_CBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstring>
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

/// s[r][t] = scale * (q_r . k_t) for r < rows, t < cols: q's rows are `ldq`
/// floats apart, k's `d`, s's `cols`.
void scoreRows(const float *q, int64_t ldq, int64_t rows, const float *k,
               int64_t cols, int64_t d, float scale, float *s) {
#ifdef VFLOW_HAS_CBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(cols),
              int(d), scale, q, int(ldq), k, int(d), 0.0f, s, int(cols));
#else
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t t = 0; t < cols; ++t) {
      const float *qr = q + r * ldq, *kr = k + t * d;
      float dot = 0;
      for (int64_t j = 0; j < d; ++j)
        dot += qr[j] * kr[j];
      s[r * cols + t] = dot * scale;
    }
#endif
}

/// o_r = sum_t p[r][t] v_t for r < rows: o's rows are `ldo` floats apart.
void mixRows(const float *p, int64_t rows, int64_t cols, const float *v,
             int64_t d, float *o, int64_t ldo) {
#ifdef VFLOW_HAS_CBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, int(rows), int(d),
              int(cols), 1.0f, p, int(cols), v, int(d), 0.0f, o, int(ldo));
#else
  for (int64_t r = 0; r < rows; ++r) {
    float *orow = o + r * ldo;
    std::fill(orow, orow + d, 0.0f);
    for (int64_t t = 0; t < cols; ++t) {
      const float w = p[r * cols + t], *vr = v + t * d;
      for (int64_t j = 0; j < d; ++j)
        orow[j] += w * vr[j];
    }
  }
#endif
}

/// exp(x) for x <= 0 (a softmax's shifted scores), within 1.2 ulp of
/// libm's above exp(-80) and 0 below exp(-87) (Cody-Waite reduction to
/// r in [-ln2/2, ln2/2], a degree-7 polynomial, the power of two in the
/// exponent bits). Branch-free, so the loops that call it vectorize (this
/// file is built with -fno-trapping-math): 0.8 ns against libm expf's 2.4
/// on the SSE2 baseline (measured 2026-11-28 on the 2-core CI machine);
/// the prefill softmax spent most of its time in expf.
inline float expNonPositive(float x) {
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693145751953125f) - k * 1.428606765330187045e-06f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t power = static_cast<int32_t>(k);
  int32_t bits;
  std::memcpy(&bits, &p, sizeof bits);
  bits = power < -126 ? 0 : bits + power * (1 << 23);
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

/// s[0, visible) as its softmax, s[visible, cols) zero (masked). The max
/// and the sum run over 8 lanes, combined in lane order: vectorizable, and
/// the same bits whatever the machine.
void softmaxRow(float *s, int64_t visible, int64_t cols) {
  constexpr int lanes = 8;
  float tops[lanes], sums[lanes];
  std::fill(tops, tops + lanes, -std::numeric_limits<float>::infinity());
  std::fill(sums, sums + lanes, 0.0f);
  const int64_t whole = visible / lanes * lanes;
  for (int64_t t = 0; t < whole; t += lanes)
    for (int j = 0; j < lanes; ++j)
      tops[j] = tops[j] > s[t + j] ? tops[j] : s[t + j];
  float top = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < lanes; ++j)
    top = std::max(top, tops[j]);
  for (int64_t t = whole; t < visible; ++t)
    top = std::max(top, s[t]);
  for (int64_t t = 0; t < visible; ++t)
    s[t] = expNonPositive(s[t] - top);
  for (int64_t t = 0; t < whole; t += lanes)
    for (int j = 0; j < lanes; ++j)
      sums[j] += s[t + j];
  float sum = 0;
  for (int j = 0; j < lanes; ++j)
    sum += sums[j];
  for (int64_t t = whole; t < visible; ++t)
    sum += s[t];
  const float inv = 1.0f / sum;
  for (int64_t t = 0; t < visible; ++t)
    s[t] *= inv;
  std::fill(s + visible, s + cols, 0.0f);
}

/// Attention of one kv head's `group` query heads over `blocks` of `seq`.
/// q and out point at the group's first query head; massOut (or null) at
/// the kv head's [numBlocks, group] slice, already zeroed. The listed
/// blocks' keys and values are gathered in list order, then the products
/// and the softmax are the prefill's (scoreRows, softmaxRow, mixRows).
void attendKVHead(const PagedKVCache &cache, SeqId seq, int layer, int kvHead,
                  const float *q, int group, float scale,
                  const std::vector<int64_t> &blocks, float *out,
                  float *massOut, int64_t firstToken) {
  const int64_t P = cache.pageSize(), D = cache.headDim();
  const std::vector<PageId> &table = cache.blockTable(seq);
  // Each block's visible tokens: from firstToken on (a sliding window).
  std::vector<int64_t> first(blocks.size() + 1, 0), skip(blocks.size(), 0);
  for (size_t i = 0; i < blocks.size(); ++i) {
    skip[i] =
        std::min<int64_t>(std::max<int64_t>(0, firstToken - blocks[i] * P),
                          cache.tokensInBlock(seq, blocks[i]));
    first[i + 1] = first[i] + cache.tokensInBlock(seq, blocks[i]) - skip[i];
  }
  const int64_t tokens = first.back();
  // Whole pages are read, each where its tokens go, in list order: a
  // partial block's unused rows run into the next block's place, which
  // its own read then overwrites (or past the last token). A block with
  // tokens before the window is read aside and its visible rows copied.
  std::vector<float> k(size_t(blocks.size() * P * D)), v(k.size()), pageK,
      pageV;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (skip[i] == 0) {
      cache.readKBlock(layer, table[blocks[i]], kvHead,
                       k.data() + first[i] * D);
      cache.readVBlock(layer, table[blocks[i]], kvHead,
                       v.data() + first[i] * D);
      continue;
    }
    pageK.resize(size_t(P * D));
    pageV.resize(size_t(P * D));
    cache.readKBlock(layer, table[blocks[i]], kvHead, pageK.data());
    cache.readVBlock(layer, table[blocks[i]], kvHead, pageV.data());
    const size_t rows = size_t(first[i + 1] - first[i]) * size_t(D);
    std::copy_n(pageK.data() + skip[i] * D, rows, k.data() + first[i] * D);
    std::copy_n(pageV.data() + skip[i] * D, rows, v.data() + first[i] * D);
  }
  if (tokens == 0)
    throw Error("attention: no token of the listed blocks is inside the "
                "window (from token " +
                std::to_string(firstToken) + ")");
  std::vector<float> scores(size_t(group * tokens));
  scoreRows(q, D, group, k.data(), tokens, D, scale, scores.data());
  for (int g = 0; g < group; ++g)
    softmaxRow(scores.data() + g * tokens, tokens, tokens);
  if (massOut)
    for (int g = 0; g < group; ++g)
      for (size_t i = 0; i < blocks.size(); ++i) {
        float blockMass = 0.0f;
        for (int64_t t = first[i]; t < first[i + 1]; ++t)
          blockMass += scores[size_t(g * tokens + t)];
        massOut[blocks[i] * group + g] = blockMass;
      }
  mixRows(scores.data(), group, tokens, v.data(), D, out, D);
}

} // namespace

void vflow::rt::sparseDecodeAttention(const PagedKVCache &cache, SeqId seq,
                                      int layer, const float *q, int group,
                                      float scale, const BlockLists &blocks,
                                      float *out, float *mass,
                                      int64_t firstToken) {
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
                 mass ? mass + head * massSlice : nullptr,
                 std::max<int64_t>(0, firstToken));
  }
}

void vflow::rt::denseDecodeAttention(const PagedKVCache &cache, SeqId seq,
                                     int layer, const float *q, int group,
                                     float scale, float *out, float *mass,
                                     int64_t window) {
  checkCommon(cache, seq, layer, q, group, scale, out, "denseDecodeAttention");
  const int64_t length = cache.length(seq);
  const int64_t from = window > 0 ? std::max<int64_t>(0, length - window) : 0;
  std::vector<int64_t> all;
  for (int64_t block = from / cache.pageSize(); block < cache.numBlocks(seq);
       ++block)
    all.push_back(block);
  sparseDecodeAttention(cache, seq, layer, q, group, scale,
                        BlockLists(cache.numKVHeads(), all), out, mass, from);
}

void vflow::rt::causalPrefillAttention(const PagedKVCache &cache, SeqId seq,
                                       int layer, const float *q, int64_t n,
                                       int group, float scale, float *out,
                                       float *mass, int64_t observe,
                                       int64_t slidingWindow) {
  const char *operation = "causalPrefillAttention";
  checkCommon(cache, seq, layer, q, group, scale, out, operation);
  const int64_t length = cache.length(seq);
  if (n < 1 || n > length)
    throw Error(std::string(operation) + ": " + str(n) +
                " query rows for a sequence of " + str(length) + " tokens");
  const int64_t P = cache.pageSize(), D = cache.headDim();
  const int64_t H = cache.numKVHeads(), numBlocks = cache.numBlocks(seq);
  const int64_t ld = H * group * D; // floats between a query head's rows
  // Rows per tile: a tile's scores stay within 2M floats (8 MB).
  const int64_t tile =
      std::max<int64_t>(1, std::min<int64_t>(128, (int64_t(1) << 21) / length));
  std::vector<float> k(size_t(numBlocks * P * D)), v(k.size());
  std::vector<float> scores(size_t(tile * length));
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
    for (int g = 0; g < group; ++g) {
      const int64_t qHead = head * group + g;
      for (int64_t i0 = 0; i0 < n; i0 += tile) {
        const int64_t rows = std::min(tile, n - i0);
        // Row i sees the tokens before position length - n + i + 1; the
        // tile's scores cover its last row's, the earlier rows masked.
        const int64_t cols = length - n + i0 + rows;
        scoreRows(q + i0 * ld + qHead * D, ld, rows, k.data(), cols, D, scale,
                  scores.data());
        for (int64_t r = 0; r < rows; ++r) {
          // Row r sees positions [lo, pos]: lo > 0 in a sliding window.
          const int64_t pos = length - n + i0 + r;
          const int64_t lo = slidingWindow > 0
                                 ? std::max<int64_t>(0, pos - slidingWindow + 1)
                                 : 0;
          float *s = scores.data() + r * cols;
          softmaxRow(s + lo, pos + 1 - lo, cols - lo);
          std::fill(s, s + lo, 0.0f);
        }
        // The observation window's rows add their mass.
        for (int64_t r = std::max<int64_t>(0, n - window - i0); r < rows; ++r) {
          const float *s = scores.data() + r * cols;
          for (int64_t t = 0; t < length - n + i0 + r + 1; ++t)
            mass[size_t((head * numBlocks + t / P) * group + g)] +=
                s[t] / float(window);
        }
        mixRows(scores.data(), rows, cols, v.data(), D,
                out + i0 * ld + qHead * D, ld);
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
