//===- Runner.cpp - A decoder-only model over the session API -------------===//
//
// The CPU forward: f32 weights (dequantized or converted at load), GEMMs
// through CBLAS (OpenBLAS), attention through the session. Rows of a step
// are the concatenation of every sequence's new tokens.
//
//===----------------------------------------------------------------------===//

#include "vflow/Model/Runner.h"

#include "Internal.h"

#include "CudaModel.h"

#include "vflow/Runtime/Error.h"

#ifdef VFLOW_HAS_CBLAS
#include <cblas.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

using namespace vflow;
using namespace vflow::model;

struct ModelRunner::Layer {
  /// postNorm is the MLP's input norm (post_attention_layernorm, or Gemma's
  /// pre_feedforward_layernorm); attnOutNorm and mlpOutNorm are Gemma's
  /// norms of the two outputs (ModelConfig::sandwichNorms), else empty.
  std::vector<float> inputNorm, postNorm, attnOutNorm, mlpOutNorm, wq, wk, wv,
      wo, bq, bk, bv, qNorm, kNorm, gate, up, down;
  /// A sliding-window layer: RoPE's localInvFreq (Gemma 3's own base).
  bool sliding = false;
  /// A mixture of experts instead of gate/up/down: the router
  /// [numExperts, hidden] and each expert's projections.
  std::vector<float> router;
  struct Expert {
    std::vector<float> gate, up, down;
  };
  std::vector<Expert> experts;
  /// DeepSeek's shared experts (one MLP every token takes; empty: none).
  Expert shared;
  /// DeepSeek-V3's e_score_correction_bias [numExperts] (empty: none).
  std::vector<float> routerBias;
  /// MLA (ModelConfig::mla): q_a_proj, its norm and q_b_proj (wq is
  /// q_proj when there is no query rank), kv_a_proj_with_mqa, its norm,
  /// and kv_b_proj [heads * (nope + v), kvLoraRank].
  std::vector<float> qA, qANorm, qB, kvA, kvANorm, kvB;
};

namespace {

using Clock = std::chrono::steady_clock;
double msSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

/// The rows a decode step of `batch` sequences is padded to (one CUDA
/// graph per size): 1, 2, 4, 8, then multiples of 8, at most `most`.
int64_t paddedBatch(int64_t batch, int64_t most) {
  int64_t rows = batch <= 1   ? 1
                 : batch <= 2 ? 2
                 : batch <= 4 ? 4
                              : (batch + 7) / 8 * 8;
  return std::max(batch, std::min(rows, most));
}

/// out[rows, n] = x[rows, k] * w[n, k]^T (+ bias[n]).
void linear(const float *x, int64_t rows, int64_t k,
            const std::vector<float> &w, int64_t n, float *out,
            const std::vector<float> *bias = nullptr) {
  if (rows == 0)
    return;
#ifdef VFLOW_HAS_CBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(rows), int(n),
              int(k), 1.0f, x, int(k), w.data(), int(k), 0.0f, out, int(n));
#else
  (void)x, (void)k, (void)w, (void)n, (void)out;
  throw rt::Error("model runner: this build has no BLAS (install OpenBLAS "
                  "and rebuild) for the CPU runner");
#endif
  if (bias && !bias->empty())
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < n; ++j)
        out[r * n + j] += (*bias)[size_t(j)];
}

/// RMSNorm of `rows` vectors of `n` (in place when out == x).
void rmsNorm(const float *x, int64_t rows, int64_t n,
             const std::vector<float> &w, double eps, float *out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = x + r * n;
    double sum = 0;
    for (int64_t j = 0; j < n; ++j)
      sum += double(xr[j]) * xr[j];
    const float inv = float(1.0 / std::sqrt(sum / double(n) + eps));
    float *o = out + r * n;
    for (int64_t j = 0; j < n; ++j)
      o[j] = xr[j] * inv * w[size_t(j)];
  }
}

/// How RoPE is applied: the frequencies, whether adjacent pairs rotate
/// (DeepSeek) rather than a head's two halves (Hugging Face's Llama), and
/// YaRN's factor on cos and sin.
struct RopeRule {
  const std::vector<float> &invFreq;
  bool interleaved = false;
  float factor = 1.0f;
};

