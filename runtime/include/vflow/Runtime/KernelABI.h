//===- KernelABI.h - Generated code and runtime ABI -------------*- C++ -*-===//
//
// The CPU backend's generated code (compiler/backends/CppEmitter.cpp) and the
// runtime (runtime/cpu/CpuFlow.cpp) meet here. The argument structs are plain
// C structs: the runtime fills one and calls the flow's extern "C" entry
// points through dlsym. The inline helpers below (storage rounding, the
// element functions, reductions, selections) are what the generated code
// calls; they compute exactly what the reference interpreter computes.
//
// This header is self-contained (standard headers only): the host JIT
// compiles generated sources with nothing but this header and Random.h on
// the include path, and embeds both into the runtime library.
//
// Layouts: every array is f32, row-major. K and V are [blockSize, headDim]
// in the cache stage and [numBlocks, blockSize, headDim] in the index stage;
// q is [group, headDim]; mass is [numBlocks, group]. Consts, fields and
// states use their declaration's axis order (the canonical order); a field
// in the index stage has `block` first, then its own axes.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_RUNTIME_KERNELABI_H
#define VFLOW_RUNTIME_KERNELABI_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// vflow_<flow>_consts: materializes every const (declaration order) into
/// `consts[i]`, which the caller sized for (headDim, group).
struct VflowConstArgs {
  int64_t headDim, group;
  const double *params; ///< every vt.param, declaration order
  float *const *consts;
};

/// vflow_<flow>_cache: computes the fields of one complete block.
struct VflowCacheArgs {
  int64_t headDim, group;
  const double *params;
  const float *const *consts;
  const float *K, *V; ///< [blockSize, headDim]
  /// Per field (declaration order), the block's values in the field's axis
  /// order, rounded to the field's storage dtype.
  float *const *fields;
};

/// vflow_<flow>_index: one decode step of one (sequence, kv head).
struct VflowIndexArgs {
  int64_t headDim, group, numBlocks, contextLen, step;
  const double *params;
  const float *const *consts;
  const float *q;             ///< [group, headDim]
  const float *const *fields; ///< per field: [numBlocks, ...field axes]
  const float *mass;          ///< [numBlocks, group]; null when unused
  const float *K, *V;         ///< [numBlocks, blockSize, headDim] or null
  /// Per state (declaration order), in/out, rounded to the state's dtype on
  /// store; per-block states cover numBlocks blocks.
  float *const *states;
  /// Out: the selection (ascending logical ids, kept blocks excluded);
  /// `selected` holds room for numBlocks ids.
  int64_t *selected;
  int64_t *numSelected;
};

typedef void (*VflowConstsFn)(const struct VflowConstArgs *);
typedef void (*VflowCacheFn)(const struct VflowCacheArgs *);
typedef void (*VflowIndexFn)(const struct VflowIndexArgs *);
typedef int64_t (*VflowBudgetFn)(const double *params, int64_t numBlocks,
                                 int64_t contextLen);
/// vflow_<flow>_budgets: every budget expression of the index stage, before
/// rounding, with a description of each (op and source location). Returns
/// how many there are; fills `values` and `what` when both are non-null.
typedef int64_t (*VflowBudgetsFn)(const double *params, int64_t numBlocks,
                                  int64_t contextLen, double *values,
                                  const char **what);

#ifdef __cplusplus
} // extern "C"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

