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
  int64_t layer, kvHead; ///< the model's layer and KV head indices
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
  /// Out: a flow with a retain block writes its score here ([numBlocks]);
  /// null when the runtime does not need it this step.
  float *retainScore;
  /// `first_token`: each block's first token's original position
  /// ([numBlocks]); null: block * block_size.
  const float *firstToken;
};

typedef void (*VflowConstsFn)(const struct VflowConstArgs *);
typedef void (*VflowCacheFn)(const struct VflowCacheArgs *);
typedef void (*VflowIndexFn)(const struct VflowIndexArgs *);

#ifdef __cplusplus
} // extern "C"

#include "vflow/Runtime/NumericRules.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <vector>

namespace vflow {
namespace kabi {

// The numeric rules are NumericRules.h's (one copy for the interpreter, this
// backend and the CUDA backend); these are the names the generated code
// calls, and the host's algorithms built on them.

//===----------------------------------------------------------------------===//
// Storage rounding
//===----------------------------------------------------------------------===//

using rules::roundBF16;
using rules::roundF16;
using rules::roundF32;
using rules::roundFP8E4M3;
using rules::roundFP8E5M2;

//===----------------------------------------------------------------------===//
// Element functions
//===----------------------------------------------------------------------===//

/// rules::infinity() and rules::quietNaN(), as compile-time constants.
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

using rules::abs;
using rules::add;
using rules::clamp;
using rules::cmpEq;
using rules::cmpGe;
using rules::cmpGt;
using rules::cmpLe;
using rules::cmpLt;
using rules::cmpNe;
using rules::div;
using rules::exp;
using rules::hash01;
using rules::log;
using rules::logicalAnd;
using rules::logicalNot;
using rules::logicalOr;
using rules::maximum;
using rules::minimum;
using rules::mul;
using rules::neg;
using rules::pow;
using rules::relu;
using rules::rsqrt;
using rules::sigmoid;
using rules::silu;
using rules::sqrt;
using rules::sub;
using rules::tanh;
using rules::where;

//===----------------------------------------------------------------------===//
// Reductions: accumulate (wide sums in f32 lanes, others in double), finish
// to float
//===----------------------------------------------------------------------===//

/// rules::sumInit(), maxInit() and minInit(), as compile-time constants.
constexpr double kSumInit = 0.0;
constexpr double kMaxInit = -std::numeric_limits<double>::infinity();
constexpr double kMinInit = std::numeric_limits<double>::infinity();

using rules::accMax;
using rules::accMin;
using rules::accSquares;
using rules::accSquaresLane;
using rules::accSum;
using rules::accSumLane;
using rules::combineSumLanes;
using rules::finishL2;
using rules::finishMean;
using rules::finishPlain;
using rules::kSumLanes;

//===----------------------------------------------------------------------===//
// Along block: one line of `n` values at `x` with stride `xs`, into `y`
//===----------------------------------------------------------------------===//

using rules::convLine;
using rules::normalizeLine;
using rules::softmaxLine;

inline int64_t roundBudget(double v) { return rules::roundBudget(v); }

using rules::ranksBefore;
using rules::valueRanksBefore;

/// The k-th largest of a line (+inf for k < 1, the smallest for k > n).
inline float kthLargestLine(const float *x, int64_t xs, int64_t n, int64_t k) {
  int64_t at = rules::kthLargestRank(k, n);
  if (at < 0)
    return kInf;
  std::vector<float> line(n);
  for (int64_t j = 0; j < n; ++j)
    line[j] = x[j * xs];
  std::nth_element(line.begin(), line.begin() + at, line.end(),
                   rules::valueRanksBefore);
  return rules::kthLargestValue(line[at]);
}

//===----------------------------------------------------------------------===//
// Selections
//===----------------------------------------------------------------------===//

/// The blocks of a sequence of `numBlocks` that are always attended.
using Kept = rules::KeptBlocks;

/// The `k` best of `ids` by `score` (rules::ranksBefore), ascending by id.
inline std::vector<int64_t> bestOf(std::vector<int64_t> ids, const float *score,
                                   int64_t k) {
  if (k < static_cast<int64_t>(ids.size())) {
    auto before = [score](int64_t a, int64_t b) {
      return rules::ranksBefore(score[a], a, score[b], b);
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

/// threshold: candidates that pass (rules::passesThreshold), at most `max`
/// of them (the best), `max` < 0 meaning no bound.
inline std::vector<int64_t>
selectThreshold(const float *score, const Kept &kept, float t, int64_t max) {
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < kept.numBlocks; ++j)
    if (!kept.contains(j) && rules::passesThreshold(score[j], t))
      ids.push_back(j);
  if (max < 0)
    return ids;
  return bestOf(std::move(ids), score, max);
}

/// topp: the fewest best candidates whose softmax mass reaches p
/// (rules::toppCount), at most `max` of them, `max` < 0 meaning no bound.
inline std::vector<int64_t> selectTopP(const float *score, const Kept &kept,
                                       float p, int64_t max) {
  std::vector<int64_t> ids;
  for (int64_t j = 0; j < kept.numBlocks; ++j)
    if (!kept.contains(j))
      ids.push_back(j);
  std::sort(ids.begin(), ids.end(), [score](int64_t a, int64_t b) {
    return rules::ranksBefore(score[a], a, score[b], b);
  });
  int64_t n = rules::toppCount(static_cast<long long>(ids.size()), p,
                               [&](long long i) { return score[ids[i]]; });
  if (max >= 0 && n > max)
    n = max;
  ids.resize(n);
  std::sort(ids.begin(), ids.end());
  return ids;
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