/// Rotary embedding of `heads` heads of `d` per row, at each row's
/// position; head h of row r starts at x + (r * heads + h) * stride (a
/// stride above d rotates only each head's first d elements).
void rope(float *x, int64_t rows, int64_t heads, int64_t d, int64_t stride,
          const std::vector<int64_t> &positions, const RopeRule &rule) {
  const int64_t half = d / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const double pos = double(positions[size_t(r)]);
    for (int64_t i = 0; i < half; ++i) {
      const double angle = pos * double(rule.invFreq[size_t(i)]);
      const float c = float(std::cos(angle)) * rule.factor,
                  s = float(std::sin(angle)) * rule.factor;
      const int64_t ia = rule.interleaved ? 2 * i : i,
                    ib = rule.interleaved ? 2 * i + 1 : i + half;
      for (int64_t h = 0; h < heads; ++h) {
        float *v = x + (r * heads + h) * stride;
        const float a = v[ia], b = v[ib];
        v[ia] = a * c - b * s;
        v[ib] = b * c + a * s;
      }
    }
  }
}

/// c[m, n] (row stride ldc) = a[m, k] (stride lda) times b, which is
/// [k, n] (stride ldb) or, with `bTransposed`, [n, k].
void gemm(int64_t m, int64_t n, int64_t k, const float *a, int64_t lda,
          const float *b, int64_t ldb, bool bTransposed, float *c,
          int64_t ldc) {
  if (m == 0)
    return;
#ifdef VFLOW_HAS_CBLAS
  cblas_sgemm(CblasRowMajor, CblasNoTrans,
              bTransposed ? CblasTrans : CblasNoTrans, int(m), int(n), int(k),
              1.0f, a, int(lda), b, int(ldb), 0.0f, c, int(ldc));
#else
  (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb, (void)bTransposed,
      (void)c, (void)ldc;
  throw rt::Error("model runner: this build has no BLAS (install OpenBLAS "
                  "and rebuild) for the CPU runner");
#endif
}

std::vector<float> tensor(const ModelWeights &w, const std::string &name) {
  return w.has(name) ? w.toFloat(name) : std::vector<float>();
}

/// out[rows, e] = down(act(gate(x)) * up(x)) for x [rows, e], projections
/// to and from `inner` (g and u hold rows * inner floats); act is SiLU, or
/// with `geluTanh` GELU's tanh approximation (Gemma's GeGLU).
void gatedMlp(const float *x, int64_t rows, int64_t e,
              const std::vector<float> &gate, const std::vector<float> &up,
              const std::vector<float> &down, int64_t inner, float *g, float *u,
              float *out, bool geluTanh = false) {
  linear(x, rows, e, gate, inner, g);
  linear(x, rows, e, up, inner, u);
  if (geluTanh) {
    const float c = 0.7978845608028654f; // sqrt(2 / pi)
    for (int64_t i = 0; i < rows * inner; ++i) {
      const float z = g[i];
      g[i] =
          0.5f * z * (1.0f + std::tanh(c * (z + 0.044715f * z * z * z))) * u[i];
    }
  } else {
    for (int64_t i = 0; i < rows * inner; ++i)
      g[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
  }
  linear(g, rows, inner, down, e, out);
}

/// Each row's experts and their weights (transformers' Qwen3-MoE, Mixtral
/// and DeepSeek-V2/V3 routers), from the router's logits in f32: scores
/// are their softmax (or sigmoids: DeepSeek-V3); the choice ranks scores +
/// `bias` (V3's correction; empty: none); with model.expertGroups only the
/// experts of the topkGroups groups ranked best (by their best choice
/// value, or V3's sum of their two best) are candidates; the `k` best
/// (ties to the lower index) weigh their scores, renormalized to sum 1
/// when normTopKProb, times routedScalingFactor. Returns [rows, k] experts
/// and weights.
void route(const float *logits, int64_t rows, const ModelConfig &model,
           const std::vector<float> &bias, std::vector<int64_t> &chosen,
           std::vector<float> &weights) {
  const int64_t experts = model.numExperts, k = model.expertsPerToken;
  const int64_t groups = model.expertGroups,
                perGroup = groups ? experts / groups : 0;
  std::vector<float> best(static_cast<size_t>(groups));
  std::vector<int64_t> groupOrder(static_cast<size_t>(groups));
  chosen.assign(size_t(rows * k), 0);
  weights.assign(size_t(rows * k), 0.0f);
  std::vector<float> p(static_cast<size_t>(experts)), choice(p.size());
  std::vector<int64_t> order(static_cast<size_t>(experts));
  auto higher = [](const std::vector<float> &v) {
    return [&v](int64_t a, int64_t b) {
      return v[size_t(a)] > v[size_t(b)] ||
             (v[size_t(a)] == v[size_t(b)] && a < b);
    };
  };
  for (int64_t r = 0; r < rows; ++r) {
    const float *z = logits + r * experts;
    if (model.sigmoidRouter) {
      for (int64_t e = 0; e < experts; ++e)
        p[size_t(e)] = 1.0f / (1.0f + std::exp(-z[e]));
    } else {
      const float top = *std::max_element(z, z + experts);
      float sum = 0;
      for (int64_t e = 0; e < experts; ++e)
        sum += p[size_t(e)] = std::exp(z[e] - top);
      for (float &x : p)
        x /= sum;
    }
    for (int64_t e = 0; e < experts; ++e)
      choice[size_t(e)] =
          p[size_t(e)] + (bias.empty() ? 0.0f : bias[size_t(e)]);
    if (groups > 0) {
      // Rank the groups; the experts of the others are out.
      for (int64_t g = 0; g < groups; ++g) {
        // The group's best value, and its second best.
        float a = -std::numeric_limits<float>::infinity(), b = a;
        for (int64_t e = g * perGroup; e < (g + 1) * perGroup; ++e) {
          const float x = choice[size_t(e)];
          if (x > a) {
            b = a;
            a = x;
          } else if (x > b) {
            b = x;
          }
        }
        best[size_t(g)] = model.sigmoidRouter && perGroup >= 2 ? a + b : a;
        groupOrder[size_t(g)] = g;
      }
      std::partial_sort(groupOrder.begin(),
                        groupOrder.begin() + model.topkGroups, groupOrder.end(),
                        higher(best));
      for (int64_t g = model.topkGroups; g < groups; ++g)
        std::fill_n(choice.begin() + groupOrder[size_t(g)] * perGroup, perGroup,
                    -std::numeric_limits<float>::infinity());
    }
    for (int64_t e = 0; e < experts; ++e)
      order[size_t(e)] = e;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      higher(choice));
    float kept = 0;
    for (int64_t j = 0; j < k; ++j)
      kept += p[size_t(order[size_t(j)])];
    if (model.sigmoidRouter)
      kept += 1e-20f;
    for (int64_t j = 0; j < k; ++j) {
      chosen[size_t(r * k + j)] = order[size_t(j)];
      weights[size_t(r * k + j)] = p[size_t(order[size_t(j)])] /
                                   (model.normTopKProb ? kept : 1.0f) *
                                   float(model.routedScalingFactor);
    }
  }
}

} // namespace