namespace vflow {
namespace kabi {

//===----------------------------------------------------------------------===//
// Storage rounding (identical to vflow::rt::roundToDType)
//===----------------------------------------------------------------------===//

inline uint32_t floatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float bitsFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

/// A float format narrower than f32: sign, exponent, `mantissaBits`.
struct NarrowFormat {
  int mantissaBits, bias, exponentBits;
  bool hasInfinity;
  uint32_t signBit, maxFiniteCode, canonicalNaN;
};

constexpr NarrowFormat kF16{10, 15, 5, true, 0x8000, 0x7BFF, 0x7E00};
constexpr NarrowFormat kFP8E5M2{2, 15, 5, true, 0x80, 0x7B, 0x7E};
constexpr NarrowFormat kFP8E4M3{3, 7, 4, false, 0x80, 0x7E, 0x7F};

/// Round to nearest even; saturating without infinities.
inline uint32_t encodeNarrow(float value, const NarrowFormat &format) {
  uint32_t bits = floatBits(value);
  uint32_t sign = (bits >> 31) ? format.signBit : 0;
  uint32_t magnitude = bits & 0x7FFFFFFFu;
  const int m = format.mantissaBits;
  if (magnitude > 0x7F800000u) {
    if (!format.hasInfinity)
      return sign | format.canonicalNaN;
    return sign | format.canonicalNaN | ((magnitude & 0x7FFFFF) >> (23 - m));
  }
  if (magnitude == 0x7F800000u)
    return sign | (format.hasInfinity ? format.maxFiniteCode + 1
                                      : format.maxFiniteCode);
  if (magnitude == 0)
    return sign;
  uint32_t biasedExponent = magnitude >> 23;
  uint32_t fraction = magnitude & 0x7FFFFF;
  uint32_t significand;
  int scale, exponent;
  if (biasedExponent == 0) {
    significand = fraction;
    scale = -149;
    int leading = 31;
    while (!(fraction >> leading))
      --leading;
    exponent = leading - 149;
  } else {
    significand = fraction | 0x800000u;
    scale = static_cast<int>(biasedExponent) - 150;
    exponent = static_cast<int>(biasedExponent) - 127;
  }
  const int minExponent = 1 - format.bias;
  int quantum = (exponent < minExponent ? minExponent : exponent) - m;
  int shift = quantum - scale;
  uint32_t units = 0;
  if (shift < 32) {
    units = significand >> shift;
    uint32_t remainder = significand & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    if (remainder > half || (remainder == half && (units & 1)))
      ++units;
  }
  uint64_t code;
  if (exponent < minExponent)
    code = units;
  else
    code = (static_cast<uint64_t>(exponent + format.bias) << m) +
           (units - (1u << m));
  if (code > format.maxFiniteCode)
    code = format.hasInfinity ? format.maxFiniteCode + 1 : format.maxFiniteCode;
  return sign | static_cast<uint32_t>(code);
}

inline float decodeNarrow(uint32_t code, const NarrowFormat &format) {
  const int m = format.mantissaBits;
  uint32_t sign = (code & format.signBit) ? 0x80000000u : 0;
  uint32_t magnitude = code & (format.signBit - 1);
  uint32_t exponentField = magnitude >> m;
  uint32_t fraction = magnitude & ((1u << m) - 1);
  uint32_t allOnes = (1u << format.exponentBits) - 1;
  if (format.hasInfinity && exponentField == allOnes) {
    if (fraction == 0)
      return bitsFloat(sign | 0x7F800000u);
    return bitsFloat(sign | 0x7FC00000u | (fraction << (23 - m)));
  }
  if (!format.hasInfinity && magnitude == format.canonicalNaN)
    return bitsFloat(sign | 0x7FC00000u);
  if (exponentField == 0) {
    float value = std::ldexp(static_cast<float>(fraction), 1 - format.bias - m);
    return sign ? -value : value;
  }
  uint32_t exponent = exponentField - format.bias + 127;
  return bitsFloat(sign | (exponent << 23) | (fraction << (23 - m)));
}

inline float roundBF16(float value) {
  uint32_t bits = floatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return bitsFloat(((bits >> 16) | 0x0040u) << 16);
  bits += 0x7FFFu + ((bits >> 16) & 1);
  return bitsFloat((bits >> 16) << 16);
}

inline float roundF16(float value) {
  return decodeNarrow(encodeNarrow(value, kF16), kF16);
}

inline float roundFP8E4M3(float value) {
  return decodeNarrow(encodeNarrow(value, kFP8E4M3), kFP8E4M3);
}

inline float roundFP8E5M2(float value) {
  return decodeNarrow(encodeNarrow(value, kFP8E5M2), kFP8E5M2);
}

inline float roundF32(float value) { return value; }

//===----------------------------------------------------------------------===//
// Element functions (the interpreter's definitions)
//===----------------------------------------------------------------------===//

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
inline float mul(float a, float b) { return a * b; }
inline float div(float a, float b) { return a / b; }
inline float pow(float a, float b) { return std::pow(a, b); }
inline float maximum(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? kNaN : std::max(a, b);
}
inline float minimum(float a, float b) {
  return std::isnan(a) || std::isnan(b) ? kNaN : std::min(a, b);
}
inline float logicalAnd(float a, float b) { return float(a != 0 && b != 0); }
inline float logicalOr(float a, float b) { return float(a != 0 || b != 0); }
inline float cmpLt(float a, float b) { return float(a < b); }
inline float cmpLe(float a, float b) { return float(a <= b); }
inline float cmpGt(float a, float b) { return float(a > b); }
inline float cmpGe(float a, float b) { return float(a >= b); }
inline float cmpEq(float a, float b) { return float(a == b); }
inline float cmpNe(float a, float b) { return float(a != b); }
inline float neg(float a) { return -a; }
inline float logicalNot(float a) { return float(a == 0); }
inline float exp(float a) { return std::exp(a); }
inline float log(float a) { return std::log(a); }
inline float sqrt(float a) { return std::sqrt(a); }
inline float rsqrt(float a) { return 1.0f / std::sqrt(a); }
inline float abs(float a) { return std::fabs(a); }
inline float relu(float a) { return a > 0 ? a : (std::isnan(a) ? a : 0.0f); }
inline float sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }
inline float silu(float a) { return a / (1.0f + std::exp(-a)); }
inline float tanh(float a) { return std::tanh(a); }
inline float clamp(float x, float lo, float hi) {
  return std::isnan(x) ? x : std::min(std::max(x, lo), hi);
}
inline float where(float c, float a, float b) { return c != 0 ? a : b; }

//===----------------------------------------------------------------------===//
// Reductions: accumulate in double, finish to float
//===----------------------------------------------------------------------===//

constexpr double kSumInit = 0.0;
constexpr double kMaxInit = -std::numeric_limits<double>::infinity();
constexpr double kMinInit = std::numeric_limits<double>::infinity();

inline void accSum(double &a, double x) { a += x; }
inline void accMax(double &a, double x) {
  a = std::isnan(x) || std::isnan(a) ? double(kNaN) : std::max(a, x);
}
inline void accMin(double &a, double x) {
  a = std::isnan(x) || std::isnan(a) ? double(kNaN) : std::min(a, x);
}
inline void accSquares(double &a, double x) { a += x * x; }

inline float finishPlain(double a, double) { return static_cast<float>(a); }
inline float finishMean(double a, double count) {
  return static_cast<float>(count > 0 ? a / count : double(kNaN));
}
inline float finishL2(double a, double) {
  return static_cast<float>(std::sqrt(a));
}

//===----------------------------------------------------------------------===//
// Along block: one line of `n` values at `x` with stride `xs`, into `y`
//===----------------------------------------------------------------------===//

inline void softmaxLine(const float *x, int64_t xs, float *y, int64_t ys,
                        int64_t n, float scale) {
  double m = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < n; ++j)
    m = std::max(m, double(x[j * xs]) * scale);
  double sum = 0;
  for (int64_t j = 0; j < n; ++j)
    sum += std::exp(double(x[j * xs]) * scale - m);
  for (int64_t j = 0; j < n; ++j)
    y[j * ys] =
        static_cast<float>(std::exp(double(x[j * xs]) * scale - m) / sum);
}

