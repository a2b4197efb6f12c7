//===- Runner.h - A decoder-only model over the session API -----*- C++ -*-===//
//
// The serving engine's model runner: a Llama-family decoder (Llama 2/3,
// Qwen2/2.5, Qwen3, SmolLM2: RMSNorm, RoPE, GQA, SwiGLU, tied or separate
// embeddings, q/k/v biases, q/k norms) whose every attention goes through
// one rt::Session: layer by layer, the step's K/V are appended, prefill
// rows attend causally and densely (Session::prefill), decode rows through
// the attached flow (Session::decode; dense on the first `denseLayers`
// layers, everywhere without a flow). The CPU backend runs the GEMMs with
// BLAS on f32 weights.
//
//===----------------------------------------------------------------------===//

#ifndef VFLOW_MODEL_RUNNER_H
#define VFLOW_MODEL_RUNNER_H

#include "vflow/Model/Sampling.h"
#include "vflow/Model/Weights.h"
#include "vflow/Runtime/Session.h"

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace vflow::model {

struct RunnerConfig {
  rt::Device device = rt::Device::Cpu;
  /// Layers [0, denseLayers) attend densely at decode (with a flow).
  int denseLayers = 2;
  /// K/V storage (SessionConfig::kvDType).
  rt::DType kvDType = rt::DType::BF16;
  /// Tokens per block when there is no flow (a flow brings its own).
  int64_t blockSize = 16;
  /// Pages of the KV pool per layer; sequences and rows of one step.
  /// The serving engine derives these three from its own options
  /// (EngineConfig::runnerConfig); the defaults are what its defaults give
  /// (kv_pool_tokens 32768 in blocks of 16, max_batch 64).
  int64_t numPages = 2048;
  int maxSequences = 4 * 64 + 64, maxBatch = 64;
  std::string cacheDir;
  bool quiet = true;
  /// CUDA: replay pure decode steps from CUDA graphs.
  bool cudaGraphs = true;
  /// Measure the dense attention mass each sparse decode attends
  /// (rt::SessionConfig::massRecall; slower: for evaluation).
  bool massRecall = false;
  /// SnapKV's observation window (rt::SessionConfig::observeTokens): a
  /// flow that reads `mass` sees, at a sequence's first decode step, the
  /// mass its prompt's last observeTokens tokens paid to each block.
  int observeTokens = 16;
  /// The longest a sequence may get (prompt and generated tokens), below
  /// the model's context (0: the model's context): bounds what the engine
  /// admits and what the session sizes per sequence (on the GPU, the block
  /// tables, states and attention mass of every sequence slot).
  int64_t maxModelLen = 0;
};

/// Milliseconds of the last forward: the model's GEMMs, attention (append,
/// index, attend) and everything else (norms, RoPE, embeddings).
struct ForwardTimes {
  double gemmMs = 0, attentionMs = 0, otherMs = 0, samplingMs = 0;
  /// Of the attention time, the flow's index stage (the CPU backend
  /// measures it; on the GPU it stays in attentionMs).
  double indexMs = 0;
  /// Decode steps replayed from CUDA graphs (not split).
  double graphMs = 0;
};

class ModelRunner {
public:
  /// `flow` may be null: dense attention everywhere (the baseline).
  ModelRunner(const ModelWeights &weights, const rt::FlowArtifact *flow,
              const RunnerConfig &config);
  ~ModelRunner();
  ModelRunner(const ModelRunner &) = delete;
  ModelRunner &operator=(const ModelRunner &) = delete;

  /// The model's config, its context (maxPositions) capped by the runner
  /// config's maxModelLen.
  const ModelConfig &config() const { return model; }
  /// The runner config's maxModelLen (0: none).
  int64_t maxModelLen() const { return modelLen; }
  rt::Session &session() { return *sess; }
  const rt::Session &session() const { return *sess; }
  int64_t blockSize() const;

  /// One forward over a batch: tokens[i] are seqs[i]'s next tokens (at
  /// positions length(seqs[i]) ...); decode[i] says they are one generated
  /// token, attended through the flow, rather than prompt tokens (causal
  /// and dense). Returns the logits of each sequence's last token,
  /// [seqs.size(), vocab]. The session grows by the tokens; an exhausted
  /// pool is an Error that leaves every sequence as it was.
  std::vector<float>
  forwardLogits(const std::vector<rt::SeqId> &seqs,
                const std::vector<std::vector<int32_t>> &tokens,
                const std::vector<bool> &decode);
  /// The same, then each row's next token drawn by the sampling rule
  /// (Sampling.h) on the runner's device: only the tokens come back.
  std::vector<int32_t> forward(const std::vector<rt::SeqId> &seqs,
                               const std::vector<std::vector<int32_t>> &tokens,
                               const std::vector<bool> &decode,
                               const std::vector<RowSampling> &draws);

  const ForwardTimes &lastTimes() const { return times; }

private:
  struct Layer;
  /// The CPU's f32 copies of the weights (embeddings, norms, layers).
  void loadCpuWeights(const ModelWeights &weights);
  /// h [T, hidden] -> the layer's mixture of experts of it (CPU).
  void mixture(const Layer &L, std::vector<float> &h, int64_t T);
  struct Arranged;
  Arranged arrange(const std::vector<rt::SeqId> &seqs,
                   const std::vector<std::vector<int32_t>> &tokens,
                   const std::vector<bool> &decode) const;
  /// A pure decode step on the GPU through beginStep/stepLayer/endStep
  /// (replayed from a CUDA graph): each row's sampled token.
  void replayDecodeStep(Arranged &a, std::vector<RowSampling> &draws,
                        std::vector<int32_t> &sampled);
  void run(const std::vector<rt::SeqId> &seqs,
           const std::vector<std::vector<int32_t>> &tokens,
           const std::vector<bool> &decode,
           const std::vector<RowSampling> *draws, std::vector<float> *logits,
           std::vector<int32_t> *next);
  /// (layer, q, k, v, out, stream): a layer's attention through the
  /// session.
  using Attend =
      std::function<void(int, void *, void *, void *, void *, void *)>;
  std::vector<float> cpuForward(const std::vector<int32_t> &ids,
                                const std::vector<int64_t> &positions,
                                const std::vector<int64_t> &last,
                                const Attend &attend);
  /// A layer's attention of h [T, hidden] (normed) on the CPU, its o_proj
  /// output back in h: grouped heads, or MLA absorbed over the latent
  /// cache (ModelConfig::mla).
  void attention(int64_t layer, const Layer &L, std::vector<float> &h,
                 const std::vector<int64_t> &positions, const Attend &attend);
  void latentAttention(int64_t layer, const Layer &L, std::vector<float> &h,
                       const std::vector<int64_t> &positions,
                       const Attend &attend);
  /// attend() of one layer, its time split into index and attention.
  void attendTimed(int64_t layer, float *q, float *k, float *v, float *out,
                   const Attend &attend);
  ModelConfig model;
  rt::FlowArtifact flowArtifact;
  std::unique_ptr<rt::Session> sess;
  std::vector<Layer> layers;
  std::vector<float> embed, finalNorm, lmHead, invFreq, localInvFreq;
  /// YaRN's factor on RoPE's cos and sin (ropeAttentionFactor).
  float ropeFactor = 1.0f;
  ForwardTimes times;
  std::unique_ptr<class CudaModel> cuda;
  bool graphs = true;
  int maxBatch = 0;
  int64_t modelLen = 0;
};

} // namespace vflow::model

#endif // VFLOW_MODEL_RUNNER_H