ModelRunner::ModelRunner(const ModelWeights &weights,
                         const rt::FlowArtifact *flow, const RunnerConfig &cfg)
    : model(weights.config()) {
  if (cfg.maxModelLen < 0)
    throw rt::Error("model runner: max_model_len must not be negative");
  modelLen = cfg.maxModelLen;
  // max_model_len is the context everything below (and the engine) reads.
  if (cfg.maxModelLen > 0)
    model.maxPositions = model.maxPositions > 0
                             ? std::min(model.maxPositions, cfg.maxModelLen)
                             : cfg.maxModelLen;
#ifndef VFLOW_HAS_CUDA_MODEL
  if (cfg.device == rt::Device::Cuda)
    throw rt::Error("model runner: this build has no CUDA; use device \"cpu\"");
#endif
  if (cfg.denseLayers < 0)
    throw rt::Error("model runner: dense_layers must not be negative");
  flowArtifact = flow ? *flow : rt::denseFlow(cfg.blockSize);
  rt::SessionConfig s;
  s.device = cfg.device;
  s.numLayers = int(model.numLayers);
  s.numKVHeads = int(model.numKVHeads);
  s.group = int(model.numHeads / model.numKVHeads);
  s.headDim = int(model.headDim);
  s.numPages = cfg.numPages;
  s.kvDType = cfg.kvDType;
  s.maxSequences = cfg.maxSequences;
  s.maxBatch = cfg.maxBatch;
  s.cacheDir = cfg.cacheDir;
  s.quiet = cfg.quiet;
  s.telemetry = true;
  s.massRecall = cfg.massRecall;
  s.observeTokens = cfg.observeTokens;
  if (model.slidingWindow > 0)
    for (int64_t l = 0; l < model.numLayers; ++l)
      s.slidingWindow.push_back(model.slidingLayer(l) ? model.slidingWindow
                                                      : 0);
  s.scale = float(model.attentionScale);
  // MLA's latent rows are the keys and the values: stored once.
  s.valuesAreKeys = model.mla();
  s.denseLayers = flow ? cfg.denseLayers : s.numLayers;
  // The longest a sequence can get: the model's context or the pool.
  const int64_t bs = flowArtifact.blockSize;
  int64_t longest = cfg.numPages * bs;
  if (model.maxPositions > 0)
    longest = std::min(longest, model.maxPositions);
  s.maxBlocksPerSeq = (longest + bs - 1) / bs;
  // CUDA graphs replay a decode step at any length: grids for the longest.
  s.graphSafe = cfg.device == rt::Device::Cuda;
  graphs = cfg.cudaGraphs;
  maxBatch = cfg.maxBatch;
  sess = rt::openSession(flowArtifact, s);

#ifdef VFLOW_HAS_CUDA_MODEL
  if (cfg.device == rt::Device::Cuda) {
    cuda = std::make_unique<CudaModel>(weights, model, cfg.maxBatch);
    return; // the weights live on the device
  }
#endif
  loadCpuWeights(weights);
}

