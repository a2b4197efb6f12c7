//===- Sampling.h - How the engine picks the next token ---------*- C++ -*-===//
//
// The sampling rule, the same on the host and on the GPU:
//  - a row whose logits hold NaN or an infinity is not sampled: its token
//    is kNonFiniteLogits (the engine finishes the request with an error);
//  - temperature 0: the largest logit (the lowest id among equal maxima);
//  - else p_i = exp((l_i - max) / temperature) over the kept tokens: those
//    whose logit is at least the k-th largest (top_k; ties kept), then of
//    those the ones whose logit is at least t, the largest t whose tokens
//    still hold top_p of the kept mass (ties kept);
//  - the draw: u = uniform(seed, counter) times the kept mass, then the
//    tokens in id order until their running mass passes u.
// uniform() is a counter-based hash (splitmix64), so a request's draws
// depend only on its seed and how many tokens it has generated: the same
// whatever else is in the batch and however the engine schedules it.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_SAMPLING_H
#define VFLOW_MODEL_SAMPLING_H

#include <cstdint>
#include <optional>
#include <vector>

#ifdef __CUDACC__
#define VFLOW_HOST_DEVICE __host__ __device__
#else
#define VFLOW_HOST_DEVICE
#endif

namespace vflow::model {

struct SamplingParams {
  int64_t maxTokens = 16;
  /// 0: greedy (the lowest id among equal maxima).
  double temperature = 0.0;
  double topP = 1.0;
  /// 0: no limit.
  int64_t topK = 0;
  /// Per-request stream; none: derived from the engine's seed and the id.
  std::optional<uint64_t> seed;
  bool ignoreEos = false;
  /// -1: no log-probabilities; k in [0, 20]: each generated token's, and
  /// the k most likely tokens' at its position (TokenLogprobs).
  int64_t logprobs = -1;

  /// Throws rt::Error naming the first bad field.
  void validate() const;
};

/// The most top log-probabilities a request may ask for.
constexpr int64_t kMaxLogprobs = 20;

/// Log-probabilities at one position of the model's distribution (the
/// log-softmax of the raw logits, temperature 1, as OpenAI and vLLM report
/// them): the chosen token's, and the most likely tokens' (descending,
/// ties by id).
struct TokenLogprobs {
  float logprob = 0;
  std::vector<int32_t> topIds;
  std::vector<float> topLogprobs;
};

/// The host's log-probabilities of `token` and the `top` most likely tokens
/// of `logits` (vocab entries, all finite), summed in double.
TokenLogprobs tokenLogprobs(const float *logits, int64_t vocab, int32_t token,
                            int64_t top);

/// The "token" of a row whose logits are not all finite.
constexpr int32_t kNonFiniteLogits = -1;

/// One row's draw: the params above, its stream and its draw number.
struct RowSampling {
  float temperature = 0, topP = 1;
  int64_t topK = 0;
  uint64_t seed = 0, counter = 0;
};

VFLOW_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

/// A uniform double in [0, 1) for draw `counter` of stream `seed`.
VFLOW_HOST_DEVICE inline double uniformDraw(uint64_t seed, uint64_t counter) {
  return double(splitmix64(seed ^ splitmix64(counter)) >> 11) *
         (1.0 / 9007199254740992.0);
}

/// The host's implementation of the rule: the next token of `logits`
/// (vocab entries), or kNonFiniteLogits.
int32_t sampleToken(const float *logits, int64_t vocab, const RowSampling &row);

} // namespace vflow::model

#endif // VFLOW_MODEL_SAMPLING_H
