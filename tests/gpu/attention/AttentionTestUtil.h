//===- AttentionTestUtil.h - Helpers of the GPU attention tests -*- C++ -*-===//
//
// Device buffers, random paged KV caches with poisoned (NaN) slack, block
// lists, and float64 host references for the decode and prefill kernels.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_TESTS_GPU_ATTENTION_ATTENTIONTESTUTIL_H
#define VFLOW_TESTS_GPU_ATTENTION_ATTENTIONTESTUTIL_H

#include "vflow/Runtime/DType.h"
#include "vflow/Runtime/Error.h"
#include "vflow/Runtime/NumericRules.h"
#include "vflow/Runtime/cuda/Attention.h"

#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace vflow {
namespace rt {
namespace cuda {
namespace test {

#define VFLOW_CUDA_OK(expr)                                                    \
  do {                                                                         \
    cudaError_t status_ = (expr);                                              \
    ASSERT_EQ(status_, cudaSuccess)                                            \
        << #expr << ": " << cudaGetErrorString(status_);                       \
  } while (0)

/// Skips the test when no CUDA device is usable.
#define VFLOW_REQUIRE_GPU()                                                    \
  do {                                                                         \
    int devices_ = 0;                                                          \
    if (cudaGetDeviceCount(&devices_) != cudaSuccess || devices_ == 0)         \
      GTEST_SKIP() << "no CUDA device";                                        \
  } while (0)

/// A fresh generator per test: seeds come from a counter, so every test (and
/// every run of the binary) sees different but reproducible data.
inline std::mt19937 &testRng() {
  static int counter = 0;
  static std::mt19937 rng;
  rng.seed(20261122u + 7919u * static_cast<unsigned>(counter++));
  return rng;
}

/// Owns a device allocation of n elements of T.
template <typename T> class DeviceArray {
public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) { resize(n); }
  explicit DeviceArray(const std::vector<T> &host) { upload(host); }
  DeviceArray(const DeviceArray &) = delete;
  DeviceArray &operator=(const DeviceArray &) = delete;
  ~DeviceArray() { cudaFree(data_); }

  void resize(size_t n) {
    cudaFree(data_);
    data_ = nullptr;
    size_ = n;
    if (n && cudaMalloc(reinterpret_cast<void **>(&data_), n * sizeof(T)) !=
                 cudaSuccess)
      throw Error("test: cudaMalloc of " + std::to_string(n * sizeof(T)) +
                  " bytes failed");
  }
  void upload(const std::vector<T> &host) {
    if (host.size() != size_)
      resize(host.size());
    if (size_ && cudaMemcpy(data_, host.data(), size_ * sizeof(T),
                            cudaMemcpyHostToDevice) != cudaSuccess)
      throw Error("test: upload failed");
  }
  std::vector<T> download() const {
    std::vector<T> host(size_);
    if (size_ && cudaMemcpy(host.data(), data_, size_ * sizeof(T),
                            cudaMemcpyDeviceToHost) != cudaSuccess)
      throw Error("test: download failed");
    return host;
  }
  /// Sets every byte to `byte` (0xFF poisons floats and bf16 with NaN).
  void fill(int byte) {
    if (size_ && cudaMemset(data_, byte, size_ * sizeof(T)) != cudaSuccess)
      throw Error("test: memset failed");
  }
  T *get() const { return data_; }
  size_t size() const { return size_; }

private:
  T *data_ = nullptr;
  size_t size_ = 0;
};

/// The storage dtype of a KV type (kvTypeName spells it as the dtype).
inline DType storageType(KVType type) { return *parseDType(kvTypeName(type)); }

/// A paged K/V pool pair [numPages, Hkv, P, D] of random values; every slot
/// not holding a token of a sequence is NaN.
struct PagedCache {
  KVType type = KVType::BF16;
  int numKVHeads = 0, pageSize = 0, headDim = 0, numPages = 0;
  std::vector<int> lengths;
  std::vector<std::vector<int32_t>> pageOf; ///< [sequence][logical block]
  std::vector<uint8_t> k, v;
  std::vector<float> kScale, vScale; ///< per kv head (used for fp8)
  /// Per stored row [numPages, Hkv, P] (8-bit pools of a token-scaled
  /// case; NaN where no token is), else empty.
  std::vector<float> kTokenScale, vTokenScale;