void ModelRunner::loadCpuWeights(const ModelWeights &weights) {
  // Gemma's norms scale by (1 + w).
  auto norm = [&](const std::string &name) {
    std::vector<float> w = tensor(weights, name);
    for (float &x : w)
      x = float(double(x) + model.normWeightOffset);
    return w;
  };
  embed = weights.toFloat("model.embed_tokens.weight");
  finalNorm = norm("model.norm.weight");
  if (!model.tieEmbeddings)
    lmHead = weights.toFloat("lm_head.weight");
  invFreq = ropeInverseFrequencies(model);
  ropeFactor = float(ropeAttentionFactor(model));
  localInvFreq = ropeLocalInverseFrequencies(model);
  layers.resize(size_t(model.numLayers));
  for (int64_t l = 0; l < model.numLayers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    Layer &L = layers[size_t(l)];
    L.sliding = model.slidingLayer(l);
    L.inputNorm = norm(p + "input_layernorm.weight");
    if (model.sandwichNorms) {
      L.attnOutNorm = norm(p + "post_attention_layernorm.weight");
      L.postNorm = norm(p + "pre_feedforward_layernorm.weight");
      L.mlpOutNorm = norm(p + "post_feedforward_layernorm.weight");
    } else {
      L.postNorm = norm(p + "post_attention_layernorm.weight");
    }
    if (model.mla()) {
      const std::string a = p + "self_attn.";
      if (model.qLoraRank > 0) {
        L.qA = weights.toFloat(a + "q_a_proj.weight");
        L.qANorm = norm(a + "q_a_layernorm.weight");
        L.qB = weights.toFloat(a + "q_b_proj.weight");
      } else {
        L.wq = weights.toFloat(a + "q_proj.weight");
      }
      L.kvA = weights.toFloat(a + "kv_a_proj_with_mqa.weight");
      L.kvANorm = norm(a + "kv_a_layernorm.weight");
      L.kvB = weights.toFloat(a + "kv_b_proj.weight");
    } else {
      L.wq = weights.toFloat(p + "self_attn.q_proj.weight");
      L.wk = weights.toFloat(p + "self_attn.k_proj.weight");
      L.wv = weights.toFloat(p + "self_attn.v_proj.weight");
    }
    L.wo = weights.toFloat(p + "self_attn.o_proj.weight");
    L.bq = tensor(weights, p + "self_attn.q_proj.bias");
    L.bk = tensor(weights, p + "self_attn.k_proj.bias");
    L.bv = tensor(weights, p + "self_attn.v_proj.bias");
    L.qNorm = norm(p + "self_attn.q_norm.weight");
    L.kNorm = norm(p + "self_attn.k_norm.weight");
    if (model.moeLayer(l)) {
      const detail::ExpertNames moe(model.arch, l);
      L.router = weights.toFloat(moe.router);
      for (int64_t e = 0; e < model.numExperts; ++e)
        L.experts.push_back({weights.toFloat(moe.gate(e)),
                             weights.toFloat(moe.up(e)),
                             weights.toFloat(moe.down(e))});
      if (model.sigmoidRouter)
        L.routerBias = weights.toFloat(p + "mlp.gate.e_score_correction_bias");
      if (model.numSharedExperts > 0)
        L.shared = {weights.toFloat(p + "mlp.shared_experts.gate_proj.weight"),
                    weights.toFloat(p + "mlp.shared_experts.up_proj.weight"),
                    weights.toFloat(p + "mlp.shared_experts.down_proj.weight")};
      continue;
    }
    L.gate = weights.toFloat(p + "mlp.gate_proj.weight");
    L.up = weights.toFloat(p + "mlp.up_proj.weight");
    L.down = weights.toFloat(p + "mlp.down_proj.weight");
  }
}

ModelRunner::~ModelRunner() = default;

int64_t ModelRunner::blockSize() const { return flowArtifact.blockSize; }

std::vector<float>
ModelRunner::forwardLogits(const std::vector<rt::SeqId> &seqs,
                           const std::vector<std::vector<int32_t>> &tokens,
                           const std::vector<bool> &decode) {
  std::vector<float> logits;
  run(seqs, tokens, decode, nullptr, &logits, nullptr);
  return logits;
}