inline void normalizeLine(const float *x, int64_t xs, float *y, int64_t ys,
                          int64_t n) {
  double sum = 0;
  for (int64_t j = 0; j < n; ++j)
    sum += x[j * xs];
  for (int64_t j = 0; j < n; ++j)
    y[j * ys] = static_cast<float>(x[j * xs] / sum);
}

inline void convLine(const float *x, int64_t xs, float *y, int64_t ys,
                     int64_t n, const float *w, int64_t taps) {
  int64_t half = taps / 2;
  for (int64_t j = 0; j < n; ++j) {
    double acc = 0;
    for (int64_t t = 0; t < taps; ++t) {
      int64_t src = j + t - half;
      if (src >= 0 && src < n)
        acc += double(w[t]) * x[src * xs];
    }
    y[j * ys] = static_cast<float>(acc);
  }
}

/// A host budget in f64, rounded down; NaN and negatives select nothing.
inline int64_t roundBudget(double v) {
  if (std::isnan(v) || v <= 0)
    return 0;
  if (v > 9.0e15)
    return int64_t(9.0e15);
  return static_cast<int64_t>(std::floor(v));
}

/// Descending by value, NaN below every number (no index: for values only).
inline bool valueRanksBefore(float x, float y) {
  bool nx = std::isnan(x), ny = std::isnan(y);
  if (nx != ny)
    return ny;
  return !nx && x > y;
}