  size_t elementIndex(int page, int kvh, int token, int d) const {
    return ((static_cast<size_t>(page) * numKVHeads + kvh) * pageSize + token) *
               headDim +
           d;
  }
  /// The dequantized value the kernels must see.
  double value(const std::vector<uint8_t> &pool, const std::vector<float> &s,
               const std::vector<float> &ts, int page, int kvh, int token,
               int d) const {
    const size_t i = elementIndex(page, kvh, token, d);
    const double rowScale = ts.empty() ? 1.0 : ts[i / headDim];
    switch (type) {
    case KVType::BF16:
      return bf16ToFloat(reinterpret_cast<const uint16_t *>(pool.data())[i]);
    case KVType::F16:
      return f16ToFloat(reinterpret_cast<const uint16_t *>(pool.data())[i]);
    case KVType::FP8E4M3:
      return static_cast<double>(fp8E4M3ToFloat(pool[i])) * s[kvh] * rowScale;
    case KVType::INT8:
      return static_cast<double>(static_cast<int8_t>(pool[i])) * s[kvh] *
             rowScale;
    }
    return 0;
  }
  double kAt(int b, int block, int kvh, int token, int d) const {
    return value(k, kScale, kTokenScale, pageOf[b][block], kvh, token, d);
  }
  double vAt(int b, int block, int kvh, int token, int d) const {
    return value(v, vScale, vTokenScale, pageOf[b][block], kvh, token, d);
  }
  int numBlocks(int b) const { return (lengths[b] + pageSize - 1) / pageSize; }
};

/// What a decode or prefill test case starts with: its name (the test's),
/// the KV type, the heads, the page size and the sequences' lengths in
/// tokens. The cases derive from it and add their own members.
struct CacheCase {
  const char *name;
  KVType type;
  int numKVHeads, group, headDim, pageSize;
  std::vector<int> lengths;
};

/// A parameterized test's name: its case's.
struct CaseName {
  template <typename Case>
  std::string operator()(const ::testing::TestParamInfo<Case> &info) const {
    return info.param.name;
  }
};

/// Whether a case's 8-bit pools have a scale per stored row: int8 always,
/// fp8 when its name says "rowscale" (else one scale per KV head, as the
/// torch ops read other engines' fp8 caches).
inline bool rowScaled(const CacheCase &c) {
  return c.type == KVType::INT8 ||
         (c.type == KVType::FP8E4M3 && std::strstr(c.name, "rowscale"));
}

/// The random cache of a decode or prefill test case. Row-scaled cases
/// (rowScaled) give every (token, KV head) row its own magnitude (e^-3 to
/// e^3 times N(0, 1)) and store it by NumericRules' scaled 8-bit rule, as
/// the sessions do.
inline PagedCache makeCache(std::mt19937 &rng, const CacheCase &c) {
  const KVType type = c.type;
  const int numKVHeads = c.numKVHeads, pageSize = c.pageSize,
            headDim = c.headDim;
  const std::vector<int> &lengths = c.lengths;
  PagedCache cache;
  cache.type = type;
  cache.numKVHeads = numKVHeads;
  cache.pageSize = pageSize;
  cache.headDim = headDim;
  cache.lengths = lengths;
  int used = 0;
  for (int length : lengths)
    used += (length + pageSize - 1) / pageSize;
  cache.numPages = used + 3;
  std::vector<int32_t> perm(cache.numPages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  int next = 0;
  cache.pageOf.resize(lengths.size());
  for (size_t b = 0; b < lengths.size(); ++b)
    for (int j = 0; j < cache.numBlocks(b); ++j)
      cache.pageOf[b].push_back(perm[next++]);

  const size_t elems =
      static_cast<size_t>(cache.numPages) * numKVHeads * pageSize * headDim;
  const size_t bytes = elems * kvTypeBytes(type);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> scales(0.02f, 0.2f);
  std::uniform_real_distribution<float> magnitude(-3.0f, 3.0f);
  const bool byRow = rowScaled(c);
  for (int h = 0; h < numKVHeads; ++h) {
    const bool perHead = type == KVType::FP8E4M3 && !byRow;
    cache.kScale.push_back(perHead ? scales(rng) : 1.0f);
    cache.vScale.push_back(perHead ? scales(rng) : 1.0f);
  }
  const DType dtype = storageType(type);
  const size_t rows = elems / headDim;
  auto fill = [&](std::vector<uint8_t> &pool, const std::vector<float> &s,
                  std::vector<float> &rowScales) {
    pool.assign(bytes, 0);
    std::vector<float> values(elems);
    const size_t headElems = static_cast<size_t>(pageSize) * headDim;
    for (size_t i = 0; i < elems; ++i) {
      const int kvh = static_cast<int>((i / headElems) % numKVHeads);
      values[i] = normal(rng) / s[kvh];
    }
    if (byRow) {
      // Each row its own magnitude, then NumericRules' rule: scale =
      // absmax / format max, stored x / scale.
      rowScales.assign(rows, std::nanf(""));
      for (size_t r = 0; r < rows; ++r) {
        const float m = std::exp(magnitude(rng));
        float absMax = 0.0f;
        for (int d = 0; d < headDim; ++d) {
          values[r * headDim + d] *= m;
          absMax = std::max(absMax, std::fabs(values[r * headDim + d]));
        }
        rowScales[r] = rules::kvScale(absMax, kvFormatMax(dtype));
        for (int d = 0; d < headDim; ++d)
          values[r * headDim + d] =
              rules::kvScaled(values[r * headDim + d], rowScales[r]);
      }
    }
    // Every slot starts as NaN; the tokens of the sequences are then set.
    std::vector<float> poisoned(elems, std::nanf(""));
    for (size_t b = 0; b < lengths.size(); ++b)
      for (int t = 0; t < lengths[b]; ++t)
        for (int kvh = 0; kvh < numKVHeads; ++kvh)
          for (int d = 0; d < headDim; ++d) {
            const size_t i = cache.elementIndex(cache.pageOf[b][t / pageSize],
                                                kvh, t % pageSize, d);
            poisoned[i] = values[i];
          }
    if (byRow) // rows of no token get a NaN scale too
      for (size_t r = 0; r < rows; ++r)
        if (std::isnan(poisoned[r * headDim]))
          rowScales[r] = std::nanf("");
    convertFromF32(dtype, poisoned.data(), pool.data(), elems);
  };
  fill(cache.k, cache.kScale, cache.kTokenScale);
  fill(cache.v, cache.vScale, cache.vTokenScale);
  return cache;
}

/// A PagedCache's pools and scales in device memory.
struct DeviceCache {
  DeviceArray<uint8_t> k, v;
  DeviceArray<float> kScale, vScale, kTokenScale, vTokenScale;
  explicit DeviceCache(const PagedCache &cache)
      : k(cache.k), v(cache.v), kScale(cache.kScale), vScale(cache.vScale),
        kTokenScale(cache.kTokenScale), vTokenScale(cache.vTokenScale) {}
};

/// The arguments both kernels read: `pools` (the device copy of `cache`),
/// `group` query heads per kv head, one row of q and out per sequence's
/// query, the softmax scale.
inline PagedKVArgs kvArgs(const PagedCache &cache, const DeviceCache &pools,
                          int group, const void *q, void *out, float scale) {
  PagedKVArgs args;
  args.kPool = pools.k.get();
  args.vPool = pools.v.get();
  args.kScale = pools.kScale.get();
  args.vScale = pools.vScale.get();
  args.kTokenScale = pools.kTokenScale.get();
  args.vTokenScale = pools.vTokenScale.get();
  args.kvType = cache.type;
  args.batch = static_cast<int>(cache.lengths.size());
  args.numKVHeads = cache.numKVHeads;
  args.group = group;
  args.headDim = cache.headDim;
  args.pageSize = cache.pageSize;
  args.numPages = cache.numPages;
  args.q = q;
  args.out = out;
  args.scale = scale;
  return args;
}

/// Random bf16 values, N(0, sigma^2).
inline std::vector<uint16_t> randomBF16(std::mt19937 &rng, size_t n,
                                        float sigma) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<uint16_t> out(n);
  for (auto &x : out)
    x = floatToBF16(normal(rng));
  return out;
}

/// ||a - b|| / ||b||; infinite when a holds a non-finite value.
inline double relativeError(const std::vector<float> &a,
                            const std::vector<double> &b, size_t begin = 0,
                            size_t end = SIZE_MAX) {
  end = std::min(end, b.size());
  double num = 0, den = 0;
  for (size_t i = begin; i < end; ++i) {
    if (!std::isfinite(a[i]))
      return INFINITY;
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline std::vector<float> bf16Vector(const std::vector<uint16_t> &bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i)
    out[i] = bf16ToFloat(bits[i]);
  return out;
}

} // namespace test
} // namespace cuda
} // namespace rt
} // namespace vflow

#endif // VFLOW_TESTS_GPU_ATTENTION_ATTENTIONTESTUTIL_H