std::vector<int32_t>
ModelRunner::forward(const std::vector<rt::SeqId> &seqs,
                     const std::vector<std::vector<int32_t>> &tokens,
                     const std::vector<bool> &decode,
                     const std::vector<RowSampling> &draws) {
  if (draws.size() != seqs.size())
    throw rt::Error("model runner: one draw per sequence is needed");
  std::vector<int32_t> next;
  run(seqs, tokens, decode, &draws, nullptr, &next);
  return next;
}

/// One forward's rows as the session takes them: decode rows first, then
/// prompt rows, each set one contiguous range of rows.
struct ModelRunner::Arranged {
  std::vector<size_t> order; ///< the caller's row of each arranged row
  std::vector<rt::SeqId> ordered, decSeqs, preSeqs;
  std::vector<int64_t> counts, preCounts, positions, last;
  std::vector<int32_t> ids;
  int64_t decRows = 0;
};

ModelRunner::Arranged
ModelRunner::arrange(const std::vector<rt::SeqId> &seqs,
                     const std::vector<std::vector<int32_t>> &tokens,
                     const std::vector<bool> &decode) const {
  if (tokens.size() != seqs.size() || decode.size() != seqs.size())
    throw rt::Error("model runner: one token list and one decode flag per "
                    "sequence are needed");
  const int64_t V = model.vocabSize;
  Arranged a;
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < seqs.size(); ++i)
      if (decode[i] == (pass == 0))
        a.order.push_back(i);
  for (size_t i : a.order) {
    if (tokens[i].empty())
      throw rt::Error("model runner: sequence " + std::to_string(seqs[i]) +
                      " has no tokens in this step");
    if (decode[i] && tokens[i].size() != 1)
      throw rt::Error("model runner: a decode row is one token");
    // A retain block may have evicted tokens: positions go on from the
    // sequence's, not from what it holds.
    const int64_t first = sess->position(seqs[i]);
    for (size_t j = 0; j < tokens[i].size(); ++j) {
      const int32_t t = tokens[i][j];
      if (t < 0 || t >= V)
        throw rt::Error("model runner: token " + std::to_string(t) +
                        " is outside the vocabulary of " + std::to_string(V));
      a.ids.push_back(t);
      a.positions.push_back(first + int64_t(j));
    }
    a.ordered.push_back(seqs[i]);
    a.counts.push_back(int64_t(tokens[i].size()));
    a.last.push_back(int64_t(a.ids.size()) - 1);
    if (decode[i]) {
      a.decSeqs.push_back(seqs[i]);
      ++a.decRows;
    } else {
      a.preSeqs.push_back(seqs[i]);
      a.preCounts.push_back(int64_t(tokens[i].size()));
    }
  }
  return a;
}

void ModelRunner::replayDecodeStep(Arranged &a, std::vector<RowSampling> &draws,
                                   std::vector<int32_t> &sampled) {
  // One unit from the session, replayed from a CUDA graph once its shape
  // was seen. Batches are padded to a few sizes (padding rows compute
  // garbage nobody reads), so few graphs serve every batch.
  const int64_t B = int64_t(a.order.size());
  const int64_t rows = paddedBatch(B, maxBatch);
  const rt::StepKey key = sess->beginStep(a.ordered, rows, cuda->stream());
  a.ids.resize(size_t(rows), 0);
  a.positions.resize(size_t(rows), 0);
  draws.resize(size_t(rows), RowSampling{});
  const rt::DType dtype = rt::DType::BF16;
  const rt::Device device = rt::Device::Cuda;
  auto stepLayer = [&](int layer, void *q, void *k, void *v, void *out,
                       void *stream) {
    sess->stepLayer(layer, {q, dtype, device}, {k, dtype, device},
                    {v, dtype, device}, {out, dtype, device}, stream);
  };
  try {
    cuda->decodeStep(a.ids, a.positions, draws, key, stepLayer, times, sampled);
  } catch (...) {
    sess->endStep();
    throw;
  }
  sess->endStep();
  sampled.resize(size_t(B));
}

