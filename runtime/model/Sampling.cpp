//===- Sampling.cpp - The sampling rule on the host -----------------------===//
//
// SamplingParams' checks and sampleToken, the host's implementation of the
// rule Sampling.h states (the GPU's is sampleKernel in CudaModel.cu).
//
//===----------------------------------------------------------------------===//

#include "vflow/Model/Sampling.h"

#include "vflow/Runtime/Error.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

using namespace vflow;
using namespace vflow::model;

void SamplingParams::validate() const {
  if (maxTokens < 1)
    throw rt::Error("max_tokens must be >= 1, got " +
                    std::to_string(maxTokens));
  if (!(temperature >= 0) || !std::isfinite(temperature))
    throw rt::Error("temperature must be finite and >= 0, got " +
                    std::to_string(temperature));
  if (!(topP > 0 && topP <= 1))
    throw rt::Error("top_p must be in (0, 1], got " + std::to_string(topP));
  if (topK < 0)
    throw rt::Error("top_k must be >= 0 (0: no limit), got " +
                    std::to_string(topK));
  if (logprobs < -1 || logprobs > kMaxLogprobs)
    throw rt::Error("logprobs must be -1 (none) to " +
                    std::to_string(kMaxLogprobs) + ", got " +
                    std::to_string(logprobs));
}

TokenLogprobs vflow::model::tokenLogprobs(const float *logits, int64_t vocab,
                                          int32_t token, int64_t top) {
  double max = logits[0];
  for (int64_t i = 1; i < vocab; ++i)
    max = std::max(max, double(logits[i]));
  double sum = 0;
  for (int64_t i = 0; i < vocab; ++i)
    sum += std::exp(double(logits[i]) - max);
  const double logZ = max + std::log(sum);
  TokenLogprobs out;
  out.logprob = float(double(logits[token]) - logZ);
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    ids[size_t(i)] = int32_t(i);
  const size_t k = size_t(std::min<int64_t>(std::max<int64_t>(top, 0), vocab));
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(k), ids.end(),
                    [&](int32_t a, int32_t b) {
                      return logits[a] > logits[b] ||
                             (logits[a] == logits[b] && a < b);
                    });
  for (size_t i = 0; i < k; ++i) {
    out.topIds.push_back(ids[i]);
    out.topLogprobs.push_back(float(double(logits[ids[i]]) - logZ));
  }
  return out;
}

int32_t vflow::model::sampleToken(const float *logits, int64_t vocab,
                                  const RowSampling &row) {
  const float lowest = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < vocab; ++i)
    if (!std::isfinite(logits[i]))
      return kNonFiniteLogits;
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best])
      best = i;
  if (row.temperature <= 0)
    return int32_t(best);
  const float top = logits[best];
  auto weight = [&](float l) { return std::exp((l - top) / row.temperature); };
  std::vector<float> sorted(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i)
    sorted[size_t(i)] = logits[i];
  std::sort(sorted.begin(), sorted.end(), std::greater<float>());
  // Top-k: at least the k-th largest logit (ties kept).
  float threshold = lowest;
  if (row.topK > 0 && row.topK < vocab)
    threshold = sorted[size_t(row.topK - 1)];
  double kept = 0;
  for (float l : sorted)
    if (l >= threshold)
      kept += weight(l);
  // Top-p: the largest logit whose tokens and those above hold top_p.
  if (row.topP < 1) {
    double mass = 0;
    for (size_t i = 0; i < sorted.size() && sorted[i] >= threshold;) {
      const float v = sorted[i];
      for (; i < sorted.size() && sorted[i] == v; ++i)
        mass += weight(v);
      if (mass >= double(row.topP) * kept) {
        threshold = v;
        kept = mass;
        break;
      }
    }
  }
  double u = uniformDraw(row.seed, row.counter) * kept;
  int64_t last = best;
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (l < threshold)
      continue;
    last = i;
    u -= weight(l);
    if (u < 0)
      return int32_t(i);
  }
  return int32_t(last);
}