/// The k-th largest of a line (+inf for k < 1, the smallest for k > n).
inline float kthLargestLine(const float *x, int64_t xs, int64_t n, int64_t k) {
  if (n == 0 || k < 1)
    return std::numeric_limits<float>::infinity();
  std::vector<float> line(n);
  for (int64_t j = 0; j < n; ++j)
    line[j] = x[j * xs];
  int64_t at = std::min(k, n) - 1;
  std::nth_element(line.begin(), line.begin() + at, line.end(),
                   valueRanksBefore);
  return line[at];
}

//===----------------------------------------------------------------------===//
// Selections
//===----------------------------------------------------------------------===//

/// Descending by score, NaN last, ties toward the lower index.
inline bool ranksBefore(float a, int64_t ia, float b, int64_t ib) {
  bool na = std::isnan(a), nb = std::isnan(b);
  if (na != nb)
    return nb;
  if (!na && a != b)
    return a > b;
  return ia < ib;
}

/// The blocks of a sequence of `numBlocks` that are always attended.
struct Kept {
  int64_t numBlocks, keepFirst, keepLast;
  bool contains(int64_t j) const {
    return j < std::min(keepFirst, numBlocks) ||
           j >= std::max<int64_t>(0, numBlocks - keepLast);
  }
};

/// The `k` best of `ids` by `score`, ascending by id.
inline std::vector<int64_t> bestOf(std::vector<int64_t> ids, const float *score,
                                   int64_t k) {
  if (k < static_cast<int64_t>(ids.size())) {
    auto before = [score](int64_t a, int64_t b) {
      return ranksBefore(score[a], a, score[b], b);
    };
    std::nth_element(ids.begin(), ids.begin() + k, ids.end(), before);
    ids.resize(k < 0 ? 0 : k);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

/// topk (and the exact approx_topk): the k best candidates.
inline std::vector<int64_t> selectTopK(const float *score, const Kept &kept,
                                       int64_t k) {
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < kept.numBlocks; ++j)
    if (!kept.contains(j))
      ids.push_back(j);
  return bestOf(std::move(ids), score, k);
}

/// threshold: candidates with score >= t (never NaN), at most `max` of them
/// (the best), `max` < 0 meaning no bound.
inline std::vector<int64_t>
selectThreshold(const float *score, const Kept &kept, float t, int64_t max) {
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < kept.numBlocks; ++j)
    if (!kept.contains(j) && !std::isnan(score[j]) && score[j] >= t)
      ids.push_back(j);
  if (max < 0)
    return ids;
  return bestOf(std::move(ids), score, max);
}

inline std::vector<int64_t> selectUnion(const std::vector<int64_t> &a,
                                        const std::vector<int64_t> &b) {
  std::vector<int64_t> out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(),
                 std::back_inserter(out));
  return out;
}

/// Writes a selection into the index stage's outputs.
inline void storeSelection(const std::vector<int64_t> &sel,
                           const VflowIndexArgs *args) {
  for (size_t i = 0; i < sel.size(); ++i)
    args->selected[i] = sel[i];
  *args->numSelected = static_cast<int64_t>(sel.size());
}

} // namespace kabi
} // namespace vflow

#endif // __cplusplus

#endif // VFLOW_RUNTIME_KERNELABI_H