void ModelRunner::run(const std::vector<rt::SeqId> &seqs,
                      const std::vector<std::vector<int32_t>> &tokens,
                      const std::vector<bool> &decode,
                      const std::vector<RowSampling> *draws,
                      std::vector<float> *logitsOut,
                      std::vector<int32_t> *next) {
  Arranged a = arrange(seqs, tokens, decode);
  times = ForwardTimes();
  const int64_t V = model.vocabSize;
  const bool onGpu = cuda != nullptr;
  const rt::DType dtype = onGpu ? rt::DType::BF16 : rt::DType::F32;
  const rt::Device device = onGpu ? rt::Device::Cuda : rt::Device::Cpu;
  const size_t elem = onGpu ? 2 : 4;
  const size_t qRow = size_t(model.numHeads * model.headDim) * elem;
  const size_t kvRow = size_t(model.numKVHeads * model.headDim) * elem;
  // Decode rows are a step of the session (appended and attended by
  // stepLayer: the route a replayed step takes too); prompt rows are
  // appended and prefilled beside them.
  auto attend = [&](int layer, void *q, void *k, void *v, void *out,
                    void *stream) {
    auto at = [&](void *p, size_t row, int64_t rows) {
      return rt::Tensor{static_cast<char *>(p) + size_t(rows) * row, dtype,
                        device};
    };
    if (!a.decSeqs.empty())
      sess->stepLayer(layer, at(q, qRow, 0), at(k, kvRow, 0), at(v, kvRow, 0),
                      at(out, qRow, 0), stream);
    if (!a.preSeqs.empty()) {
      sess->append(layer, a.preSeqs, a.preCounts, at(k, kvRow, a.decRows),
                   at(v, kvRow, a.decRows), stream);
      sess->prefill(layer, a.preSeqs, a.preCounts, at(q, qRow, a.decRows),
                    at(out, qRow, a.decRows), stream);
    }
  };
  std::vector<RowSampling> orderedDraws;
  if (draws)
    for (size_t i : a.order)
      orderedDraws.push_back((*draws)[i]);
  std::vector<float> logits;
  std::vector<int32_t> sampled;
  const bool allDecode = a.decRows == int64_t(a.order.size());
  if (onGpu && draws && graphs && allDecode &&
      int64_t(a.order.size()) <= maxBatch) {
    replayDecodeStep(a, orderedDraws, sampled);
  } else {
    // The pool is checked for every row before the step changes any.
    int64_t needed = 0;
    for (size_t i = 0; i < a.ordered.size(); ++i)
      needed += sess->pagesNeeded(a.ordered[i], a.counts[i]);
    rt::checkPool("a forward of", a.ordered.size(), needed, sess->freePages());
    if (!a.decSeqs.empty())
      sess->beginStep(a.decSeqs, 0, onGpu ? cuda->stream() : nullptr);
    try {
      if (onGpu) {
        cuda->forward(a.ids, a.positions, a.last, attend, times,
                      draws ? &orderedDraws : nullptr,
                      draws ? nullptr : &logits, draws ? &sampled : nullptr);
      } else {
        logits = cpuForward(a.ids, a.positions, a.last, attend);
      }
    } catch (...) {
      if (!a.decSeqs.empty())
        sess->endStep();
      throw;
    }
    if (!a.decSeqs.empty())
      sess->endStep();
    if (!onGpu && draws) {
      const auto t0 = Clock::now();
      for (size_t r = 0; r < a.order.size(); ++r)
        sampled.push_back(
            sampleToken(logits.data() + r * size_t(V), V, orderedDraws[r]));
      times.samplingMs += msSince(t0);
    }
  }
  // Back to the caller's order.
  if (next) {
    next->assign(a.order.size(), 0);
    for (size_t r = 0; r < a.order.size(); ++r)
      (*next)[a.order[r]] = sampled[r];
  }
  if (logitsOut) {
    logitsOut->assign(logits.size(), 0.0f);
    for (size_t r = 0; r < a.order.size(); ++r)
      std::copy_n(logits.data() + r * size_t(V), V,
                  logitsOut->data() + a.order[r] * size_t(V));
  }
}

void ModelRunner::mixture(const Layer &L, std::vector<float> &h, int64_t T) {
  const int64_t E = model.hiddenSize, X = model.numExperts,
                K = model.expertsPerToken, I = model.expertIntermediateSize;
  std::vector<float> logits(size_t(T * X));
  linear(h.data(), T, E, L.router, X, logits.data());
  std::vector<int64_t> chosen;
  std::vector<float> weight;
  route(logits.data(), T, model, L.routerBias, chosen, weight);
  // Each expert's (row, weight) pairs, in row order, from one pass.
  std::vector<std::vector<std::pair<int64_t, float>>> routed(
      static_cast<size_t>(X));
  for (int64_t r = 0; r < T; ++r)
    for (int64_t j = 0; j < K; ++j)
      routed[size_t(chosen[size_t(r * K + j)])].push_back(
          {r, weight[size_t(r * K + j)]});
  // Per expert: its rows gathered, its SwiGLU, weighted into the output;
  // DeepSeek's shared experts take every row.
  std::vector<float> out(h.size(), 0.0f), rowsIn, g, u, y;
  if (!L.shared.gate.empty()) {
    const int64_t S = model.numSharedExperts * I;
    g.resize(size_t(T * S));
    u.resize(g.size());
    gatedMlp(h.data(), T, E, L.shared.gate, L.shared.up, L.shared.down, S,
             g.data(), u.data(), out.data());
  }
  for (int64_t e = 0; e < X; ++e) {
    const std::vector<std::pair<int64_t, float>> &rows = routed[size_t(e)];
    if (rows.empty())
      continue;
    const int64_t n = int64_t(rows.size());
    rowsIn.resize(size_t(n * E));
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(h.data() + rows[size_t(i)].first * E, E,
                  rowsIn.data() + i * E);
    g.resize(size_t(n * I));
    u.resize(g.size());
    y.resize(rowsIn.size());
    const Layer::Expert &x = L.experts[size_t(e)];
    gatedMlp(rowsIn.data(), n, E, x.gate, x.up, x.down, I, g.data(), u.data(),
             y.data());
    for (int64_t i = 0; i < n; ++i) {
      float *o = out.data() + rows[size_t(i)].first * E;
      for (int64_t c = 0; c < E; ++c)
        o[c] += rows[size_t(i)].second * y[size_t(i * E + c)];
    }
  }
  h = std::move(out);
}

void ModelRunner::attendTimed(int64_t layer, float *q, float *k, float *v,
                              float *out, const Attend &attend) {
  const auto t0 = Clock::now();
  const double indexBefore = sess->stats().indexMs;
  attend(int(layer), q, k, v, out, nullptr);
  const double index = sess->stats().indexMs - indexBefore;
  times.indexMs += index;
  times.attentionMs += msSince(t0) - index;
}

void ModelRunner::attention(int64_t l, const Layer &L, std::vector<float> &h,
                            const std::vector<int64_t> &positions,
                            const Attend &attend) {
  const int64_t E = model.hiddenSize, D = model.headDim;
  const int64_t Hq = model.numHeads, Hkv = model.numKVHeads;
  const int64_t T = int64_t(positions.size());
  std::vector<float> q(size_t(T * Hq * D)), k(size_t(T * Hkv * D)), v(k.size()),
      attn(q.size());
  auto t0 = Clock::now();
  linear(h.data(), T, E, L.wq, Hq * D, q.data(), &L.bq);
  linear(h.data(), T, E, L.wk, Hkv * D, k.data(), &L.bk);
  linear(h.data(), T, E, L.wv, Hkv * D, v.data(), &L.bv);
  times.gemmMs += msSince(t0);
  t0 = Clock::now();
  if (!L.qNorm.empty()) {
    rmsNorm(q.data(), T * Hq, D, L.qNorm, model.rmsNormEps, q.data());
    rmsNorm(k.data(), T * Hkv, D, L.kNorm, model.rmsNormEps, k.data());
  }
  const RopeRule rule{L.sliding ? localInvFreq : invFreq, model.ropeInterleaved,
                      ropeFactor};
  rope(q.data(), T, Hq, D, D, positions, rule);
  rope(k.data(), T, Hkv, D, D, positions, rule);
  times.otherMs += msSince(t0);
  attendTimed(l, q.data(), k.data(), v.data(), attn.data(), attend);
  t0 = Clock::now();
  linear(attn.data(), T, Hq * D, L.wo, E, h.data());
  times.gemmMs += msSince(t0);
}

void ModelRunner::latentAttention(int64_t l, const Layer &L,
                                  std::vector<float> &h,
                                  const std::vector<int64_t> &positions,
                                  const Attend &attend) {
  const int64_t E = model.hiddenSize, H = model.numHeads;
  const int64_t C = model.kvLoraRank, R = model.qkRopeHeadDim,
                N = model.qkNopeHeadDim, Vd = model.vHeadDim;
  const int64_t W = C + R; // the cached row; the absorbed query's width
  const int64_t T = int64_t(positions.size());
  // The projections: queries [T, H, N + R], the latent and k_pe [T, W].
  std::vector<float> q(size_t(T * H * (N + R))), row(size_t(T * W));
  auto t0 = Clock::now();
  if (model.qLoraRank > 0) {
    std::vector<float> qa(size_t(T * model.qLoraRank));
    linear(h.data(), T, E, L.qA, model.qLoraRank, qa.data());
    rmsNorm(qa.data(), T, model.qLoraRank, L.qANorm, model.rmsNormEps,
            qa.data());
    linear(qa.data(), T, model.qLoraRank, L.qB, H * (N + R), q.data());
  } else {
    linear(h.data(), T, E, L.wq, H * (N + R), q.data());
  }
  linear(h.data(), T, E, L.kvA, W, row.data());
  // The absorbed queries [T, H, W]: q_nope W_UK[h] (W_UK[h] is kv_b_proj's
  // rows h (N + Vd) .. + N, [N, C]), then q_pe.
  std::vector<float> qw(size_t(T * H * W)), attn(qw.size());
  for (int64_t hd = 0; hd < H; ++hd) {
    gemm(T, C, N, q.data() + hd * (N + R), H * (N + R),
         L.kvB.data() + hd * (N + Vd) * C, C, false, qw.data() + hd * W, H * W);
    for (int64_t r = 0; r < T; ++r)
      std::copy_n(q.data() + (r * H + hd) * (N + R) + N, R,
                  qw.data() + (r * H + hd) * W + C);
  }
  times.gemmMs += msSince(t0);
  t0 = Clock::now();
  for (int64_t r = 0; r < T; ++r) // the latent part of each row
    rmsNorm(row.data() + r * W, 1, C, L.kvANorm, model.rmsNormEps,
            row.data() + r * W);
  times.otherMs += msSince(t0);
  const RopeRule rule{invFreq, model.ropeInterleaved, ropeFactor};
  rope(qw.data() + C, T, H, R, W, positions, rule);
  rope(row.data() + C, T, 1, R, W, positions, rule);
  // The values are the cached rows themselves (V = K).
  attendTimed(l, qw.data(), row.data(), row.data(), attn.data(), attend);
  // Head h's output: its latent part times W_UV[h]^T ([Vd, C] rows of
  // kv_b_proj), then o_proj.
  t0 = Clock::now();
  std::vector<float> o(size_t(T * H * Vd));
  for (int64_t hd = 0; hd < H; ++hd)
    gemm(T, Vd, C, attn.data() + hd * W, H * W,
         L.kvB.data() + (hd * (N + Vd) + N) * C, C, true, o.data() + hd * Vd,
         H * Vd);
  linear(o.data(), T, H * Vd, L.wo, E, h.data());
  times.gemmMs += msSince(t0);
}

std::vector<float> ModelRunner::cpuForward(
    const std::vector<int32_t> &ids, const std::vector<int64_t> &positions,
    const std::vector<int64_t> &last, const CudaModel::Attend &attend) {
  const int64_t E = model.hiddenSize;
  const int64_t I = model.intermediateSize, V = model.vocabSize;
  const int64_t T = int64_t(ids.size());
  std::vector<float> x(size_t(T * E)), h(x.size()), g(size_t(T * I)),
      u(g.size());
  auto t0 = Clock::now();
  for (int64_t r = 0; r < T; ++r)
    std::copy_n(embed.data() + size_t(ids[size_t(r)]) * E, E, x.data() + r * E);
  if (model.embedScale != 1.0)
    for (float &e : x)
      e *= float(model.embedScale);
  times.otherMs += msSince(t0);
  for (int64_t l = 0; l < model.numLayers; ++l) {
    const Layer &L = layers[size_t(l)];
    t0 = Clock::now();
    rmsNorm(x.data(), T, E, L.inputNorm, model.rmsNormEps, h.data());
    times.otherMs += msSince(t0);
    if (model.mla())
      latentAttention(l, L, h, positions, attend);
    else
      attention(l, L, h, positions, attend);
    t0 = Clock::now();
    if (!L.attnOutNorm.empty())
      rmsNorm(h.data(), T, E, L.attnOutNorm, model.rmsNormEps, h.data());
    for (size_t e = 0; e < x.size(); ++e)
      x[e] += h[e];
    times.gemmMs += msSince(t0);
    t0 = Clock::now();
    rmsNorm(x.data(), T, E, L.postNorm, model.rmsNormEps, h.data());
    times.otherMs += msSince(t0);
    t0 = Clock::now();
    if (L.experts.empty())
      gatedMlp(h.data(), T, E, L.gate, L.up, L.down, I, g.data(), u.data(),
               h.data(), model.activation == "gelu_tanh");
    else
      mixture(L, h, T);
    if (!L.mlpOutNorm.empty())
      rmsNorm(h.data(), T, E, L.mlpOutNorm, model.rmsNormEps, h.data());
    for (size_t e = 0; e < x.size(); ++e)
      x[e] += h[e];
    times.gemmMs += msSince(t0);
  }
  // The last row of each sequence: final norm, then the vocabulary.
  t0 = Clock::now();
  const int64_t B = int64_t(last.size());
  std::vector<float> lastRows(size_t(B * E)), logits(size_t(B * V));
  for (int64_t b = 0; b < B; ++b)
    rmsNorm(x.data() + last[size_t(b)] * E, 1, E, finalNorm, model.rmsNormEps,
            lastRows.data() + b * E);
  times.otherMs += msSince(t0);
  t0 = Clock::now();
  linear(lastRows.data(), B, E, model.tieEmbeddings ? embed : lmHead, V,
         logits.data());
  times.gemmMs += msSince(t0);
  return logits;
}
